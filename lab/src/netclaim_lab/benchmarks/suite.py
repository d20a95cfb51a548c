"""`make bench`: what netclaim costs, measured on its own local cluster against floors from the same run.

Three floors: the raw CNI exec of the same config (raw_cni.py), pods with no claim, and pods with a claim
of Kubernetes' example DRA driver (example_driver.py: what DRA itself costs). netclaim's NRI hook is timed
from outside by two clock-only NRI plugins around it (stopwatch.py), the API requests it makes per pod
counted in the API server's audit log, its memory read from its container's cgroup and /proc.

Phases (each figure says where it was observed):
  idle     the agents' RSS, container memory (cgroup anon, PSS) and CPU over quiet seconds (/proc, cgroup)
  floor    the raw CNI exec of the benchmark's config lists, 1 and 4 per pod (raw_cni.py)
  serial   pods one at a time on node-1, arms interleaved: no claim, an example-driver GPU, 1 NIC, 4 NICs;
           RunPodSandbox (containerd's log), the hook (stopwatch), create → pod Ready and → claim Ready
           (API watch), the agent's requests per pod (audit log); the agent's own log, labelled so
  burst    pods at once, rounds of each arm (no claim, GPU, NIC, NIC + pool address): create → pod Ready,
           → claim Ready, the ratios with 95 % bootstrap intervals; the hook under contention (stopwatch)
  neighbour  bursts of the NIC and GPU arms in turn beside a tenant burning CPU on node-1
  fullnode 110 pods at once on node-1, without a claim, with a GPU, then with one NIC each: time to all
           Ready and phases per arm; the agent's container memory filled and emptied
  publish  1,024 devices from agent start to the last slice write; one NIC added → slice write (audit log)
  memory   what each library adds to a Python process in the agent's container (crictl exec)
  profile  py-spy on the agent from outside, pods one at a time and a burst (apart from the timed phases)

Writes bench/report.json (every sample kept), then docs/benchmarks.md and its plots (report.py); the last
line is the BENCH line. `--quick` runs every phase small (make test): its figures mean nothing, and those
that need more samples than it takes read "na". NETCLAIM_KEEP_CLUSTER=1 keeps the cluster (and a running
one is reused).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceSlice

from netclaim.errors import TransientError
from netclaim_lab import agents, cluster, example_driver, processes
from netclaim_lab.benchmarks import measure, raw_hook, report, stopwatch
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT

HERE = Path(__file__).resolve().parent
NODE = "node-1"
NODES = ("node-1", "node-2")  # the bench cluster's, NODE first (the stopwatches' order too)
NAMESPACE = "bench"
NICS = ["enp0s10", "enp0s11", "enp0s12", "enp0s13"]
POOL_NIC = "enp0s14"  # each node's NIC on POOL_NETWORK (policy.yaml): the pool arm's, and only its
EXAMPLE_GPUS = 112  # per node: more than a burst, a serial batch or a full node holds at once


@dataclasses.dataclass(frozen=True)
class Sizes:
    serial_pods: int = 100  # of each arm but 4 NICs: no claim, an example-driver GPU, 1 NIC
    serial_four_pods: int = 30  # with 4 NICs
    serial_batch: int = 10  # rounds between clearing the pods
    burst_pods: int = 30
    burst_rounds: int = 4  # of each arm: 120 pods
    full_node_pods: int = 110
    raw_runs: int = 40
    raw_burst_rounds: int = 2  # bursts of example-driver pods with the raw plugin's ADD run beside them
    publish_runs: int = 3
    nic_changes: int = 5
    settle_seconds: float = 20
    idle_seconds: float = 60
    profiled_pods: int = 20
    neighbour_rounds: int = 2  # netclaim bursts beside a tenant that burns CPU on node-1


FULL = Sizes()
# make test's run of the whole suite: every phase and the report, in a few minutes, figures meaningless
QUICK = Sizes(
    serial_pods=3,
    serial_four_pods=2,
    serial_batch=3,
    burst_pods=5,
    burst_rounds=1,
    full_node_pods=10,
    raw_runs=3,
    raw_burst_rounds=1,
    publish_runs=1,
    nic_changes=1,
    settle_seconds=5,
    idle_seconds=5,
    profiled_pods=3,
    neighbour_rounds=1,
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_phase(message: str) -> None:
    """A timed phase begins: first the machine settles from the one before."""
    log(message)
    waited = measure.wait_quiet()
    if waited > 2.5:
        log(f"  (waited {waited:.0f} s for the machine's CPUs to be < 25 % busy)")


# --- the objects -------------------------------------------------------------------------------------
def _cni_config(index: int) -> dict[str, Any]:
    """netclaim's CNIConfig for request `index`: the same list raw_cni.py runs, its master the
    allocated device."""
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "interfaceName": f"net{index + 1}",
        "config": {
            "cniVersion": "1.1.0",  # STATUS before each ADD and the GC gate on the path, as with v1.10
            "name": f"bench-{index}",
            "plugins": [
                {
                    "type": "macvlan",
                    "master": "{{ device.ifName }}",
                    "mode": "bridge",
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": f"10.98.{index}.0/24"}]]},
                }
            ],
        },
    }


# Pods attached as the raw plugin attaches them, unshaped: only an admin's class may say so (a claim's
# share of a shared NIC is always shaped).
UNSHAPED_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "netclaim-bench-unshaped"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "netclaim.dev" && "ifName" in '
                    'device.attributes["netclaim.dev"] && device.attributes["netclaim.dev"].shared'
                }
            }
        ],
        "config": [
            {
                "opaque": {
                    "driver": "netclaim.dev",
                    "parameters": {
                        "apiVersion": "netclaim.dev/v1alpha1",
                        "kind": "CNIConfig",
                        "bandwidth": "none",
                    },
                }
            }
        ],
    },
}


def template(name: str, nics: int, shaped: bool) -> dict[str, Any]:
    """`nics` requests, request i on NICS[i] when there are several (a pod with one interface per NIC)."""
    requests, configs = [], []
    for index in range(nics):
        exactly: dict[str, Any] = {
            "deviceClassName": "netclaim-shared" if shaped else UNSHAPED_CLASS["metadata"]["name"]
        }
        if nics > 1:
            expression = f'device.attributes["netclaim.dev"].ifName == "{NICS[index]}"'
        else:  # the pool's network takes no claim's own IPAM (its addresses come from the pool)
            expression = f'device.attributes["netclaim.dev"].ifName != "{POOL_NIC}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
        requests.append({"name": f"nic{index}", "exactly": exactly})
        configs.append(
            {
                "requests": [f"nic{index}"],
                "opaque": {"driver": "netclaim.dev", "parameters": _cni_config(index)},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": requests, "config": configs}}},
    }


POOL = "bench-pool"
POOL_NETWORK = "bench"  # policy.yaml puts POOL_NIC on it


def ip_pool() -> dict[str, Any]:
    """The pool arm's addresses: an admin's IPPool on the NICs' network."""
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": POOL},
        "spec": {"network": POOL_NETWORK, "ranges": [{"subnet": "10.97.0.0/16"}]},
    }


