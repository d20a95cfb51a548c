"""`netclaim agent`: the node agent. This module only wires the parts together and supervises them.

inventory ──changes──▶ publish loop ──▶ ResourceSlices      (netclaim.inventory → devices → publisher)
slice watch ─────────▶ (kubelet wiped our slices: publish again)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from lightkube import AsyncClient
from lightkube.core.client import FieldSelector
from lightkube.resources.resource_v1 import ResourceSlice

from netclaim import kube, kubeletplugin, metrics, nri
from netclaim.attach import Attacher, PodLocks
from netclaim.claims import ClaimCache
from netclaim.cni import CniRunner
from netclaim.devices import Device, decide
from netclaim.health import Health
from netclaim.health import serve as serve_health
from netclaim.hooks import PodHooks
from netclaim.inventory import FileInventory, InventorySource, NodeInventory
from netclaim.policy import PublishPolicy, load_policy
from netclaim.prepare import DeviceCatalog, Preparer
from netclaim.publisher import SlicePublisher
from netclaim.settings import AgentSettings
from netclaim.status import StatusWriter
from netclaim.store import State, Store

log = logging.getLogger(__name__)

SETTLE_SECONDS = 0.1  # a burst of netlink events becomes one scan
RESYNC_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 10.0


class Trigger:
    """A coalescing wake-up: many fire() calls before the next wait() make one pass."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        await asyncio.sleep(SETTLE_SECONDS)
        self._event.clear()


def inventory_source(settings: AgentSettings) -> InventorySource:
    if settings.inventory_file is not None:
        return FileInventory(settings.inventory_file)
    return NodeInventory(settings.nic_overrides, settings.cni_conf_dir)


async def _retrying(what: str, attempt: Callable[[], Awaitable[None]], on_error: Callable[[], None]) -> None:
    """Run `attempt` forever; after a failure wait with capped exponential backoff, then go on."""
    backoff = 0.5
    while True:
        try:
            await attempt()
            backoff = 0.5
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a supervised loop logs every failure and carries on
            on_error()
            log.warning("%s failed; retrying in %.1f s", what, backoff, extra={"error": repr(err)})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def held_devices(store: Store | None, present: set[str]) -> list[Device]:
    """Whole NICs now inside pods: gone from the node's netns, still this node's devices (and allocated)."""
    if store is None:
        return []
    return [
        Device.from_record(row.plan["deviceRecord"])
        for row in store.all()
        if not row.plan.get("shared")
        and row.state in (State.ATTACHING, State.ATTACHED)
        and row.device not in present
        and "deviceRecord" in row.plan
    ]


async def publish_loop(
    source: InventorySource,
    policy: PublishPolicy,
    publisher: SlicePublisher,
    driver: str,
    trigger: Trigger,
    catalog: DeviceCatalog,
    store: Store | None,
    health: Health,
) -> None:
    async def once() -> None:
        await trigger.wait()
        try:
            devices = [d.device for d in decide(await source.scan(), policy, driver) if d.device is not None]
            devices += held_devices(store, {d.name for d in devices})
            catalog.update(devices)
            await publisher.publish(devices)
            health.set("published", True)
        except BaseException:
            trigger.fire()  # the next attempt (after the backoff) must publish again
            raise

    await _retrying("publish", once, metrics.PUBLISH_ERRORS.inc)


async def watch_inventory(source: InventorySource, trigger: Trigger) -> None:
    async def once() -> None:
        async for _ in source.changes():
            trigger.fire()

    await _retrying("inventory watch", once, lambda: None)


async def watch_slices(client: AsyncClient, node: str, driver: str, trigger: Trigger) -> None:
    """Kubelet deletes a node's slices at its start and 30 s after our plugin went away: publish again."""

    async def once() -> None:
        trigger.fire()  # (re)connected: whatever happened meanwhile, compare once
        selector: FieldSelector = {"spec.nodeName": node, "spec.driver": driver}
        async for event, _ in client.watch(ResourceSlice, fields=selector):
            if event in ("DELETED", "MODIFIED", "ADDED"):
                trigger.fire()

    await _retrying("slice watch", once, lambda: None)


