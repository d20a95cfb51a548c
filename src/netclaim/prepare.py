"""NodePrepareResources/NodeUnprepareResources: claim → validated, rendered attach plans in the store.

Prepare does all the slow, fallible work ahead of the pod's sandbox: decode the configs (DeviceClass
first, then claim), merge them, fill placeholders from the allocated device, check the plugins exist
and speak a common CNI version, then persist one row per allocated device. RunPodSandbox only carries
out a stored plan. Both calls are idempotent; a claim's failure is reported for that claim only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from lightkube.resources.resource_v1 import ResourceClaim

from netclaim import faults
from netclaim.attach import Attacher, PodLocks
from netclaim.claims import ClaimCache
from netclaim.cni import CniRunner, plugin_types
from netclaim.config import EffectiveConfig, SourcedConfig, decode, merge
from netclaim.devices import BANDWIDTH, Device
from netclaim.errors import ConfigError, NetclaimError
from netclaim.placeholders import ScalarValue, render
from netclaim.quantity import parse_quantity
from netclaim.status import ClaimRef, Failure, StatusWriter
from netclaim.store import Attachment, State, Store

log = logging.getLogger(__name__)

# CNI fields that name a host interface; a user's config may only point them at the allocated device.
HOST_INTERFACE_FIELDS = ("master", "device")


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None


class DeviceCatalog:
    """The devices this node publishes now, by name (what placeholders are filled from)."""

    def __init__(self) -> None:
        self._devices: dict[str, Device] = {}

    def update(self, devices: list[Device]) -> None:
        self._devices = {d.name: d for d in devices}

    def get(self, name: str) -> Device | None:
        return self._devices.get(name)


class Preparer:
    def __init__(
        self,
        *,
        driver: str,
        node: str,
        claims: ClaimCache,
        store: Store,
        catalog: DeviceCatalog,
        cni: CniRunner,
        attacher: Attacher,
        status: StatusWriter,
        locks: PodLocks,
    ) -> None:
        self.driver = driver
        self.node = node
        self.claims = claims
        self.store = store
        self.catalog = catalog
        self.cni = cni
        self.attacher = attacher
        self.status = status
        self.locks = locks

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        existing = self.store.for_claim(uid)
        if existing:  # idempotent: kubelet asks again after a restart or a lost answer
            return [PreparedDevice(r.request, r.pool, r.device, r.share_id or None) for r in existing]
        started = time.monotonic()
        claim = await self.claims.get(namespace, name, uid)
        rows = await self._plan(claim)
        self.store.put(*rows)
        faults.point("after-prepare")
        self.status.enqueue(ClaimRef(namespace, name, uid))
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        devices = [r.device for r in rows]
        log.info("prepared", extra={"claim": f"{namespace}/{name}", "devices": devices, "ms": elapsed_ms})
        return [PreparedDevice(r.request, r.pool, r.device, r.share_id or None) for r in rows]

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None:
        """A claim that cannot be prepared: Ready=False on its devices and a Warning Event on its pod."""
        try:
            claim = await self.claims.get(namespace, name, uid)
        except NetclaimError:
            return
        assert claim.status is not None
        allocation = claim.status.allocation
        results = [
            r
            for r in (allocation.devices.results or [] if allocation and allocation.devices else [])
            if r.driver == self.driver and r.pool == self.node
        ]
        devices = tuple((r.pool, r.device, r.shareID or "") for r in results)
        self.status.fail(ClaimRef(namespace, name, uid), Failure(devices, "PrepareFailed", message))
        for pod in (r for r in claim.status.reservedFor or [] if r.resource == "pods"):
            await self.status.warn(namespace, pod.name, pod.uid, "NetclaimPrepareFailed", message)

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Make sure every interface of the claim was DELeted (IPAM released), then forget the claim."""
        rows = self.store.for_claim(uid)
        faults.point("before-unprepare")
        deadline = time.monotonic() + 10.0
        for row in rows:
            async with self.locks(row.pod_uid):
                current = next((r for r in self.store.for_claim(uid) if r.key == row.key), None)
                if current is not None:
                    await self.attacher.detach(current, deadline)
                    self.store.delete(current)
            self.locks.forget(row.pod_uid)
        self.status.forget(ClaimRef(namespace, name, uid))
        log.info("unprepared", extra={"claim": f"{namespace}/{name}", "devices": [r.device for r in rows]})

    async def _plan(self, claim: ResourceClaim) -> list[Attachment]:
        assert claim.metadata is not None and claim.status is not None
        meta, allocation = claim.metadata, claim.status.allocation
        where = f"claim {meta.namespace}/{meta.name}"
        if allocation is None or allocation.devices is None:
            raise ConfigError(f"{where} is not allocated")
        pods = [r for r in claim.status.reservedFor or [] if r.resource == "pods"]
        if len(pods) != 1:
            raise ConfigError(
                f"{where} is reserved for {len(pods)} pods; a netclaim.dev claim configures one "
                "pod's interface: use a ResourceClaimTemplate per pod"
            )
        results = [r for r in allocation.devices.results or [] if r.driver == self.driver]
        rows: list[Attachment] = []
        interface_names: dict[str, str] = {}
        for result in results:
            if result.pool != self.node:
                raise ConfigError(f"{where}: device {result.pool}/{result.device} is not on node {self.node}")
            effective = merge(self._configs(claim, result.request), result.request)
            plan = await self._render(claim, result, effective)
            other = interface_names.setdefault(effective.interface_name, result.request)
            if other != result.request:
                raise ConfigError(
                    f"{where}: requests {other} and {result.request} both name interface "
                    f"{effective.interface_name}; give each an interfaceName"
                )
            rows.append(
                Attachment(
                    claim_uid=str(meta.uid),
                    pool=result.pool,
                    device=result.device,
                    share_id=result.shareID or "",
                    claim_namespace=str(meta.namespace),
                    claim_name=str(meta.name),
                    request=result.request,
                    pod_uid=str(pods[0].uid),
                    plan=plan,
                    state=State.PREPARED,
                )
            )
        return rows

    def _configs(self, claim: ResourceClaim, request: str) -> list[SourcedConfig]:
        assert claim.status is not None and claim.status.allocation is not None
        assert claim.metadata is not None and claim.status.allocation.devices is not None
        configs = []
        parent = request.split("/")[0]
        for index, entry in enumerate(claim.status.allocation.devices.config or []):
            if entry.opaque is None or entry.opaque.driver != self.driver:
                continue
            if entry.requests and request not in entry.requests and parent not in entry.requests:
                continue
            owner = (
                "DeviceClass config"
                if entry.source == "FromClass"
                else f"claim {claim.metadata.namespace}/{claim.metadata.name}"
            )
            location = f"{owner} (allocation config[{index}]).opaque.parameters"
            configs.append(SourcedConfig(decode(entry.opaque.parameters, location), entry.source, location))
        return configs

    async def _render(self, claim: ResourceClaim, result: Any, effective: EffectiveConfig) -> dict[str, Any]:
        assert claim.metadata is not None
        device = self.catalog.get(result.device)
        if device is None:
            raise ConfigError(f"device {result.device} is not published by this node (any more)")
        consumed = (result.consumedCapacity or {}).get(BANDWIDTH)
        values: dict[str, ScalarValue] = {
            "device.name": device.name,
            "device.pool": self.node,
            "node.name": self.node,
            "claim.name": str(claim.metadata.name),
            "claim.namespace": str(claim.metadata.namespace),
            "claim.uid": str(claim.metadata.uid),
            "request": result.request,
        }
        if consumed is not None:
            values["consumed.bandwidth"] = int(parse_quantity(consumed))
        for key, value in device.attributes.items():
            values[f"device.{key.rsplit('/', 1)[-1]}"] = value
        conflist = render(effective.cni, values, "config")
        if not effective.cni_from_admin:
            check_host_reach(conflist, device.if_name)
        for kind in plugin_types(conflist):
            self.cni.plugin_path(kind)  # missing or forbidden plugins fail here, not in the pod's sandbox
        conflist = await self.cni.negotiate(self.cni.with_node_defaults(conflist))
        return {
            "interfaceName": effective.interface_name,
            "conflist": conflist,
            "bandwidth": int(parse_quantity(consumed))
            if consumed and effective.bandwidth == "enforce"
            else None,
            "shared": device.shared,
            "deviceRecord": device.to_record(),
            "host": {
                "ifName": device.if_name,
                "mtu": device.attributes.get("netclaim.dev/mtu"),
                "mac": device.attributes.get("netclaim.dev/mac"),
            },
        }


def check_host_reach(conflist: dict[str, Any], if_name: str) -> None:
    """A user's CNI config must not reach for host interfaces other than the allocated one (`if_name`), nor
    choose where IPAM writes on the node."""
    for index, plugin in enumerate(conflist["plugins"]):
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and "dataDir" in ipam:
            raise ConfigError(
                f"config.plugins[{index}].ipam.dataDir: only the DeviceClass (admin) config may choose "
                "where IPAM keeps its state on the node"
            )
        for key in HOST_INTERFACE_FIELDS:
            value = plugin.get(key)
            if value is not None and value != if_name:
                raise ConfigError(
                    f"config.plugins[{index}].{key}: {value!r} is not the allocated device's "
                    f"interface {if_name!r}; only the DeviceClass (admin) config may name other "
                    "host interfaces (use {{ device.ifName }})"
                )
