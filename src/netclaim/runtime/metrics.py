"""Prometheus metrics of the agent and the controller, in one registry served at --metrics-address."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

PUBLISHED_DEVICES = Gauge(
    "netclaim_published_devices", "Devices in this node's ResourceSlices", registry=REGISTRY
)
SLICE_WRITES = Counter(
    "netclaim_resourceslice_writes_total",
    "ResourceSlice writes by operation",
    ["operation"],
    registry=REGISTRY,
)
PUBLISH_SECONDS = Histogram(
    "netclaim_publish_duration_seconds", "Time from a scan to the slices being current", registry=REGISTRY
)
LAST_PUBLISH = Gauge(
    "netclaim_last_publish_timestamp_seconds",
    "When the slices were last confirmed current",
    registry=REGISTRY,
)
DROPPED_FIELDS = Gauge(
    "netclaim_dropped_slice_fields",
    "1 while the API server drops a field netclaim writes in its ResourceSlices (a feature gate is off), by "
    "pool (node: the agent's own; else the IP pools') and field",
    ["pool", "field"],
    registry=REGISTRY,
)
PUBLISH_ERRORS = Counter("netclaim_publish_errors_total", "Failed publish attempts", registry=REGISTRY)
NIC_LINK_UP = Gauge(
    "netclaim_nic_link_up",
    "1 while a published NIC's link is up; 0 from the first loss of its carrier until it has settled back",
    ["device"],
    registry=REGISTRY,
)
NIC_LINK_LOSSES = Counter(
    "netclaim_nic_link_losses_total",
    "Published NICs going down (a flapping link counts once, until it has settled)",
    registry=REGISTRY,
)
TAINTED_DEVICES = Gauge(
    "netclaim_tainted_devices", "Devices published with a taint, by effect", ["effect"], registry=REGISTRY
)
HEALTH_REPORTS = Counter(
    "netclaim_health_reports_total",
    "Device health reports sent to kubelet (every device each)",
    registry=REGISTRY,
)
CNI_NOT_READY = Counter(
    "netclaim_cni_not_ready_total",
    "Attaches refused because a plugin's STATUS said it cannot serve an ADD, by plugin",
    ["plugin"],
    registry=REGISTRY,
)
CNI_CHECKS = Counter(
    "netclaim_cni_checks_total",
    "CNI CHECKs of attached interfaces, by result (ok, failed: repaired by DEL and ADD, error: not run)",
    ["result"],
    registry=REGISTRY,
)
CNI_GC_RUNS = Counter(
    "netclaim_cni_gc_runs_total",
    "CNI GC calls of a network's chain, by result (ok, error)",
    ["result"],
    registry=REGISTRY,
)
CNI_GC_REMOVED = Counter(
    "netclaim_cni_gc_removed_total",
    "Reservations of host-local that a CNI GC removed (attachments gone without their DEL)",
    registry=REGISTRY,
)
KUBELET_CALLS = Counter(
    "netclaim_kubelet_calls_total",
    "NodePrepare/NodeUnprepare per claim, by outcome",
    ["call", "outcome"],
    registry=REGISTRY,
)
PREPARE_SECONDS = Histogram(
    "netclaim_prepare_duration_seconds", "NodePrepareResources per claim", registry=REGISTRY
)
NRI_HOOK_SECONDS = Histogram(
    "netclaim_nri_hook_duration_seconds",
    "NRI calls from the runtime, by method",
    ["method"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0),
)
NRI_CALLS = Counter(
    "netclaim_nri_calls_total",
    "NRI calls from the runtime, by method and result: ok, failed (netclaim's error: for RunPodSandbox the "
    "pod's sandbox fails and kubelet retries it, as fail-closed wants), bug",
    ["method", "result"],
    registry=REGISTRY,
)
ADDRESS_ALLOCATION_SECONDS = Histogram(
    "netclaim_address_allocation_duration_seconds",
    "Taking a claim's addresses from one IP pool at prepare (API round trips)",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
RESERVATIONS = Counter(
    "netclaim_address_reservations_total",
    "Pool addresses the controller reserved before a pod bound (result: reserved, failed: the claim's config "
    "or the pool could give none, the scheduler retries the pod; error: tried again)",
    ["result"],
    registry=REGISTRY,
)
ADDRESSES_RECLAIMED = Counter(
    "netclaim_addresses_reclaimed_total",
    "Addresses the controller freed because their claim was gone",
    registry=REGISTRY,
)
CLAIMS_RECLAIMED = Counter(
    "netclaim_claims_reclaimed_total",
    "Claims unprepared by the agent because they were gone and NodeUnprepareResources never came",
    registry=REGISTRY,
)
POOL_FREE = Gauge(
    "netclaim_ippool_free_claims", "Claims an IP pool can still take", ["pool"], registry=REGISTRY
)
UNREADABLE_OBJECTS = Counter(
    "netclaim_unreadable_objects_total",
    "Listed objects netclaim could not read, in whole or in part (skipped, or read as far as they can be), "
    "once per version of each object, by kind",
    ["kind"],
    registry=REGISTRY,
)
RECLAIM_ERRORS = Counter(
    "netclaim_reclaim_errors_total",
    "Claims the agent's reclaim could not check or unprepare in a round (tried again the next round)",
    registry=REGISTRY,
)
STATUS_WRITES = Counter(
    "netclaim_status_writes_total",
    "Tries to write a claim's status.devices (kind claim) or a pod's network-status annotation (kind pod), "
    "by result: ok, gone, refused (401/403: retried after 5 s, doubling, 6 times, then not until queued "
    "again), rejected (another 4xx, or cannot be written: not retried until queued again), unavailable "
    "and conflict (retried with backoff), error (a bug, retried with backoff), given_up (a bug, too many "
    "times)",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILES = Counter(
    "netclaim_reconcile_total",
    "The controller's reconcile passes, by result (ok, error)",
    ["result"],
    registry=REGISTRY,
)
ENDPOINT_PASSES = Counter(
    "netclaim_endpoint_passes_total",
    "The controller's passes over the EndpointSlices of Services on netclaim networks, by result (ok, error)",
    ["result"],
    registry=REGISTRY,
)
POLICY_PASSES = Counter(
    "netclaim_policy_passes_total",
    "The controller's passes compiling MultiNetworkPolicies into each node's rules, by result (ok, error)",
    ["result"],
    registry=REGISTRY,
)
POLICY_PASS_SECONDS = Histogram(
    "netclaim_policy_pass_seconds",
    "One policy pass of the controller: compiling what changed (or everything, at a resync), writing",
    registry=REGISTRY,
)
POLICY_RULES = Gauge(
    "netclaim_policy_rules",
    "Allow rules programmed by MultiNetworkPolicies in the node's pod namespaces (nftables), and the "
    "interfaces they isolate",
    ["kind"],
    registry=REGISTRY,
)
POLICY_SYNC_SECONDS = Histogram(
    "netclaim_policy_sync_seconds",
    "From the agent reading changed rules to every attached pod's table following them",
    registry=REGISTRY,
)
POLICY_FAILURES = Counter(
    "netclaim_policy_failures_total",
    "Pod tables not applied, by when (sandbox: the pod's start failed and is retried; sync: retried at the "
    "next change or resync)",
    ["when"],
    registry=REGISTRY,
)
LAST_RECONCILE = Gauge(
    "netclaim_last_reconcile_timestamp_seconds",
    "When a reconcile pass of the controller last succeeded",
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "netclaim_task_restarts_total",
    "Failures of a long-running task (a loop, a watch, a writer), each followed by a restart after a "
    "backoff, by task and error class (a class not of netclaim's errors is a bug: its traceback is logged)",
    ["task", "error"],
    registry=REGISTRY,
)
TASK_FAILURES = Counter(
    "netclaim_task_failures_total",
    "One-shot background jobs (a pod's Event, the undo of an ADD out of time, an NRI call) that raised, by "
    "task; each is logged with its traceback",
    ["task"],
    registry=REGISTRY,
)

INFORMER_OBJECTS = Gauge(
    "netclaim_informer_objects",
    "Objects the controller keeps in memory, by kind (compact projections: what its reconcilers read)",
    ["kind"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "netclaim_leader",
    "1 while this controller replica holds the Lease and runs the reconcilers; 0 while it stands by",
    registry=REGISTRY,
)
POLICY_COMPILED_PODS = Counter(
    "netclaim_policy_compiled_pods_total",
    "Pods whose rules the controller's policy passes compiled, by pass (changed: the pods a change touched; "
    "full: every pod, at a term's first pass and each resync)",
    ["pass"],
    registry=REGISTRY,
)
POLICY_NAMESPACES_OVER_BUDGET = Gauge(
    "netclaim_policy_namespaces_over_budget",
    "Namespaces whose MultiNetworkPolicies together exceed their budget (rules, peers, bytes): their "
    "policies are read as unreadable (their selected pods isolated); which ones, the Warning Events say",
    registry=REGISTRY,
)


async def counted_pass(
    passes: Counter, work: Callable[[], Awaitable[Any]], seconds: Histogram | None = None
) -> None:
    """One of the controller's passes, counted in `passes` by result (ok, error), and timed in `seconds`."""
    started = time.monotonic()
    try:
        await work()
    except Exception:
        passes.labels("error").inc()
        raise
    passes.labels("ok").inc()
    if seconds is not None:
        seconds.observe(time.monotonic() - started)