async def periodic(trigger: Trigger, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        trigger.fire()


@contextlib.asynccontextmanager
async def _stopping_on_signals() -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _until(event: asyncio.Event) -> None:
    await event.wait()


def _allowed_plugins(settings: AgentSettings) -> frozenset[str] | None:
    names = frozenset(n.strip() for n in settings.cni_plugins.split(",") if n.strip())
    return names or None


async def _start_configure_path(
    settings: AgentSettings, client: AsyncClient, store: Store, catalog: DeviceCatalog, health: Health
) -> tuple[list[asyncio.Task[None]], list[grpc.aio.Server]]:
    """kubelet plugin (prepare) and NRI hooks (attach), sharing the store, the locks and the status writer."""
    node, driver = settings.node_name, settings.driver_name
    cni = CniRunner(settings.cni_bin_dir, _allowed_plugins(settings), ipam_data_dir=settings.ipam_data_dir)
    status = StatusWriter(client, driver, store)
    locks = PodLocks()
    attacher = Attacher(store, cni, locks)
    claims = ClaimCache(client, driver, node)
    tasks = [
        asyncio.create_task(status.run(), name="status-writer"),
        asyncio.create_task(claims.run(), name="claim-cache"),
    ]
    servers: list[grpc.aio.Server] = []
    if settings.kubelet_plugin:
        preparer = Preparer(
            driver=driver,
            node=node,
            claims=claims,
            store=store,
            catalog=catalog,
            cni=cni,
            attacher=attacher,
            status=status,
            locks=locks,
        )
        health.expect("kubelet")
        servers = list(await kubeletplugin.serve(preparer, settings.kubelet_root_dir, driver, health))
    if settings.nri_socket is not None:
        hooks = PodHooks(store, attacher, status, locks)
        health.expect("nri")
        nri_task = nri.run_plugin(settings.nri_socket, hooks, on_state=lambda ok: health.set("nri", ok))
        tasks.append(asyncio.create_task(nri_task, name="nri"))
    return tasks, servers


async def run(settings: AgentSettings) -> None:
    policy = load_policy(settings.policy_file)  # a bad policy stops the agent before it touches anything
    source = inventory_source(settings)
    await source.scan()  # likewise a bad overrides or inventory file
    health = Health()
    health.expect("published")
    http = await serve_health(settings.metrics_address, health)
    client = kube.client(settings.kubeconfig, settings.driver_name)
    node, driver = settings.node_name, settings.driver_name
    publisher = SlicePublisher(client, node, driver)
    catalog = DeviceCatalog()
    trigger = Trigger()
    configure = settings.kubelet_plugin or settings.nri_socket is not None
    store = Store(settings.state_dir) if configure else None
    log.info("agent starting", extra={"node": node, "driver": driver})
    tasks = [
        asyncio.create_task(
            publish_loop(source, policy, publisher, driver, trigger, catalog, store, health), name="publish"
        ),
        asyncio.create_task(watch_inventory(source, trigger), name="inventory-watch"),
        asyncio.create_task(watch_slices(client, node, driver, trigger), name="slice-watch"),
        asyncio.create_task(periodic(trigger, RESYNC_SECONDS), name="resync"),
    ]
    servers: list[grpc.aio.Server] = []
    if store is not None:
        configure_tasks, servers = await _start_configure_path(settings, client, store, catalog, health)
        tasks += configure_tasks
    try:
        async with _stopping_on_signals() as stop:
            stopper = asyncio.create_task(_until(stop), name="stop")
            tasks.append(stopper)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopper}:  # the loops run forever: an end is a bug worth stopping for
                raise task.exception() or RuntimeError(f"{task.get_name()} ended unexpectedly")
    finally:
        registration, _ = kubeletplugin.socket_paths(settings.kubelet_root_dir, driver)
        if servers:
            registration.unlink(missing_ok=True)  # kubelet deregisters us at once
        for server in servers:
            await server.stop(grace=2)
        if http is not None:
            http.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if settings.remove_slices_on_exit:
        await publisher.remove_all()
        log.info("removed this node's ResourceSlices")
    if store is not None:
        store.close()
    await client.close()
    log.info("agent stopped")
