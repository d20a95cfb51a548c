"""The publish step: inventory changes, slice events, policy edits and a periodic resync each wake one
comparison of the node's devices with its ResourceSlices (netclaim.agent.publish.publisher writes the
difference). The agent keeps each of these tasks running (netclaim.runtime.supervisor: restarted with backoff
when they fail).

inventory ──changes──▶ Trigger ──▶ link health ──▶ decide (policy, taints) ──▶ publish ──▶ ResourceSlices
slice watch ────────────▲                          (+ whole NICs now inside pods, still this node's devices)
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from netclaim.agent.publish.health import LinkHealth
from netclaim.agent.publish.publisher import SlicePublisher
from netclaim.core.config.publishpolicy import NO_POLICY, PublishPolicy
from netclaim.core.devices.catalog import Device, DeviceCatalog, decide
from netclaim.core.devices.nic import InventorySource
from netclaim.core.devices.rules import load_policy
from netclaim.core.kubeapi import NodeSlicesApi
from netclaim.errors import ConfigError
from netclaim.runtime import metrics
from netclaim.runtime.trigger import Trigger

log = logging.getLogger(__name__)
SETTLE_SECONDS = 0.1  # a burst of netlink events becomes one scan
# Every pod started on the node adds a link there (its veth's host side), and a scan decodes all of the
# node's links: while pods start, scan at most once a second (a 30-pod burst spent 40 % of the agent's
# busy time rescanning). A lone change still publishes within SETTLE_SECONDS.
PASS_INTERVAL_SECONDS = 1.0
RESYNC_SECONDS = 300.0
POLICY_CHECK_SECONDS = 5.0


class PolicyFile:
    """The admin's policy, read again when its file changes (a ConfigMap update swaps the mounted file's
    target): the next publish uses the new rules without a restart. A changed file that does not load
    keeps the last good policy and says why; an absent file is no rule at all. Attached pods are never
    touched by a policy change (a device the new rules no longer offer is only no longer offered)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen = self._stamp()
        # a bad policy at start stops the agent before it touches anything
        self.policy = self._load()
        if path is not None and self._seen is None:
            log.warning(
                "no publish policy yet: nothing is published until the admin creates it",
                extra={"file": str(path)},
            )

    def _load(self) -> PublishPolicy:
        """The file's policy; NO_POLICY while it is absent: the ConfigMap is optional, and the agents run
        before the admin creates it (or after they delete it)."""
        return NO_POLICY if self._seen is None else load_policy(self.path)

    def _stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            info = self.path.stat()  # follows the ConfigMap's ..data symlink
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def changed(self) -> bool:
        """Re-read the file when it changed; True when that gave a new policy."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            policy = self._load()
        except ConfigError as err:
            log.warning(
                "the changed policy does not load; keeping the last good one", extra={"error": str(err)}
            )
            return False
        if policy == self.policy:
            return False
        self.policy = policy
        log.info("policy changed: publishing with the new rules", extra={"file": str(self.path)})
        return True


def publish_trigger() -> Trigger:
    """The trigger of the publish passes: a burst settles, and passes are at least a second apart."""
    return Trigger(settle=SETTLE_SECONDS, interval=PASS_INTERVAL_SECONDS)


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