def pool_template(name: str) -> dict[str, Any]:
    """A shaped share of a NIC, as template("shaped") asks, and an address of POOL on its network (the
    claim docs/ipam.md shows): the plugin has no IPAM of its own, the agent hands it the pool's address."""
    on_pool_nic = f'device.attributes["netclaim.dev"].ifName == "{POOL_NIC}"'
    nic = {
        "name": "nic0",
        "exactly": {
            "deviceClassName": "netclaim-shared",
            "selectors": [{"cel": {"expression": on_pool_nic}}],
        },
    }
    address = {
        "name": "ip",
        "exactly": {
            "deviceClassName": "netclaim-address",
            "selectors": [{"cel": {"expression": f'device.attributes["netclaim.dev"].pool == "{POOL}"'}}],
        },
    }
    parameters = _cni_config(0)
    parameters["config"]["plugins"][0].pop("ipam")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [nic, address],
                    "config": [
                        {"requests": ["nic0"], "opaque": {"driver": "netclaim.dev", "parameters": parameters}}
                    ],
                }
            }
        },
    }


def pod(name: str, claim_template: str | None, node: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "netclaim.local/busybox:1.35",
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [container]}
    if claim_template:
        spec["resourceClaims"] = [{"name": "net", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "net"}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"}},
        "spec": spec,
    }


# --- helpers ---------------------------------------------------------------------------------------
def _apply(handle: ClusterHandle, *objects: dict[str, Any]) -> None:
    handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects), timeout=120)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    try:
        processes.wait_until(predicate, timeout, what)
    except TransientError as err:
        raise SystemExit(f"bench: {err}") from None


def _clear_pods(kube: Client, timeout: float = 300) -> None:
    for item in kube.list(Pod, namespace=NAMESPACE):
        if item.metadata and item.metadata.name:
            kube.delete(Pod, item.metadata.name, namespace=NAMESPACE)
    wait_for(lambda: not list(kube.list(Pod, namespace=NAMESPACE)), timeout, "the bench pods gone")


HOOK_PART_KEYS = ("lock_ms", "attach_ms", "policy_ms", "metadata_ms")  # the agent's "pod sandbox hooked"


def _agent_log_entries(
    handle: ClusterHandle, node: str, offset: int, message: str, claim_prefix: str = ""
) -> list[dict[str, Any]]:
    """The agent's `message` lines since `offset`, of the claims (or, on a line without one, the pods)
    whose name starts so."""
    text = agents.agent_log(handle, node)[offset:]
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [
        e
        for e in entries
        if e.get("msg") == message
        and str(e.get("claim") or e.get("pod", "")).split("/")[-1].startswith(claim_prefix)
    ]


def _agent_log_values(
    handle: ClusterHandle, node: str, offset: int, message: str, key: str, claim_prefix: str = ""
) -> list[float]:
    """`key` of the agent's `message` lines since `offset` (see _agent_log_entries)."""
    return [
        float(e[key]) for e in _agent_log_entries(handle, node, offset, message, claim_prefix) if key in e
    ]


def _agent_pid(handle: ClusterHandle, node: str) -> int:
    pid = agents.agent_pid(handle, node)
    if pid is None:
        raise SystemExit(f"bench: no running agent on {node}")
    return pid


def _containerd_log(handle: ClusterHandle, node: str) -> Path:
    return handle.layout.logs / node / "containerd.log"


def _create_timed(kube: Client, manifests: list[dict[str, Any]]) -> dict[str, float]:
    created: dict[str, float] = {}
    for manifest in manifests:
        created[manifest["metadata"]["name"]] = time.time()
        kube.create(_typed_pod(manifest))
    return created


def _ready(watch: measure.ReadyWatch, pod_name: str, with_claim: bool) -> bool:
    return watch.ready_at(pod_name, with_claim) is not None


def _typed_pod(manifest: dict[str, Any]) -> Pod:
    typed = Pod.from_dict(manifest)
    assert isinstance(typed, Pod)
    return typed


# --- phases ------------------------------------------------------------------------------------------
def idle(handle: ClusterHandle, sizes: Sizes) -> dict[str, Any]:
    log(f"idle: sampling the agents for {sizes.idle_seconds} s")
    time.sleep(sizes.settle_seconds)  # start-up publishes and the first reconcile rounds are over
    samplers = {n: measure.ProcessSampler(_agent_pid(handle, n), interval=1.0) for n in NODES}
    with contextlib.ExitStack() as stack:
        for sampler in samplers.values():
            stack.enter_context(sampler)
        time.sleep(sizes.idle_seconds)
    return {
        node: {
            "rss_mib": max(s[1] for s in sampler.samples),
            "container_mib": measure.container_memory(sampler.pid),
            "cpu_mcores": sampler.millicores(),
            "seconds": sampler.samples[-1][0] - sampler.samples[0][0],
            "rss_series": [[round(t - sampler.samples[0][0], 1), r] for t, r, _ in sampler.samples],
        }
        for node, sampler in samplers.items()
    }


def floor(handle: ClusterHandle, sizes: Sizes) -> dict[str, Any]:
    start_phase(f"floor: raw CNI exec, {sizes.raw_runs} runs each of 1 and 4 config lists")
    node = handle.node(NODE)

    def raw(masters: list[str]) -> dict[str, list[float]]:
        command = [
            *node.enter(),
            sys.executable,
            str(HERE / "raw_cni.py"),
            str(sizes.raw_runs),
            ",".join(masters),
        ]
        return dict(json.loads(processes.run(command, timeout=600)))

    one, four = raw(NICS[:1]), raw(NICS)
    return {
        "add_1": measure.distribution(one["add_ms"]),
        "del_1": measure.distribution(one["del_ms"]),
        "add_4": measure.distribution(four["add_ms"]),
        "del_4": measure.distribution(four["del_ms"]),
    }


