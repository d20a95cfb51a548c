"""`netclaim agent`: the node agent. Only wiring: the work is in publish/ and configure/, and every task it
starts is kept running by netclaim.runtime.supervisor.

publish:   inventory ─▶ policy ─▶ devices ─▶ publisher ─▶ ResourceSlices       (netclaim.agent.publish.loop)
configure: kubelet gRPC ─▶ prepare (gather ─▶ plan) ─▶ store ◀─ NRI hooks ─▶ attach ─▶ status
           kubelet gRPC ─▶ unprepare ◀─ reclaim                                (netclaim.configure)
"""

from __future__ import annotations

import logging
import sys
import time
from functools import partial

from netclaim.adapters import kubeletplugin, netlink, nftables, nri, tc
from netclaim.adapters.cni import CniRunner
from netclaim.adapters.http import Health
from netclaim.adapters.http import serve as serve_health
from netclaim.adapters.kube.addresses import KubeAddresses
from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.connection import KubeConnection
from netclaim.adapters.kube.policies import KubePolicyRules
from netclaim.adapters.kube.slices import KubeSlices
from netclaim.adapters.kubeletplugin import KubeletPlugin
from netclaim.agent.claims.gate import CdiGate
from netclaim.agent.claims.gather import Gatherer
from netclaim.agent.claims.metadata import DeviceMetadataFiles
from netclaim.agent.claims.prepare import Preparer
from netclaim.agent.claims.reclaim import Reclaimer
from netclaim.agent.claims.unprepare import Unpreparer
from netclaim.agent.pods.attach import Attacher, PodLocks
from netclaim.agent.pods.check import AttachmentChecker
from netclaim.agent.pods.guard import PortGuard
from netclaim.agent.pods.hooks import PodHooks
from netclaim.agent.pods.lifecycle import NetworkCollector, NetworkGate, PluginReadiness
from netclaim.agent.pods.policy import PolicyEnforcer
from netclaim.agent.publish.health import LinkHealth
from netclaim.agent.publish.inventory import FileInventory, NodeInventory
from netclaim.agent.publish.loop import (
    RESYNC_SECONDS,
    PolicyFile,
    publish_pass,
    publish_trigger,
    watch_inventory,
    watch_policy,
    watch_slices,
)
from netclaim.agent.publish.publisher import SlicePublisher
from netclaim.agent.status import StatusWriter, follow_links
from netclaim.agent.store import Store
from netclaim.core.config.settings import AgentSettings
from netclaim.core.devices.catalog import Device, DeviceCatalog
from netclaim.core.devices.nic import InventorySource
from netclaim.core.ipam.addresses import AddressBook
from netclaim.core.kubeapi import ClaimsApi, NodeSlicesApi, PodAnnotationsApi
from netclaim.core.plan import NodeContext
from netclaim.runtime import metrics
from netclaim.runtime.supervisor import Supervisor
from netclaim.runtime.trigger import periodic

# How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms). The agent's
# threads run CNI plugins, nft and netlink for the NRI hook while its event loop serves prepares: at 5 ms,
# a program run from a thread beside a busy thread took 42 ms at p50 (/bin/true; 0.7 ms alone), at 1 ms 4.9.
THREAD_SWITCH_SECONDS = 0.001

log = logging.getLogger(__name__)
# How long a stopping agent lets pod hooks in flight finish, and then the work they left for later (the undo
# of an ADD out of time, an Event): inside the pod's 30 s grace period.
SETTLE_SECONDS = 10.0


def inventory_source(settings: AgentSettings) -> InventorySource:
    if settings.inventory_file is not None:
        return FileInventory(settings.inventory_file)
    return NodeInventory(netlink, settings.nic_overrides, settings.cni_conf_dir)


def _allowed_plugins(settings: AgentSettings) -> frozenset[str] | None:
    names = frozenset(n.strip() for n in settings.cni_plugins.split(",") if n.strip())
    return names or None


