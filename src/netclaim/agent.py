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

from lightkube import AsyncClient
from lightkube.core.client import FieldSelector
from lightkube.resources.resource_v1 import ResourceSlice
from prometheus_client import start_http_server

from netclaim import kube, metrics
from netclaim.devices import decide
from netclaim.inventory import FileInventory, InventorySource, NodeInventory
from netclaim.policy import PublishPolicy, load_policy
from netclaim.publisher import SlicePublisher
from netclaim.settings import AgentSettings

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


async def publish_loop(
    source: InventorySource, policy: PublishPolicy, publisher: SlicePublisher, driver: str, trigger: Trigger
) -> None:
    async def once() -> None:
        await trigger.wait()
        try:
            devices = [d.device for d in decide(await source.scan(), policy, driver) if d.device is not None]
            await publisher.publish(devices)
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


def _serve_metrics(address: str) -> None:
    if not address:
        return
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=metrics.REGISTRY)  # noqa: S104 - admin's choice


async def run(settings: AgentSettings) -> None:
    policy = load_policy(settings.policy_file)  # a bad policy stops the agent before it touches anything
    source = inventory_source(settings)
    await source.scan()  # likewise a bad overrides or inventory file
    _serve_metrics(settings.metrics_address)
    client = kube.client(settings.kubeconfig, settings.driver_name)
    publisher = SlicePublisher(client, settings.node_name, settings.driver_name)
    trigger = Trigger()
    log.info("agent starting", extra={"node": settings.node_name, "driver": settings.driver_name})
    async with _stopping_on_signals() as stop:
        tasks = [
            asyncio.create_task(
                publish_loop(source, policy, publisher, settings.driver_name, trigger), name="publish"
            ),
            asyncio.create_task(watch_inventory(source, trigger), name="inventory-watch"),
            asyncio.create_task(
                watch_slices(client, settings.node_name, settings.driver_name, trigger), name="slice-watch"
            ),
            asyncio.create_task(periodic(trigger, RESYNC_SECONDS), name="resync"),
        ]
        stopper = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in [*tasks, stopper]:
            task.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
        for task in done:
            if task is not stopper and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    if settings.remove_slices_on_exit:
        await publisher.remove_all()
        log.info("removed this node's ResourceSlices")
    await client.close()
    log.info("agent stopped")