# The pod-start arms: no claim; a claim of Kubernetes' example DRA driver (one fake GPU); netclaim claims.
SERIAL_ARMS = {"none": None, "dra": "gpu", "one": "one", "four": "four"}
NETCLAIM_ARMS = ("one", "four")


def _serial_pod(kube: Client, watch: measure.ReadyWatch, name: str, arm: str) -> float:
    """Create the pod on NODE and wait until it is Ready (and its netclaim claim too); when it was created."""
    created = time.time()
    kube.create(_typed_pod(pod(name, SERIAL_ARMS[arm], NODE)))
    wait_for(
        lambda: name in watch.pod_ready and (arm not in NETCLAIM_ARMS or name in watch.claim_ready),
        120,
        f"{name} Ready",
    )
    return created


def serial(handle: ClusterHandle, kube: Client, sizes: Sizes, stopwatch_out: Path) -> dict[str, Any]:
    """Pods one at a time on NODE, the arms interleaved so that drift hits each alike; cleared every
    `serial_batch` rounds. Per pod: RunPodSandbox (containerd's log), netclaim's NRI hook (the stopwatch
    plugins, also for the pods it has nothing to do for), create → pod Ready and → claim Ready (API watch),
    the agent's API requests about it (audit log); the agent's own log lines, labelled so."""
    start_phase(
        f"serial: {sizes.serial_pods} pods each without a claim, with an example-driver GPU, with 1 NIC, "
        f"and {sizes.serial_four_pods} with 4 NICs, one at a time"
    )
    _apply(
        handle,
        UNSHAPED_CLASS,
        template("one", 1, shaped=False),
        template("four", 4, shaped=False),
        example_driver.claim_template("gpu", NAMESPACE),
    )
    log_offset = len(agents.agent_log(handle, NODE))
    containerd_offset = _containerd_log(handle, NODE).stat().st_size
    audit_offset = handle.layout.audit_log.stat().st_size
    names: dict[str, list[str]] = {arm: [] for arm in SERIAL_ARMS}
    created: dict[str, float] = {}
    with measure.ReadyWatch(kube, NAMESPACE) as watch:
        for index in range(sizes.serial_pods):
            for arm in SERIAL_ARMS:
                if arm == "four" and index >= sizes.serial_four_pods:
                    continue
                name = f"serial-{arm}-{index}"
                created[name] = _serial_pod(kube, watch, name, arm)
                names[arm].append(name)
            if (index + 1) % sizes.serial_batch == 0 or index + 1 == sizes.serial_pods:
                _clear_pods(kube)
    claims = sum(len(watch.pod_claims.get(n, ())) for arm in NETCLAIM_ARMS for n in names[arm])
    wait_for(  # kubelet unprepares after the pod object is gone
        lambda: len(_agent_log_values(handle, NODE, log_offset, "unprepared", "ms")) >= claims,
        120,
        f"{claims} claims unprepared",
    )
    uids = {n: watch.pod_uid[n] for arm in names for n in names[arm]}
    sandbox = measure.run_pod_sandbox_ms(_containerd_log(handle, NODE), containerd_offset, set(uids.values()))
    hook = stopwatch.hook_seconds(stopwatch_out, set(uids.values()))

    def per_arm(values: dict[str, float], scale: float = 1.0) -> dict[str, Any]:
        return {
            arm: measure.distribution(values[uids[n]] * scale for n in arm_names if uids[n] in values)
            for arm, arm_names in names.items()
        }

    time.sleep(2)  # the audit log's last lines
    requests = [r for r in measure.agent_requests(handle.layout.audit_log, audit_offset) if r.node == NODE]
    one = {n: watch.pod_claims.get(n, set()) for n in names["one"]}
    done = {n: max(watch.pod_ready[n], watch.claim_ready[n]) for n in names["one"]}
    per_pod, others = measure.requests_per_pod(requests, NAMESPACE, one, done)
    return {
        "run_pod_sandbox_ms": per_arm(sandbox),
        "hook_ext_ms": per_arm(hook, 1000),
        "pod_ready_s": {
            arm: measure.distribution(watch.pod_ready[n] - created[n] for n in arm_names)
            for arm, arm_names in names.items()
        },
        "claim_ready_s": {
            arm: measure.distribution(watch.claim_ready[n] - created[n] for n in names[arm])
            for arm in NETCLAIM_ARMS
        },
        "api_requests_one_nic": {
            "start": measure.distribution(r.start for r in per_pod.values()),
            "lifecycle": measure.distribution(r.lifecycle for r in per_pod.values()),
            "by_kind": _request_kinds(requests, NAMESPACE),
            "others": others,
        },
        "attach_agent_log": measure.distribution(
            _agent_log_values(handle, NODE, log_offset, "attached", "ms", "serial-one-")
        ),
        "hook_agent_log": {  # the hook inside the agent, and its parts
            key: measure.distribution(
                _agent_log_values(handle, NODE, log_offset, "pod sandbox hooked", key, "serial-one-")
            )
            for key in ("ms", *HOOK_PART_KEYS)
        },
        "cni_add_agent_log": measure.distribution(
            _agent_log_values(handle, NODE, log_offset, "attached", "cni_ms", "serial-one-")
        ),
        "prepare_agent_log": measure.distribution(
            _agent_log_values(handle, NODE, log_offset, "prepared", "ms")
        ),
        "unprepare_agent_log": measure.distribution(
            _agent_log_values(handle, NODE, log_offset, "unprepared", "ms")
        ),
        # a claim kubelet asked for again (a call it cancelled, a lost answer) has no second timing
        "claims_prepared_repeated": {
            message: sorted(e["claim"] for e in _agent_log_entries(handle, NODE, log_offset, message))
            for message in ("prepared", "prepare repeated")
        },
        "pods": {arm: len(v) for arm, v in names.items()},
    }