async def _start_configure_path(
    settings: AgentSettings,
    kube: KubeConnection,
    store: Store,
    catalog: DeviceCatalog,
    health: Health,
    supervisor: Supervisor,
) -> tuple[KubeletPlugin | None, PodHooks | None]:
    """kubelet plugin (prepare) and NRI hooks (attach), sharing the store, the locks and the status writer."""
    node, driver = settings.node_name, settings.driver_name
    cni = CniRunner(settings.cni_bin_dirs, _allowed_plugins(settings))
    adapter = KubeClaims(kube)
    claims: ClaimsApi = adapter
    pods: PodAnnotationsApi | None = adapter if settings.network_status_annotation else None
    status = StatusWriter(claims, driver, store, supervisor, pods=pods, links=catalog)
    locks = PodLocks()
    readiness, networks = PluginReadiness(cni, health.set), NetworkGate()
    guard = PortGuard(store, nftables, tc, netlink, supervisor)
    await guard.start()  # before any hook or prepare: every NIC's children held as the rows say
    attacher = Attacher(store, cni, netlink, locks, supervisor, readiness, networks, guard)
    supervisor.keep("cni-gc", NetworkCollector(store, cni, networks, readiness).run)
    if settings.check_seconds:
        checker = AttachmentChecker(store, attacher, locks, status, settings.check_seconds)
        supervisor.keep("cni-check", checker.run)
    supervisor.keep("status-writer", status.run)
    supervisor.keep("link-watch", partial(follow_links, catalog, store, status))
    plugin = hooks = None
    metadata = None
    if settings.device_metadata and settings.cdi_spec_dir is not None:
        data_dir = settings.kubelet_root_dir / "plugins" / driver
        metadata = DeviceMetadataFiles(data_dir, settings.cdi_spec_dir, driver)
    if settings.kubelet_plugin:
        addresses = AddressBook(KubeAddresses(kube), node)
        in_use = [(r.claim_uid, r.plan.interface_name) for r in store.all()]
        gate = CdiGate(settings.cdi_spec_dir, in_use) if settings.cdi_spec_dir is not None else None
        planning = NodeContext(driver, node, catalog.get, settings.host_local_dir, settings.reserved_networks)
        gatherer = Gatherer(claims, addresses, cni, driver)
        preparer = Preparer(store, gatherer, planning, status, gate, metadata, guard)
        unpreparer = Unpreparer(store, attacher, status, gate, metadata)
        supervisor.keep("reclaim", Reclaimer(store, claims, unpreparer).next_round)
        health.expect("kubelet")
        plugin = await kubeletplugin.serve(
            preparer,
            unpreparer,
            catalog,
            settings.kubelet_root_dir,
            driver,
            node,
            lambda ok: health.set("kubelet", ok),
        )
    if settings.nri_socket is not None:
        policies = PolicyEnforcer(
            KubePolicyRules(kube, settings.namespace), store, node, nftables.apply, warn=status.warn_later
        )
        supervisor.keep("policy-rules-watch", policies.watch)
        hooks = PodHooks(store, attacher, status, locks, metadata, policies)
        health.expect("nri")
        nri_plugin = partial(
            nri.run_plugin, settings.nri_socket, hooks, supervisor, on_state=lambda ok: health.set("nri", ok)
        )
        supervisor.keep("nri", nri_plugin)
    return plugin, hooks


async def run(settings: AgentSettings) -> None:
    sys.setswitchinterval(THREAD_SWITCH_SECONDS)
    policy = PolicyFile(settings.policy_file)
    source = inventory_source(settings)
    await source.scan()  # likewise a bad overrides or inventory file
    health = Health()
    health.expect("published")
    http = await serve_health(settings.metrics_address, health)
    kube = KubeConnection.connect(settings.kubeconfig, settings.driver_name)
    node, driver = settings.node_name, settings.driver_name
    slices: NodeSlicesApi = KubeSlices(kube)
    publisher = SlicePublisher(slices, node, driver)
    catalog = DeviceCatalog()
    trigger = publish_trigger()
    configure = settings.kubelet_plugin or settings.nri_socket is not None
    store = Store(settings.state_dir) if configure else None

    def held_devices(present: set[str]) -> list[Device]:
        return store.held_devices(present) if store is not None else []

    log.info("agent starting", extra={"node": node, "driver": driver})
    supervisor = Supervisor()
    published = partial(health.set, "published", True)
    supervisor.keep(
        "publish",
        partial(
            publish_pass, source, policy, publisher, trigger, catalog, held_devices, published, LinkHealth()
        ),
        on_error=metrics.PUBLISH_ERRORS.inc,
    )
    supervisor.keep("inventory-watch", partial(watch_inventory, source, trigger))
    supervisor.keep("slice-watch", partial(watch_slices, slices, node, driver, trigger))
    supervisor.keep("resync", partial(periodic, trigger, RESYNC_SECONDS))
    supervisor.keep("policy-watch", partial(watch_policy, policy, trigger))
    plugin = hooks = None
    if store is not None:
        plugin, hooks = await _start_configure_path(settings, kube, store, catalog, health, supervisor)
    try:
        await supervisor.run_until_stopped()
    finally:
        settled_by = time.monotonic() + SETTLE_SECONDS
        if plugin is not None:
            await plugin.stop()
        if hooks is not None and not await hooks.settle(max(0.0, settled_by - time.monotonic())):
            log.warning("stopping with a pod hook still at work", extra={"waited_s": SETTLE_SECONDS})
        if http is not None:
            http.close()
        await supervisor.stop(grace=max(0.0, settled_by - time.monotonic()))
    if settings.remove_slices_on_exit:
        await publisher.remove_all()
        log.info("removed this node's ResourceSlices")
    if store is not None:
        store.close()
    await kube.close()
    log.info("agent stopped")
