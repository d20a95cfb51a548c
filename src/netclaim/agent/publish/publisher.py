"""ResourceSlices of one node's pool: the node's devices, through the one slice writer.

Pool name = node name; slices `<node>-<driver>-<index>`, owned by the Node (netclaim.core.devices.slices has
the rules: written only when their content must change, a new generation for any change, parallel).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from netclaim.core.devices.catalog import Device
from netclaim.core.devices.slices import ApiDevice, DroppedFields, SliceOwner, SliceWriter
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import NodeSlicesApi
from netclaim.core.objects import condition
from netclaim.errors import NetclaimError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
# the Node's condition saying whether it does (True) or keeps all (False), as node-problem-detector's say
DROPPED_CONDITION = "NetclaimSliceFieldsDropped"


class SlicePublisher:
    def __init__(self, api: NodeSlicesApi, node: str, driver: str) -> None:
        self.node = node
        self.driver = driver
        owner = SliceOwner("v1", "Node", node, partial(api.node_uid, node), controller=True)

        async def on_node(report: DroppedFields) -> None:
            """An Event when a field is dropped for the first time (best effort: the condition says it
            too), then the Node's condition (a failure is tried again after the next write)."""
            if report.new:
                try:
                    uid = await api.node_uid(node)
                    await api.create_node_event(node, uid, EventReason.FIELDS_DROPPED, report.message)
                except NetclaimError as err:
                    log.info("could not record the dropped fields as an Event", extra={"error": str(err)})
            status, reason = ("True", "GateOff") if report.fields else ("False", "AllFieldsKept")
            await api.set_node_condition(
                node, condition(status, reason, report.message, kind=DROPPED_CONDITION)
            )

        self.slices = SliceWriter(api, driver, node, f"{node}-{driver}", owner, node=node, on_dropped=on_node)
        self._published: list[ApiDevice] | None = None  # what the last publish made the slices hold

    def changed(self, devices: list[Device]) -> bool:
        """Whether `devices` differ from what the last publish made the slices hold."""
        return [d.to_api() for d in devices] != self._published

    async def publish(self, devices: list[Device]) -> int:
        """Make the pool hold exactly `devices`; returns how many API writes that took (0 when current)."""
        started = time.monotonic()
        metrics.PUBLISHED_DEVICES.set(len(devices))
        wanted = [d.to_api() for d in devices]
        self._published = None  # until the write below is known to have landed
        writes = await self.slices.write(wanted)
        self._published = wanted
        if writes:
            metrics.PUBLISH_SECONDS.observe(time.monotonic() - started)
        metrics.LAST_PUBLISH.set_to_current_time()
        return writes

    async def remove_all(self) -> None:
        self._published = None
        await self.slices.remove_all()