def _request_kinds(requests: list[measure.AgentRequest], namespace: str) -> dict[str, int]:
    """The agent's requests in the bench namespace by verb and resource ("get resourceclaims": n)."""
    kinds: dict[str, int] = {}
    for request in requests:
        if request.namespace == namespace:
            key = f"{request.verb} {request.resource}"
            kinds[key] = kinds.get(key, 0) + 1
    return dict(sorted(kinds.items()))


PHASES = (
    "create → bound",
    "bound → RunPodSandbox",
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "started → Ready",
)


BURST_ARMS = {"none": None, "dra": "gpu", "netclaim": "shaped", "pool": "pooled"}
OUR_ARMS = ("netclaim", "pool")  # a pod of these is started once its netclaim claim is Ready too


@dataclasses.dataclass
class BurstRound:
    pod_ready: list[float]  # each pod's create → pod Ready
    claim_ready: list[float]  # each pod's create → its netclaim claim Ready (OUR_ARMS only)
    phases: dict[str, list[float]]  # create → pod Ready, split into PHASES
    uids: set[str]
    cpu: measure.CpuSplit  # the machine's CPU from the first create to the last pod Ready
    agent: measure.ProcessSampler  # node-1's agent over the same window


def _phases(
    handle: ClusterHandle, offsets: dict[str, int], watch: measure.ReadyWatch, created: dict[str, float]
) -> dict[str, list[float]]:
    """Each created pod's start split into PHASES, from the watch and the nodes' containerd logs (read from
    `offsets`); a pod whose marks are not all found is left out."""
    logged: dict[str, measure.PodMarks] = {}
    for node, offset in offsets.items():
        logged |= measure.pod_marks(_containerd_log(handle, node), offset, set(watch.pod_uid.values()))
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for name, start in created.items():
        pod_marks = logged.get(watch.pod_uid.get(name, ""))
        if pod_marks is None or name not in watch.pod_bound or name not in watch.pod_ready:
            continue
        marks = [
            start,
            watch.pod_bound[name],
            *pod_marks.sandbox,
            pod_marks.created,
            pod_marks.started,
            watch.pod_ready[name],
        ]
        for phase, (a, b) in zip(PHASES, itertools.pairwise(marks), strict=True):
            phases[phase].append(b - a)
    return phases


def _burst_round(
    handle: ClusterHandle,
    kube: Client,
    pods: int,
    label: str,
    arm: str,
    halves: bool = False,
    settle: bool = True,
) -> BurstRound:
    """`pods` pods created at once, placed by the scheduler (`halves`: every other one on each node),
    once the machine is quiet (`settle`; a busy neighbour never lets it be). PHASES: bound by the
    scheduler (API watch), kubelet's work until it asks containerd for the sandbox (claims prepared),
    RunPodSandbox (NRI hooks included: containerd runs them one at a time per node), and the containers'
    start until Ready."""
    if settle:
        measure.wait_quiet()  # the round before is torn down
    manifests = [
        pod(f"burst-{label}-{i}", BURST_ARMS[arm], NODES[i % 2] if halves else None) for i in range(pods)
    ]
    ours = arm in OUR_ARMS
    offsets = {n: _containerd_log(handle, n).stat().st_size for n in NODES}
    with (
        measure.ReadyWatch(kube, NAMESPACE) as watch,  # open before the window below starts
        measure.ProcessSampler(_agent_pid(handle, NODE), interval=0.1) as agent,
        measure.CpuSplit() as cpu,
    ):
        created = _create_timed(kube, manifests)
        wait_for(lambda: all(watch.ready_at(n, ours) for n in created), 300, f"{pods} pods Ready")
    phases = _phases(handle, offsets, watch, created)
    _clear_pods(kube)
    return BurstRound(
        pod_ready=[watch.pod_ready[n] - created[n] for n in created],
        claim_ready=[watch.claim_ready[n] - created[n] for n in created] if ours else [],
        phases=phases,
        uids={watch.pod_uid[n] for n in created if n in watch.pod_uid},
        cpu=cpu,
        agent=agent,
    )


def _raw_beside_a_burst(
    handle: ClusterHandle, kube: Client, sizes: Sizes, arm: str, number: int
) -> list[float]:
    """The floor's ADD (the raw plugin, not through netclaim) timed over and over on node-1 while a burst
    of the arm's pods starts and is torn down, apart from the timed rounds (it would slow theirs): what one
    plugin exec costs on this machine under a burst of that size, without netclaim (the example driver's
    pods: the floor of netclaim's hook during the bursts) and beside netclaim's own work (its pods)."""
    measure.wait_quiet()
    command = [*handle.node(NODE).enter(), sys.executable, str(HERE / "raw_cni.py"), "0", NICS[0]]
    raw = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _burst_round(handle, kube, sizes.burst_pods, f"raw-{arm}{number}", arm, settle=False)
    finally:
        stdout, stderr = raw.communicate(b"", timeout=120)  # stdin ends: the run under way is its last
    if raw.returncode != 0:
        raise SystemExit(f"bench: raw_cni.py beside a burst failed: {stderr.decode(errors='replace')[-500:]}")
    return [float(ms) for ms in json.loads(stdout)["add_ms"]]


RAW_HOOK_PODS = "burst-rawhook"  # the pods raw_hook.py acts on: `_burst_round`'s names for label "rawhook…"


def _raw_hook_in_bursts(handle: ClusterHandle, kube: Client, sizes: Sizes) -> tuple[list[float], list[float]]:
    """The floor's ADD run by an NRI hook that does nothing else (raw_hook.py) on NODE, in bursts of
    example-driver pods of the same size, apart from the timed rounds: the ADD in RunPodSandbox, when the
    node's other sandboxes are made, as netclaim's is. (ADD ms, that hook's whole ms) per sandbox."""
    with tempfile.TemporaryDirectory() as work:
        with raw_hook.running(handle, NODE, Path(work), RAW_HOOK_PODS, NICS[0]) as out:
            for number in range(sizes.raw_burst_rounds):
                # every other pod on NODE, where the hook runs: never a burst it sees none of
                _burst_round(handle, kube, sizes.burst_pods, f"rawhook{number}", "dra", halves=True)
        return raw_hook.timings(out)


