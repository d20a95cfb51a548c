"""`netclaim controller`: the cluster's controller. Only wiring: the work is in ipam.py, services.py and
policy.py, and every task it starts is kept running by netclaim.runtime.supervisor.

Replicas elect a leader on the Lease `<driver>-controller` in its namespace (netclaim.runtime.election):
the leader runs the reconcilers; a standby reads the Lease every 2 s and takes it once the leader gives it
up (a clean stop: within 2 s) or has not renewed it for its 10 s (kill -9, a lost node: within 12 s).
A replica is Ready once it has read the Lease and, while leading, once its first IPAM pass is done. A
leader that cannot renew for 7 s (each try given up after 2 s) stops leading and exits, to come back as
a candidate: it stops within 9 s, before a standby may take the Lease (10 s unchanged on its own clock).

One object never fails a pass: the lists skip (and report) what cannot be read (netclaim.adapters.kube),
and a write about one object that fails is logged and tried again the next pass; only an API that cannot
serve ends a pass early. Passes are counted in netclaim_reconcile_total{result} and the last success is
netclaim_last_reconcile_timestamp_seconds: what shows that reconcile keeps succeeding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from netclaim.adapters.http import Health
from netclaim.adapters.http import serve as serve_health
from netclaim.adapters.kube import watched
from netclaim.adapters.kube.addresses import KubeAddresses
from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.connection import KubeConnection
from netclaim.adapters.kube.leases import KubeLease
from netclaim.adapters.kube.params import KubePoolParams
from netclaim.adapters.kube.policies import KubePolicies
from netclaim.adapters.kube.services import KubeServices
from netclaim.adapters.kube.slices import KubeSlices
from netclaim.controller.informer import Informer
from netclaim.controller.ipam import Reconciler, concerns_pools
from netclaim.controller.policy import PolicyReconciler, PolicySources
from netclaim.controller.reservations import Reservations
from netclaim.controller.services import EndpointsReconciler, HeldSlice, NetworkService
from netclaim.core.config.settings import ControllerSettings
from netclaim.core.ipam.pools import (
    Quarantine,
)
from netclaim.core.kubeapi import (
    ClusterClaimsApi,
    IPPoolsApi,
    NetworkPoliciesApi,
    NetworkServicesApi,
    PoolParamsApi,
)
from netclaim.core.objects import Claim, NamespaceLabels, Pod
from netclaim.core.policy.distribution import RulesMap
from netclaim.core.policy.rules import PolicySource
from netclaim.runtime.election import Election
from netclaim.runtime.stopping import stopping_on_signals
from netclaim.runtime.supervisor import Supervisor
from netclaim.runtime.trigger import (
    CHANGES_REST,
    KeyBackoff,
    PassClock,
    Trigger,
    always,
    fire_on_changes,
    paced_pass,
    periodic,
)

log = logging.getLogger(__name__)


async def run(settings: ControllerSettings) -> None:
    health = Health()
    health.expect("serving")
    http = await serve_health(settings.metrics_address, health)
    kube = KubeConnection.connect(settings.kubeconfig, f"{settings.driver_name}-controller")
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    election = Election(KubeLease(kube, settings.namespace, f"{settings.driver_name}-controller"), identity)
    log.info("controller starting", extra={"driver": settings.driver_name, "identity": identity})
    try:
        async with stopping_on_signals() as stop:
            candidate = asyncio.create_task(election.run(partial(lead, settings, kube, health)))
            standing_by = asyncio.create_task(_ready_once_read(election, health))
            stopper = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({candidate, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (candidate, standing_by, stopper):
                    task.cancel()
                await asyncio.gather(standing_by, stopper, return_exceptions=True)
            if not stop.is_set():
                await candidate  # LeadershipLost (or lead's own error): the process exits, to stand again
            with contextlib.suppress(asyncio.CancelledError):
                await candidate
    finally:
        await election.release()
        if http is not None:
            http.close()
        await kube.close()
        log.info("controller stopped")


async def _ready_once_read(election: Election, health: Health) -> None:
    await election.seen.wait()
    if not election.leading.is_set():
        health.set("serving", True)


async def lead(settings: ControllerSettings, kube: KubeConnection, health: Health) -> None:
    """The reconcilers, while this replica holds the Lease (cancelled when it stops holding it)."""
    health.set("serving", False)  # until the first IPAM pass of this term
    claims: ClusterClaimsApi = KubeClaims(kube)
    addresses: IPPoolsApi = KubeAddresses(kube)
    params: PoolParamsApi = KubePoolParams(kube, settings.namespace)
    services: NetworkServicesApi = KubeServices(kube)
    trigger, endpoints_trigger, policies_trigger = Trigger(), Trigger(), Trigger()
    endpoints_clock, policies_clock = PassClock(), PassClock()

    def quarantined(seconds: float) -> None:
        """An address found released: the passes that publish addresses run now, the pools' after it."""
        endpoints.touch()
        endpoints_trigger.fire()
        policies_trigger.fire()
        asyncio.get_running_loop().call_later(seconds + 0.5, trigger.fire)

    quarantine = Quarantine(
        lambda since: endpoints_clock.since(since) and policies_clock.since(since),
        settings.address_quarantine_seconds,
        quarantined,
    )
    reservations = Reservations(KubeClaims(kube), KubeAddresses(kube), settings.driver_name)
    reconciler = Reconciler(
        claims,
        addresses,
        KubeSlices(kube),
        params,
        settings.driver_name,
        quarantine,
        reserve_before_binding=settings.address_reservation == "before-binding",
        claim_changed=reservations.changed,
    )
    pods = Informer("pods", watched.pods(kube), _namespaced, {"namespace": lambda pod: [pod.namespace]})
    namespaces = Informer("namespaces", watched.namespaces(kube), lambda found: found.name)

    def pods_of(namespace: str) -> list[Pod]:
        return pods.indexed("namespace", namespace)

    def namespace_labels() -> dict[str, Mapping[str, str]]:
        return {name: found.labels for name, found in namespaces.objects.items()}

    network_services = Informer(
        "services",
        watched.network_services(kube, NetworkService.from_api),
        lambda found: f"{found.namespace}/{found.name}",
        {"namespace": lambda found: [found.namespace]},
    )
    held_slices = Informer(
        "endpointslices",
        watched.endpoint_slices(kube, settings.driver_name, HeldSlice.from_api),
        lambda found: f"{found.namespace}/{found.name}",
        {"namespace": lambda found: [found.namespace]},
    )

    def serves(namespace: str) -> bool:
        """Whether the namespace has a Service over a network, or a slice of ours."""
        return network_services.has("namespace", namespace) or held_slices.has("namespace", namespace)

    endpoints = EndpointsReconciler(
        services,
        pods_of,
        reconciler.current_claims,
        settings.driver_name,
        reconciler.publishable,
        partial(network_services.indexed, "namespace"),
        partial(held_slices.indexed, "namespace"),
        lambda: network_services.values("namespace") | held_slices.values("namespace"),
        backoff=KeyBackoff(endpoints_trigger.fire),
    )
    network_policies: NetworkPoliciesApi = KubePolicies(kube, settings.namespace)
    policy_sources = Informer(
        "policies",
        watched.network_policies(kube),
        lambda found: f"{found.namespace}/{found.name}",
        {"namespace": lambda found: [found.namespace]},
    )
    sources = PolicySources(policy_sources, network_policies)
    rules_maps = Informer("rulesmaps", watched.rules_maps(kube, settings.namespace), lambda found: found.name)
    policies = PolicyReconciler(
        network_policies,
        reconciler.current_claims,
        lambda: list(pods.objects.values()),
        namespace_labels,
        sources.current,
        lambda: rules_maps.objects,
        settings.driver_name,
        reconciler.publishable,
        backoff=KeyBackoff(policies_trigger.fire),
    )

    async def reconciled() -> None:
        await reconciler.reconcile()
        health.set("serving", True)

    def claim_served(claim: Claim) -> bool:
        """A claim's change matters to the slices of its namespace, if it has network Services, and to any
        namespace's if it makes an address reported by two namespaces (or no longer): the pass compares."""
        if not endpoints.namespaces:
            return False
        if serves(claim.namespace):
            endpoints.touch(claim.namespace)
        return True

    def serving(_: object) -> bool:
        """An address given or freed: what may be published changed, for every namespace's slices."""
        if not endpoints.namespaces:
            return False
        endpoints.touch()
        return True

    def policed(_: object) -> bool:
        """Pods, claims and namespaces matter to the policies only while some name a netclaim network."""
        return bool(policies.namespaces_with_policies)

    def pod_changed(before: Pod | None, after: Pod | None) -> None:
        found = after or before
        namespace = found.namespace if found is not None else ""
        if serves(namespace):
            endpoints.touch(namespace)
            endpoints_trigger.fire()
        if policed(None):
            policies_trigger.fire()

    def namespace_changed(before: NamespaceLabels | None, after: NamespaceLabels | None) -> None:
        if policed(None):
            policies_trigger.fire()

    def policy_changed(before: PolicySource | None, after: PolicySource | None) -> None:
        if any(found is not None and found.networks for found in (before, after)):
            policies_trigger.fire()

    def service_or_slice_changed(before: Any, after: Any) -> None:
        endpoints.touch((after or before).namespace)
        endpoints_trigger.fire()

    def rules_map_changed(before: RulesMap | None, after: RulesMap | None) -> None:
        if policies.changed_by_another(before, after):
            policies_trigger.fire()

    async def synced_first(reconcile: Callable[[], Awaitable[None]], *informers: Informer[Any]) -> None:
        """A pass reads the informers only once they hold a whole list: before, a pass would take every
        pod for gone and delete their endpoints and rules."""
        for synced in (pods.synced, namespaces.synced, *(i.synced for i in informers)):
            await synced.wait()
        await reconcile()

    pods.on_change(pod_changed)
    namespaces.on_change(namespace_changed)
    policy_sources.on_change(policy_changed)
    rules_maps.on_change(rules_map_changed)
    network_services.on_change(service_or_slice_changed)
    held_slices.on_change(service_or_slice_changed)

    pools = (trigger, partial(concerns_pools, driver=settings.driver_name))
    supervisor = Supervisor()
    supervisor.keep(
        "reconcile", partial(paced_pass, trigger, reconciled, unpaced=lambda: reconciler.release_seconds)
    )
    supervisor.keep(
        "ippools-watch",
        partial(
            fire_on_changes,
            addresses.ippool_changes,
            (trigger, always),
            (endpoints_trigger, serving),  # which addresses are a pool's: what may be published
            (policies_trigger, policed),
        ),
    )
    allocation_changes = partial(
        reconciler.allocations_seen.follow, addresses.listed_ip_allocations, addresses.ip_allocation_changes
    )
    supervisor.keep(
        "ipallocations-watch",
        partial(
            fire_on_changes,
            allocation_changes,
            (trigger, always),
            (endpoints_trigger, serving),  # an address given or freed: what may be published changed
            (policies_trigger, policed),
        ),
    )
    supervisor.keep(
        "resourceclaims-watch",
        partial(
            fire_on_changes,
            partial(
                reconciler.claims_seen.follow,
                partial(claims.listed_claims, settings.driver_name),
                claims.claim_changes,
            ),
            pools,
            (endpoints_trigger, claim_served),
            (policies_trigger, policed),
        ),
    )
    supervisor.keep("resync", partial(periodic, trigger, settings.resync_seconds))
    supervisor.keep("reservations", reservations.run)
    supervisor.keep("pods-informer", pods.run)
    supervisor.keep("namespaces-informer", namespaces.run)

    def keep_changes_pass(
        name: str,
        pass_trigger: Trigger,
        clock: PassClock,
        reconcile: Callable[[], Awaitable[None]],
        *informers: Informer[Any],
    ) -> None:
        """A pass over what changed, once its informers and the shared ones are synced, and its informers."""
        timed = clock.timed(partial(synced_first, reconcile, *informers))
        supervisor.keep(name, partial(paced_pass, pass_trigger, timed, CHANGES_REST))
        for informer in informers:
            supervisor.keep(f"{informer.kind}-informer", informer.run)

    keep_changes_pass(
        "endpoints", endpoints_trigger, endpoints_clock, endpoints.reconcile, network_services, held_slices
    )
    keep_changes_pass(
        "policies", policies_trigger, policies_clock, policies.reconcile, policy_sources, rules_maps
    )
    supervisor.keep("policies-resync", partial(periodic, policies_trigger, settings.resync_seconds))
    supervisor.keep("endpoints-resync", partial(periodic, endpoints_trigger, settings.resync_seconds))
    try:
        await supervisor.run_until(asyncio.Event())  # until cancelled: the Lease is lost or we stop
    finally:
        await supervisor.stop()


def _namespaced(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"
