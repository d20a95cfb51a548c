"""The publish step: inventory changes, slice events, policy edits and a periodic resync each wake one
comparison of the node's devices with its ResourceSlices (netclaim.publish.publisher writes the difference).
The agent keeps each of these tasks running (netclaim.supervisor: restarted with backoff when they fail).

inventory ──changes──▶ Trigger ──▶ link health ──▶ decide (policy, taints) ──▶ publish ──▶ ResourceSlices
slice watch ────────────▲                          (+ whole NICs now inside pods, still this node's devices)
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable

from netclaim import metrics
from netclaim.kubeapi import NodeSlicesApi
from netclaim.publish.devices import Device, DeviceCatalog, decide
from netclaim.publish.health import LinkHealth
from netclaim.publish.inventory import InventorySource
from netclaim.publish.policy import PolicyFile
from netclaim.publish.publisher import SlicePublisher

SETTLE_SECONDS = 0.1  # a burst of netlink events becomes one scan
# Every pod started on the node adds a link there (its veth's host side), and a scan decodes all of the
# node's links: while pods start, scan at most once a second (a 30-pod burst spent 40 % of the agent's
# busy time rescanning). A lone change still publishes within SETTLE_SECONDS.
PASS_INTERVAL_SECONDS = 1.0
RESYNC_SECONDS = 300.0
POLICY_CHECK_SECONDS = 5.0


class Trigger:
    """A coalescing wake-up: many fire() calls before the next wait() make one pass. A fire that says
    `compare=False` (a change on the node only) lets the pass leave the API alone when the devices it finds
    are those it last published; any other fire makes the pass compare them with the slices."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._last_pass = -math.inf
        self._compare = False

    def fire(self, compare: bool = True) -> None:
        self._compare = self._compare or compare
        self._event.set()

    async def wait(self) -> bool:
        """Whether the pass must compare with the slices."""
        await self._event.wait()
        now = asyncio.get_running_loop().time()
        await asyncio.sleep(max(SETTLE_SECONDS, self._last_pass + PASS_INTERVAL_SECONDS - now))
        self._event.clear()
        self._last_pass = asyncio.get_running_loop().time()
        compare, self._compare = self._compare, False
        return compare


async def publish_pass(
    source: InventorySource,
    policy: PolicyFile,
    publisher: SlicePublisher,
    trigger: Trigger,
    catalog: DeviceCatalog,
    held_devices: Callable[[set[str]], list[Device]],
    on_published: Callable[[], None],
    link_health: LinkHealth,
) -> None:
    """Wait for the trigger, then make the slices hold the node's devices. `held_devices(present names)`:
    whole NICs now inside pods, published while they are away. A pass that fails fires the trigger again:
    the next one (after the supervisor's backoff) must publish, whatever fires meanwhile. A pass woken
    only by the node's own changes (every pod's veth is one) reads no slice when the devices are those it
    last published. A link back from down is looked at again once it may have settled."""
    compare = await trigger.wait()
    try:
        interfaces = await source.scan()
        settle_in = link_health.observe(interfaces)
        if settle_in is not None:
            asyncio.get_running_loop().call_later(settle_in, trigger.fire, False)
        scanned = decide(interfaces, policy.policy, publisher.driver, link_health.down)
        devices = [d.device for d in scanned if d.device is not None]
        _count_links(devices, link_health)
        held = held_devices({d.name for d in devices})
        devices += held
        catalog.update(devices, inside_pods={d.name for d in held})
        if compare or publisher.changed(devices):
            await publisher.publish(devices)
        on_published()
    except BaseException:
        trigger.fire()
        raise


def _count_links(devices: list[Device], link_health: LinkHealth) -> None:
    metrics.NIC_LINK_UP.clear()
    effects: Counter[str] = Counter()
    for device in devices:
        metrics.NIC_LINK_UP.labels(device.name).set(0 if device.if_name in link_health.down else 1)
        effects.update(t.effect for t in device.taints)
    for effect in ("NoSchedule", "NoExecute"):
        metrics.TAINTED_DEVICES.labels(effect).set(effects[effect])


async def watch_inventory(source: InventorySource, trigger: Trigger) -> None:
    """Fire at each change of the inventory, until its stream of changes ends."""
    async for _ in source.changes():
        trigger.fire(compare=False)


async def watch_slices(api: NodeSlicesApi, node: str, driver: str, trigger: Trigger) -> None:
    """Kubelet deletes a node's slices at its start and 30 s after our plugin went away: publish again.
    Fires once connected (whatever happened meanwhile, compare once), then at each event of the watch."""
    trigger.fire()
    async for _ in api.slice_changes(node, driver):
        trigger.fire()


async def watch_policy(policy: PolicyFile, trigger: Trigger, seconds: float = POLICY_CHECK_SECONDS) -> None:
    """A policy edited in its ConfigMap reaches the file within kubelet's sync period (≤ 1 min by
    default); checking the file every few seconds adds little to that."""
    while True:
        await asyncio.sleep(seconds)
        if policy.changed():
            trigger.fire()


async def periodic(trigger: Trigger, seconds: float = RESYNC_SECONDS) -> None:
    while True:
        await asyncio.sleep(seconds)
        trigger.fire()