def burst(handle: ClusterHandle, kube: Client, sizes: Sizes, stopwatch_out: list[Path]) -> dict[str, Any]:
    """Rounds of pods created at once, spread by the scheduler over both nodes, the arms in turn:
    no claim, an example-driver GPU, a shaped netclaim NIC, the same NIC with an address of an IPPool.
    Pod Ready is what a user waits for; the claim's Ready (netclaim's status write) is reported apart."""
    start_phase(
        f"burst: {sizes.burst_pods} pods at once, {sizes.burst_rounds} rounds of each arm "
        f"({', '.join(BURST_ARMS)})"
    )
    _apply(
        handle,
        template("shaped", 1, shaped=True),
        example_driver.claim_template("gpu", NAMESPACE),
        ip_pool(),
        pool_template("pooled"),
    )
    rounds: dict[str, list[BurstRound]] = {arm: [] for arm in BURST_ARMS}
    log_offsets = {node: len(agents.agent_log(handle, node)) for node in NODES}
    for round_number in range(sizes.burst_rounds):
        for arm in BURST_ARMS:
            label = f"{arm}{round_number}"
            rounds[arm].append(_burst_round(handle, kube, sizes.burst_pods, label, arm))
    # the pool arm again, its addresses reserved by the controller before the pods bind (binding
    # conditions, Kubernetes 1.36+; opt-in): what the scheduler's wait for them costs
    agents.set_address_reservation(handle, "before-binding")
    reserved = [
        _burst_round(handle, kube, sizes.burst_pods, f"poolres{n}", "pool") for n in range(sizes.burst_rounds)
    ]
    agents.set_address_reservation(handle, "at-prepare")
    raw_beside = {
        arm: [
            ms
            for n in range(sizes.raw_burst_rounds)
            for ms in _raw_beside_a_burst(handle, kube, sizes, arm, n)
        ]
        for arm in ("dra", "netclaim")
    }
    raw_hook_add, raw_hook_whole = _raw_hook_in_bursts(handle, kube, sizes)
    ready = {arm: [s for r in runs for s in r.pod_ready] for arm, runs in rounds.items()}
    hooks: dict[str, dict[str, float]] = {"netclaim": {}, "none": {}}
    for path in stopwatch_out:
        for arm, timed in hooks.items():
            timed |= stopwatch.hook_seconds(path, {u for r in rounds[arm] for u in r.uids})

    def inside(message: str, key: str) -> dict[str, Any]:
        """`key` of the agent's `message` lines about the netclaim arm's timed pods, both nodes."""
        return measure.distribution(
            value
            for node in NODES
            for value in _agent_log_values(handle, node, log_offsets[node], message, key, "burst-netclaim")
        )

    first = rounds["netclaim"][0].agent.samples
    return {
        "pod_ready_s": {arm: measure.distribution(v) for arm, v in ready.items()},
        "claim_ready_s": measure.distribution(s for r in rounds["netclaim"] for s in r.claim_ready),
        "hook_ext_ms": measure.distribution(v * 1000 for v in hooks["netclaim"].values()),
        # the same hook for the pods it has nothing to do for (no claim): the NRI round trip in a burst
        "hook_empty_ext_ms": measure.distribution(v * 1000 for v in hooks["none"].values()),
        # the netclaim arm's hook as the agent timed it, and its parts (the agent's log)
        "hook_agent_log": {key: inside("pod sandbox hooked", key) for key in ("ms", *HOOK_PART_KEYS)},
        "cni_add_agent_log": inside("attached", "cni_ms"),
        "raw_add_beside_ms": {arm: measure.distribution(v) for arm, v in raw_beside.items()},
        "raw_hook_ms": {
            "add": measure.distribution(raw_hook_add),
            "hook": measure.distribution(raw_hook_whole),
        },
        "ratios": {
            f"p{q}_vs_{base}": measure.ratio(ready["netclaim"], ready[base], q)
            for base in ("dra", "none")
            for q in (50, 90, 99)
        },
        "pool_ratios": {f"p{q}_vs_dra": measure.ratio(ready["pool"], ready["dra"], q) for q in (50, 90, 99)},
        # the pool arm with its addresses reserved before binding
        "pool_reserved_s": measure.distribution(s for r in reserved for s in r.pod_ready),
        "pool_reserved_ratios": {
            f"p{q}_vs_dra": measure.ratio([s for r in reserved for s in r.pod_ready], ready["dra"], q)
            for q in (50, 90, 99)
        },
        "dra_vs_none": {f"p{q}": measure.ratio(ready["dra"], ready["none"], q) for q in (50, 99)},
        "peak_rss_mib": max(r.agent.peak_rss() for r in rounds["netclaim"]),
        "rss_series": [[round(t - first[0][0], 2), rss] for t, rss, _ in first],
        # the first round of each: where the machine's CPU went between the first create and the last Ready
        "machine_cpu_s": {
            arm: {"seconds": runs[0].cpu.seconds, "top": runs[0].cpu.top()} for arm, runs in rounds.items()
        },
        "phases_s": {
            arm: {
                phase: measure.distribution(v for r in runs for v in r.phases[phase])
                for phase in PHASES
                if any(r.phases[phase] for r in runs)
            }
            for arm, runs in rounds.items()
        },
    }


def _fill(
    handle: ClusterHandle, kube: Client, pods: int, arm: str, sampler: measure.ProcessSampler | None = None
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """`pods` pods of `arm` (BURST_ARMS) created at once on NODE: each one's create → Ready (with its
    netclaim claim Ready, in netclaim's arm) and PHASES, once all are Ready. The pods stay."""
    measure.wait_quiet()  # what came before is torn down
    manifests = [pod(f"fill-{arm}-{i}", BURST_ARMS[arm], NODE) for i in range(pods)]
    ours = arm in OUR_ARMS
    offsets = {NODE: _containerd_log(handle, NODE).stat().st_size}
    with measure.ReadyWatch(kube, NAMESPACE) as watch, contextlib.ExitStack() as stack:
        if sampler is not None:
            stack.enter_context(sampler)
        created = _create_timed(kube, manifests)
        wait_for(lambda: all(watch.ready_at(n, ours) for n in created), 900, f"{pods} pods Ready ({arm})")
        ready = {n: (watch.ready_at(n, ours) or 0.0) - created[n] for n in created}
    return ready, _phases(handle, offsets, watch, created)


def _fill_summary(ready: dict[str, float], phases: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "all_ready_s": max(ready.values()),
        "phases_s": {p: measure.distribution(v) for p, v in phases.items() if v},
    }


def full_node(handle: ClusterHandle, kube: Client, sizes: Sizes) -> dict[str, Any]:
    """A node filled at once, as floors first: pods without a claim, then with an example-driver GPU,
    then with one netclaim NIC each, whose agent is sampled meanwhile."""
    pods = sizes.full_node_pods
    start_phase(f"fullnode: {pods} pods at once on {NODE}, without a claim, with a GPU, with one NIC each")
    _apply(handle, template("shaped", 1, shaped=True), example_driver.claim_template("gpu", NAMESPACE))
    floors = {}
    for arm in ("none", "dra"):
        floors[arm] = _fill_summary(*_fill(handle, kube, pods, arm))
        _clear_pods(kube, timeout=900)
    sampler = measure.ProcessSampler(_agent_pid(handle, NODE), interval=0.5)
    ready, phases = _fill(handle, kube, pods, "netclaim", sampler)
    filled = measure.container_memory(_agent_pid(handle, NODE))
    cpu = sampler.millicores()
    _clear_pods(kube, timeout=900)
    time.sleep(sizes.settle_seconds)  # kubelet unprepares once the pods are gone
    return {
        "pods": pods,
        **_fill_summary(ready, phases),
        "ready_series_s": sorted(ready.values()),
        "floors": floors,  # the same fill without a claim ("none") and with an example-driver GPU ("dra")
        "agent_filled_mib": filled,  # the agent's container with every pod Ready
        "agent_emptied_mib": measure.container_memory(_agent_pid(handle, NODE)),  # and once they are gone
        "agent_peak_rss_mib": sampler.peak_rss(),
        "agent_cpu_mcores_during": cpu,
        "rss_series": [[round(t - sampler.samples[0][0], 1), r] for t, r, _ in sampler.samples],
    }


def _audit_slice_writes(handle: ClusterHandle, offset: int, node: str) -> list[float]:
    stamps = []
    with handle.layout.audit_log.open() as audit:
        audit.seek(offset)
        for line in audit:
            entry = json.loads(line)
            ref = entry.get("objectRef", {})
            if (
                ref.get("resource") == "resourceslices"
                and entry.get("verb") in ("create", "update", "patch")
                and entry.get("stage") == "ResponseComplete"
                and str(ref.get("name", "")).startswith(f"{node}-")
            ):
                stamps.append(datetime.datetime.fromisoformat(entry["stageTimestamp"]).timestamp())
    return stamps


def _publish_1024(handle: ClusterHandle, kube: Client, work: Path) -> float:
    node = "virt-1"
    offset = handle.layout.audit_log.stat().st_size
    name, started = agents.start_virtual_agent(handle, node, work, 1024)

    def devices() -> int:
        slices = [
            s for s in kube.list(ResourceSlice) if s.spec.nodeName == node and s.spec.driver == "netclaim.dev"
        ]
        return sum(len(s.spec.devices or []) for s in slices)

    try:
        wait_for(lambda: devices() == 1024, 120, "1,024 devices published")
        time.sleep(1)  # the audit log's last line
        writes = _audit_slice_writes(handle, offset, node)
        log(f"  {len(writes)} slice writes at {[round(w - started, 2) for w in sorted(writes)]} s")
        return max(writes) - started
    finally:
        processes.stop(work, name)


def _nic_change(handle: ClusterHandle, index: int) -> float:
    """A lone NIC hot-plugged (the agent rescans at most once a second while link events keep coming)."""
    time.sleep(1.5)
    node = handle.node("node-2")
    name = f"enp9s{index}"
    offset = handle.layout.audit_log.stat().st_size
    started = time.time()
    processes.run([*node.enter(), "ip", "link", "add", name, "type", "veth", "peer", "name", f"x{name}"])
    processes.run([*node.enter(), "ip", "link", "set", name, "up"])
    try:
        wait_for(lambda: bool(_audit_slice_writes(handle, offset, "node-2")), 60, f"{name} published")
        return min(_audit_slice_writes(handle, offset, "node-2")) - started
    finally:
        time.sleep(1.5)  # the add's last write is in; the next write is the withdrawal
        removed = handle.layout.audit_log.stat().st_size
        processes.run([*node.enter(), "ip", "link", "del", name])
        wait_for(lambda: bool(_audit_slice_writes(handle, removed, "node-2")), 60, f"{name} withdrawn")


def publish(handle: ClusterHandle, kube: Client, sizes: Sizes) -> dict[str, Any]:
    start_phase(
        f"publish: 1,024 devices from agent start, {sizes.publish_runs} runs; "
        f"one NIC added, {sizes.nic_changes} runs"
    )
    with tempfile.TemporaryDirectory() as work:
        runs = [_publish_1024(handle, kube, Path(work)) for _ in range(sizes.publish_runs)]
    changes = [_nic_change(handle, i) for i in range(sizes.nic_changes)]
    return {"start_to_1024_s": measure.distribution(runs), "nic_added_s": measure.distribution(changes)}


IMPORT_COSTS = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
steps = [["python", rss()]]
for name in sys.argv[1:]:
    if name == LIBRARIES:  # every other module the agent's own modules import, but theirs
        import subprocess
        listed = subprocess.run(
            [sys.executable, "-c", LIST_MODULES], check=True, capture_output=True, text=True
        ).stdout.split()
        for module in listed:
            if module not in sys.modules:
                __import__(module)
    else:
        __import__(name)
    steps.append([name, rss()])
print(json.dumps(steps))
"""
LIBRARIES = "every other library of the agent"
# the modules `import netclaim.agent.main` loads that are not netclaim's, in the order they were loaded
LIST_MODULES = (
    "import sys; import netclaim.agent.main; "
    "print(' '.join(m for m in sys.modules if not m.startswith(('netclaim', '__'))))"
)
# the agent's libraries in the order its own modules first import them, then the rest (the standard
# library's and the libraries' own), then the agent itself
AGENT_IMPORTS = [
    "asyncio",
    "msgspec",
    "httpx2",
    "lightkube",
    "grpclib",
    "prometheus_client",
    "pyroute2",
    LIBRARIES,
]


def memory(handle: ClusterHandle) -> dict[str, Any]:
    """Resident memory each library adds, imported one after another by the agent image's own Python in
    the agent's running container (crictl exec), then netclaim's agent modules on top."""
    log("memory: what each library adds to a Python process in the agent's container")
    found = agents.agent_container(handle, NODE)
    if found is None:
        raise SystemExit(f"bench: no running agent container on {NODE}")
    node = handle.node(NODE)  # crictl exec streams through the node's own address
    script = f"LIBRARIES = {LIBRARIES!r}\nLIST_MODULES = {LIST_MODULES!r}\n{IMPORT_COSTS}"
    command = [*node.enter(), *node.crictl(), "exec", found[0], "python3", "-c", script]
    command += [*AGENT_IMPORTS, "netclaim.agent.main"]
    steps = json.loads(processes.run(command, timeout=120))
    return {
        "steps_mib": [
            [name, round(mib - previous, 1)] for (_, previous), (name, mib) in itertools.pairwise(steps)
        ],
        "python_mib": round(steps[0][1], 1),
        # the interpreter with every library the agent imports, before a module of its own is
        "libraries_mib": round(dict(steps)[LIBRARIES], 1),
        "after_imports_mib": round(steps[-1][1], 1),
    }


def profile(handle: ClusterHandle, kube: Client, sizes: Sizes) -> dict[str, Any]:
    """py-spy on node-1's agent (from outside, not pausing it) while pods start one at a time and then in
    a burst; kept apart from the timed phases, which ran without it."""
    start_phase(
        f"profile: py-spy on the node-1 agent: {sizes.profiled_pods} one-NIC pods one at a time, then a burst"
    )
    with tempfile.TemporaryDirectory() as work:
        serial_stacks, burst_stacks = Path(work) / "serial.txt", Path(work) / "burst.txt"
        with measure.Profile(_agent_pid(handle, NODE), serial_stacks, rate=1000):
            with measure.ReadyWatch(kube, NAMESPACE) as watch:
                for index in range(sizes.profiled_pods):
                    name = f"profile-{index}"
                    kube.create(_typed_pod(pod(name, "one", NODE)))
                    wait_for(functools.partial(_ready, watch, name, True), 120, f"{name} Ready")
            _clear_pods(kube)
        with measure.Profile(_agent_pid(handle, NODE), burst_stacks):
            _burst_round(handle, kube, sizes.burst_pods, "profiled", "netclaim")
        return {
            "attach": measure.busy_profile(serial_stacks, "Attacher.attach"),
            "prepare": measure.busy_profile(serial_stacks, "Preparer.prepare"),
            "burst": measure.busy_profile(burst_stacks),
        }


BURNER_CPU = "1"  # half of a bench node
NRI_LOST = "NRI connection lost; reconnecting"  # the agent's log (netclaim.adapters.nri)
HOOK_MISSED = "attaching into a running sandbox (its RunPodSandbox was missed)"  # netclaim.agent.pods.hooks


def _burner() -> dict[str, Any]:
    """A tenant's pod that requests BURNER_CPU on NODE and keeps two CPUs busy."""
    loop = "while :; do :; done"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-burner", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "burn",
                    "image": "netclaim.local/busybox:1.35",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"{loop} & {loop}"],
                    "resources": {"requests": {"cpu": BURNER_CPU}},
                }
            ],
        },
    }


def busy_neighbour(
    handle: ClusterHandle, kube: Client, sizes: Sizes, stopwatch_out: list[Path]
) -> dict[str, Any]:
    """netclaim bursts and example-driver bursts in turn, half of each on either node, while a tenant's
    pod burns CPU on node-1 (node-2 has none; the scheduler would send most pods there). containerd makes
    every NRI call of a node under one lock, so the node's container creates and starts wait for
    netclaim's hooks in flight: how long a hook takes when tenants use the node's CPU is every pod's
    business there. The agent gets CPU by its container's request (cgroup shares), against the tenants'
    requests; the example driver's pods, beside the same tenant, are the floor of their pod start."""
    start_phase(
        f"busy neighbour: {sizes.neighbour_rounds} rounds of {sizes.burst_pods}-pod bursts (netclaim, then "
        f"the example driver) beside a tenant pod on {NODE} that requests {BURNER_CPU} CPU and burns two"
    )
    measure.wait_quiet()  # the bursts before are torn down; with the burner the machine is never quiet
    log_offsets = {node: len(agents.agent_log(handle, node)) for node in NODES}
    burner = _typed_pod(_burner())
    kube.create(burner)
    try:
        wait_for(lambda: _phase(kube, "bench-burner", "default") == "Running", 120, "the burner Running")
        rounds: dict[str, list[BurstRound]] = {"netclaim": [], "dra": []}
        for i in range(sizes.neighbour_rounds):
            for arm, runs in rounds.items():
                label = f"neighbour{i}" if arm == "netclaim" else f"beside{arm}{i}"  # HOOK_MISSED: ours only
                runs.append(
                    _burst_round(handle, kube, sizes.burst_pods, label, arm, halves=True, settle=False)
                )
    finally:
        kube.delete(Pod, "bench-burner", namespace="default")
        wait_for(lambda: _phase(kube, "bench-burner", "default") is None, 120, "the burner gone")
    uids = {u for r in rounds["netclaim"] for u in r.uids}
    ready = {arm: [s for r in runs for s in r.pod_ready] for arm, runs in rounds.items()}
    hooks = {
        node: measure.distribution(v * 1000 for v in stopwatch.hook_seconds(path, uids).values())
        for node, path in zip(NODES, stopwatch_out, strict=True)
    }
    return {
        # a hook past containerd's NRI timeout: containerd closes the connection, and the pods whose
        # RunPodSandbox goes by before the agent is back are attached into their running sandboxes
        "nri_reconnects": {
            node: len(_agent_log_entries(handle, node, log_offsets[node], NRI_LOST)) for node in NODES
        },
        "hooks_missed": {
            node: len(_agent_log_entries(handle, node, log_offsets[node], HOOK_MISSED, "burst-neighbour"))
            for node in NODES
        },
        "burner_cpu": BURNER_CPU,
        "agent_cpu_request": handle.kubectl(
            *("-n", "netclaim-system", "get", "daemonset", "netclaim-agent", "-o"),
            "jsonpath={.spec.template.spec.containers[0].resources.requests.cpu}",
        ),
        "hook_ext_ms": hooks,
        "pod_ready_s": measure.distribution(ready["netclaim"]),
        "dra_pod_ready_s": measure.distribution(ready["dra"]),
        "ratios": {f"p{q}_vs_dra": measure.ratio(ready["netclaim"], ready["dra"], q) for q in (50, 99)},
    }


def _phase(kube: Client, name: str, namespace: str) -> str | None:
    """The pod's phase; None once it is gone."""
    try:
        found = kube.get(Pod, name, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    return (found.status.phase or "") if found.status else ""


# --- the run -----------------------------------------------------------------------------------------
def _figure(value: float | None, form: str) -> str:
    return "na" if value is None else format(value, form)


def bench_line(result: dict[str, Any]) -> str:
    """The run in one line, keys in the order the goals name them; "na" where the run had too few samples
    for the figure (make test's quick run)."""
    serial_, burst_, floor_ = result["serial"], result["burst"], result["floor"]
    hooks = {arm: serial_["hook_ext_ms"][arm]["p50"] for arm in ("none", "one", "four")}
    hook, raw = hooks["one"], floor_["add_1"]["p50"]
    ratios = burst_["ratios"]
    idle = result["idle"][NODE]
    fields = {
        # netclaim's own share of an attach: its hook, less the NRI round trip every pod's hook costs (the
        # hook of a pod without a claim) and the plugin's own exec (the raw floor)
        "attach_overhead_ms": _figure(hooks["one"] - hooks["none"] - raw, ".1f"),
        "attach4_ratio": _figure((hooks["four"] - hooks["none"]) / floor_["add_4"]["p50"], ".2f"),
        "hook_burst_p50_ms": _figure(burst_["hook_ext_ms"]["p50"], ".0f"),
        # its floor: the raw plugin's ADD alone, during a burst of example-driver pods of the same size
        "raw_burst_p50_ms": _figure(burst_["raw_add_beside_ms"]["dra"]["p50"], ".0f"),
        # the same ADD inside a hook that does nothing else, in bursts of the same size
        "raw_hook_burst_p50_ms": _figure(burst_["raw_hook_ms"]["add"]["p50"], ".0f"),
        # and the NRI round trip there: the hook of the bursts' pods it has nothing to do for
        "hook_burst_empty_p50_ms": _figure(burst_["hook_empty_ext_ms"]["p50"], ".0f"),
        "agent_rss_active_mib": _figure(result["fullnode"]["agent_filled_mib"]["rss"], ".1f"),
        "agent_pss_idle_mib": _figure(idle["container_mib"]["pss"], ".1f"),
        "attach_ext_ratio": _figure(hook / raw, ".2f"),
        "podstart_p50_vs_dra": _figure(ratios["p50_vs_dra"]["value"], ".2f"),
        "podstart_p99_vs_dra": _figure(ratios["p99_vs_dra"]["value"], ".2f"),
        "podstart_p50_vs_none": _figure(ratios["p50_vs_none"]["value"], ".2f"),
        "podstart_pool_p50_vs_dra": _figure(burst_["pool_ratios"]["p50_vs_dra"]["value"], ".2f"),
        # the same claims with their addresses reserved before binding instead of at kubelet's prepare
        "podstart_pool_reserved_p50_vs_dra": _figure(
            burst_["pool_reserved_ratios"]["p50_vs_dra"]["value"], ".2f"
        ),
        "podstart_busy_p50_vs_dra": _figure(result["neighbour"]["ratios"]["p50_vs_dra"]["value"], ".2f"),
        "api_requests_per_pod": _figure(serial_["api_requests_one_nic"]["start"]["p50"], ".0f"),
        "agent_mem_active_mib": _figure(result["fullnode"]["agent_filled_mib"]["anon"], ".1f"),
        "agent_rss_idle_mib": _figure(idle["rss_mib"], ".1f"),
        "agent_import_floor_mib": _figure(result["memory"]["libraries_mib"], ".1f"),
    }
    return "BENCH " + " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: make test's run of the suite")
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="where bench/ and docs/ are")
    args = parser.parse_args(argv)
    processes.exit_on_sigterm()
    sizes = QUICK if args.quick else FULL
    if args.quick:
        measure.skip_quiet_waits()
    started = time.monotonic()
    handle = cluster.up(HERE / "cluster.yaml")
    keep = os.environ.get("NETCLAIM_KEEP_CLUSTER") == "1"
    try:
        agents.deploy(handle, HERE / "policy.yaml")  # deploy/ as it is, with the benchmarks' tenant range
        agents.wait_ready(handle, list(NODES), timeout=180)
        example_driver.install(handle, devices_per_node=EXAMPLE_GPUS)
        with Client(KubeConfig.from_file(handle.kubeconfig), field_manager="netclaim-bench") as kube:
            try:
                kube.create(Namespace(metadata={"name": NAMESPACE}))  # type: ignore[arg-type]
            except ApiError as err:
                if err.status.code != 409:
                    raise
            _clear_pods(kube)
            result: dict[str, Any] = {
                "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            }
            result["commit"] = processes.run(
                ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"]
            ).strip()
            result["sizes"] = dataclasses.asdict(sizes)
            result["idle"] = idle(handle, sizes)
            result["floor"] = floor(handle, sizes)
            with tempfile.TemporaryDirectory() as work, contextlib.ExitStack() as stopwatches:
                clocks = [
                    stopwatches.enter_context(stopwatch.running(handle, node, Path(work))) for node in NODES
                ]
                result["serial"] = serial(handle, kube, sizes, clocks[0])
                result["burst"] = burst(handle, kube, sizes, clocks)
                result["neighbour"] = busy_neighbour(handle, kube, sizes, clocks)
            result["fullnode"] = full_node(handle, kube, sizes)
            result["publish"] = publish(handle, kube, sizes)
            result["memory"] = memory(handle)
            result["profile"] = profile(handle, kube, sizes)
        result["machine"] = report.machine()
        result["seconds"] = time.monotonic() - started
        result["bench_line"] = bench_line(result)
        out = args.out / "bench" / "report.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        report.render(result, args.out)
        log(f"wrote {out}, docs/benchmarks.md and its plots in {result['seconds'] / 60:.1f} min")
    finally:
        if not keep:
            cluster.down(handle.spec.name)
    print(result["bench_line"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
