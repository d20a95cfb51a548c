"""Small fakes of the adapters for unit tests of publish/ and configure/ (the real ones: tests/cluster)."""

from __future__ import annotations

import asyncio
import copy
import ipaddress
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from netclaim.core.kubeapi import (
    AddressesApi,
    ClaimsApi,
    ClusterClaimsApi,
    IPPoolsApi,
    Listed,
    NodeSlicesApi,
    PoolParamsApi,
    PoolSlicesApi,
)
from netclaim.core.objects import Claim, IPAllocation, Pod, Slice
from netclaim.errors import AlreadyExistsError, ConfigError, ConflictError, GoneError, NetclaimError


@dataclass
class Event:
    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str
    warning: bool = True


@dataclass
class FakeKubeApi(
    ClaimsApi, ClusterClaimsApi, NodeSlicesApi, PoolSlicesApi, AddressesApi, IPPoolsApi, PoolParamsApi
):
    """An in-memory API server playing every role the core asks of it, both programs' (netclaim.core.kubeapi):
    pass it as each of them. `fail_next` raises errors before calls; each item put on `slice_events` is an
    event of every watch but the claims' and IPAllocations': each (type, object) put on `claim_events` or
    `allocation_events` is one of theirs. Lists are at resourceVersion "1" (held lists: `list_version`)."""

    claims: dict[tuple[str, str], Claim] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    node_uids: dict[str, str] = field(default_factory=dict)
    crd_uids: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail_next: list[NetclaimError] = field(default_factory=list)
    slice_events: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    claim_events: asyncio.Queue[tuple[str, Claim]] = field(default_factory=asyncio.Queue)
    allocation_events: asyncio.Queue[tuple[str, IPAllocation]] = field(default_factory=asyncio.Queue)
    ippools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → the object as the API has it
    ippool_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocations: dict[str, IPAllocation] = field(default_factory=dict)  # name → object (uid set)
    pods: list[dict[str, Any]] = field(default_factory=list)  # unschedulable pods, as the API has them
    pod_objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (ns, name) → its JSON
    device_classes: set[str] = field(default_factory=set)
    pool_params: dict[str, tuple[dict[str, str], str]] = field(default_factory=dict)  # name → data, owner UID
    # fields of a slice's devices this API server drops, as one with a feature gate off does
    # (netclaim.core.devices.slices.GATED_FIELDS)
    drops: frozenset[str] = frozenset()
    node_events: list[tuple[str, str, str, str]] = field(default_factory=list)  # node, uid, reason, message
    node_conditions: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # each one set, in order
    list_version: str | None = "1"  # the resourceVersion of the claims' held lists (None: unreadable)
    not_yet_listed: set[str] = field(
        default_factory=set
    )  # IPAllocations a held list leaves out (a cache behind)
    _uids: int = 0

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_next:
            raise self.fail_next.pop(0)

    def add_claim(self, claim: Claim) -> None:
        self.claims[(claim.namespace, claim.name)] = claim

    async def get_claim(self, namespace: str, name: str) -> Claim:
        self._call("get_claim")
        found = self.claims.get((namespace, name))
        if found is None:
            raise GoneError(f"claim {namespace}/{name}: not found")
        return found

    async def write_claim_devices(
        self, claim: Claim, driver: str, entries: list[dict[str, Any]]
    ) -> str | None:
        self._call("write_claim_devices")
        current = self.claims.get((claim.namespace, claim.name))
        if current is None:
            raise GoneError(f"claim {claim.namespace}/{claim.name}: not found")
        if current.resource_version != claim.resource_version:
            raise ConflictError(f"claim {claim.namespace}/{claim.name}: test failed")
        others = [d for d in current.devices_status if d.get("driver") != driver]
        written = replace(
            current,
            devices_status=(*others, *copy.deepcopy(entries)),
            resource_version=str(int(current.resource_version or "0") + 1),
        )
        self.claims[(claim.namespace, claim.name)] = written
        return written.resource_version

    async def get_pod(self, namespace: str, name: str) -> Pod:
        self._call("get_pod")
        found = self.pod_objects.get((namespace, name))
        if found is None:
            raise GoneError(f"pod {namespace}/{name}: not found")
        return Pod.from_api(copy.deepcopy(found))

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        self._call("write_pod_annotation")
        current = self.pod_objects[(pod.namespace, pod.name)]["metadata"]
        if current["resourceVersion"] != pod.resource_version:
            raise ConflictError(f"pod {pod.namespace}/{pod.name}: the object has been modified")
        current.setdefault("annotations", {})[key] = value
        current["resourceVersion"] = str(int(current["resourceVersion"]) + 1)

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: str, message: str, warning: bool = True
    ) -> None:
        self._call("create_pod_event")
        self.events.append(Event(namespace, pod, pod_uid, reason, message, warning))

    async def node_uid(self, node: str) -> str:
        self._call("node_uid")
        return self.node_uids.setdefault(node, f"uid-{node}")

    async def list_slices(self, driver: str, pool: str, node: str | None = None) -> list[Slice]:
        self._call("list_slices")
        return [
            Slice.from_api(copy.deepcopy(body))
            for _, body in sorted(self.slices.items())
            if body["spec"]["driver"] == driver
            and body["spec"]["pool"]["name"] == pool
            and (node is None or body["spec"].get("nodeName") == node)
        ]

    async def apply_slice(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        self._call("apply_slice")
        stored = copy.deepcopy(body)
        for device in stored["spec"]["devices"]:
            for dropped in self.drops & {"allowMultipleAllocations", "taints"}:
                device.pop(dropped, None)
            if "capacity.requestPolicy" in self.drops:
                for entry in (device.get("capacity") or {}).values():
                    entry.pop("requestPolicy", None)
        self.slices[body["metadata"]["name"]] = stored
        return copy.deepcopy(stored["spec"]["devices"])

    async def create_node_event(self, node: str, node_uid: str, reason: str, message: str) -> None:
        self._call("create_node_event")
        self.node_events.append((node, node_uid, reason, message))

    async def set_node_condition(self, node: str, condition: dict[str, str]) -> None:
        self._call("set_node_condition")
        self.node_conditions.append((node, condition))

    async def delete_slice(self, name: str) -> None:
        self._call("delete_slice")
        self.slices.pop(name, None)

    async def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        async for event in self._changes("slice_changes"):
            yield event

    async def claim_changes(self, since: str | None = None) -> AsyncIterator[tuple[str, Claim]]:
        self._call("claim_changes")
        while True:
            yield await self.claim_events.get()

    async def ippool_changes(self) -> AsyncIterator[str]:
        async for event in self._changes("ippool_changes"):
            yield event

    async def ip_allocation_changes(
        self, since: str | None = None
    ) -> AsyncIterator[tuple[str, IPAllocation]]:
        self._call("ip_allocation_changes")
        while True:
            yield await self.allocation_events.get()

    async def _changes(self, name: str) -> AsyncIterator[str]:
        self._call(name)
        while True:
            yield await self.slice_events.get()

    async def list_pool_params(self) -> dict[str, dict[str, str]]:
        self._call("list_pool_params")
        return {name: dict(data) for name, (data, _) in self.pool_params.items()}

    async def apply_pool_params(self, name: str, data: dict[str, str], pool: str, pool_uid: str) -> None:
        self._call("apply_pool_params")
        self.pool_params[name] = (dict(data), pool_uid)

    async def delete_pool_params(self, name: str) -> None:
        self._call("delete_pool_params")
        self.pool_params.pop(name, None)

    async def device_class_exists(self, name: str) -> bool:
        self._call("device_class_exists")
        return name in self.device_classes

    async def crd_uid(self, name: str) -> str:
        self._call("crd_uid")
        return self.crd_uids.setdefault(name, f"uid-of-{name}")

    def add_pool(self, name: str, spec: dict[str, Any]) -> None:
        self.ippools[name] = {
            "apiVersion": "netclaim.dev/v1alpha1",
            "kind": "IPPool",
            "metadata": {"name": name, "uid": f"uid-of-pool-{name}"},
            "spec": spec,
        }

    async def get_ippool(self, name: str) -> dict[str, Any]:
        self._call("get_ippool")
        if name not in self.ippools:
            raise GoneError(f"IPPool {name}: not found")
        return copy.deepcopy(self.ippools[name])

    async def list_ippools(self, *, cached: bool = False) -> list[dict[str, Any]]:
        self._call("list_ippools (cached)" if cached else "list_ippools")
        return [copy.deepcopy(p) for _, p in sorted(self.ippools.items())]

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        self._call("write_ippool_status")
        self.ippool_status[name] = copy.deepcopy(status)
        if name in self.ippools:  # the status subresource, as the API keeps it with the object
            self.ippools[name]["status"] = copy.deepcopy(status)

    async def list_ip_allocations(
        self, *, pool: str | None = None, claim_uid: str | None = None
    ) -> list[IPAllocation]:
        self._call("list_ip_allocations")
        return [
            a
            for _, a in sorted(self.allocations.items())
            if (pool is None or a.pool == pool) and (claim_uid is None or a.claim_uid == claim_uid)
        ]

    async def listed_ip_allocations(self) -> Listed[IPAllocation]:
        return Listed(await self.list_ip_allocations(), "1")

    async def held_ip_allocations(self, claim_uid: str, not_older_than: str | None) -> Listed[IPAllocation]:
        self._call(f"held_ip_allocations {not_older_than}" if not_older_than else "held_ip_allocations")
        held = [
            a
            for name, a in sorted(self.allocations.items())
            if a.claim_uid == claim_uid and name not in self.not_yet_listed
        ]
        return Listed(held, self.list_version)

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        self._call("get_ip_allocation")
        if name not in self.allocations:
            raise GoneError(f"IPAllocation {name}: not found")
        return self.allocations[name]

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        self._call("create_ip_allocation")
        if allocation.name in self.allocations:
            raise AlreadyExistsError(f"IPAllocation {allocation.name}: already exists")
        self._uids += 1
        created = replace(allocation, uid=f"alloc-uid-{self._uids}")
        self.allocations[allocation.name] = created
        return created

    async def mark_released(self, allocation: IPAllocation, when: str) -> None:
        self._call("mark_released")
        current = self.allocations.get(allocation.name)
        if current is None or current.uid != allocation.uid:
            raise ConflictError(f"IPAllocation {allocation.name}: Precondition failed: UID")
        self.allocations[allocation.name] = replace(current, released_at=when)

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        self._call("delete_ip_allocation")
        current = self.allocations.get(allocation.name)
        if current is None:
            return
        if current.uid != allocation.uid:
            raise ConflictError(f"IPAllocation {allocation.name}: Precondition failed: UID")
        del self.allocations[allocation.name]

    async def list_claims(self, driver: str | None = None) -> list[Claim]:
        self._call("list_claims")
        return [c.compact(driver) if driver else c for c in self.claims.values()]

    async def listed_claims(self, driver: str | None = None) -> Listed[Claim]:
        return Listed(await self.list_claims(driver), "1")

    async def unschedulable_pods(self) -> list[Pod]:
        self._call("unschedulable_pods")
        return [Pod.from_api(copy.deepcopy(p)) for p in self.pods]


# --- publish/ fakes: an inventory source, and netlink as netclaim.agent.publish.inventory calls it
# ---------------


from netclaim.core.devices.nic import NetworkInterface  # noqa: E402
from netclaim.core.node import Link, LinkChange  # noqa: E402


@dataclass
class FakeInventory:
    """An InventorySource in memory: `scan` returns `interfaces` (or raises what `fail_next` holds first);
    each item put on `change_events` is one burst of changes yielded by `changes`."""

    interfaces: list[NetworkInterface] = field(default_factory=list)
    fail_next: list[Exception] = field(default_factory=list)
    change_events: asyncio.Queue[None] = field(default_factory=asyncio.Queue)
    scans: int = 0

    async def scan(self) -> list[NetworkInterface]:
        self.scans += 1
        if self.fail_next:
            raise self.fail_next.pop(0)
        return list(self.interfaces)

    async def changes(self) -> AsyncIterator[None]:
        while True:
            await self.change_events.get()
            yield None


@dataclass
class FakeNetlink:
    """The node's links as the inventory reads them (netclaim.core.node.NodeLinks): links, addresses and
    default routes from these fields; `batches` feeds link_events().next_batch()."""

    known_links: list[Link] = field(default_factory=list)
    known_addresses: dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = field(
        default_factory=dict
    )
    default_route: set[int] = field(default_factory=set)
    batches: asyncio.Queue[list[LinkChange]] = field(default_factory=asyncio.Queue)
    subscriptions: list[str] = field(default_factory=list)  # "open" / "close" of each LinkEvents
    quieted: int = 0  # link events dropped before decoding

    async def links(self, netns: str | None = None) -> list[Link]:
        return list(self.known_links)

    async def addresses(
        self, netns: str | None = None
    ) -> dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]:
        return {index: list(found) for index, found in self.known_addresses.items()}

    async def default_route_interfaces(self, netns: str | None = None) -> set[int]:
        return set(self.default_route)

    def link_events(self, quiet: Callable[[int], bool] | None = None) -> FakeLinkEvents:
        return FakeLinkEvents(self, quiet)


class FakeLinkEvents:
    """As the adapter: the events of a link `quiet` names but its RTM_DELLINK are dropped (and counted in
    `netlink.quieted`)."""

    def __init__(self, netlink: FakeNetlink, quiet: Callable[[int], bool] | None) -> None:
        self.netlink = netlink
        self.quiet = quiet

    async def __aenter__(self) -> FakeLinkEvents:
        self.netlink.subscriptions.append("open")
        return self

    async def __aexit__(self, *_: object) -> None:
        self.netlink.subscriptions.append("close")

    async def next_batch(self) -> list[LinkChange]:
        batch = await self.netlink.batches.get()
        passed = [c for c in batch if not (c.event != "RTM_DELLINK" and self.quiet and self.quiet(c.index))]
        self.netlink.quieted += len(batch) - len(passed)
        return passed


# --- configure/ fakes: CNI plugins and pods' network namespaces in memory; sample devices, claims, rows ---

import contextlib  # noqa: E402
from pathlib import Path  # noqa: E402

from netclaim.adapters.cni import CniRunner  # noqa: E402
from netclaim.agent.claims.gather import Gatherer  # noqa: E402
from netclaim.agent.claims.metadata import DeviceMetadataFiles  # noqa: E402
from netclaim.agent.claims.prepare import Preparer  # noqa: E402
from netclaim.agent.claims.reclaim import Reclaimer  # noqa: E402
from netclaim.agent.claims.unprepare import Unpreparer  # noqa: E402
from netclaim.agent.pods.attach import Attacher, PodLocks  # noqa: E402
from netclaim.agent.pods.check import AttachmentChecker  # noqa: E402
from netclaim.agent.pods.hooks import PodHooks  # noqa: E402
from netclaim.agent.pods.lifecycle import NetworkCollector, NetworkGate, PluginReadiness  # noqa: E402
from netclaim.agent.status import ClaimRef, StatusWriter  # noqa: E402
from netclaim.agent.store import Attachment, State, Store  # noqa: E402
from netclaim.core.config.cniconfig import CNI_VERSIONS, speaks_lifecycle  # noqa: E402
from netclaim.core.devices.catalog import BANDWIDTH, Capacity, Device, DeviceCatalog  # noqa: E402
from netclaim.core.ipam.addresses import AddressBook  # noqa: E402
from netclaim.core.node import InterfaceState, Invocation, PodSandbox  # noqa: E402
from netclaim.core.objects import AllocatedDevice, ConsumerRef, DeviceConfig  # noqa: E402
from netclaim.core.plan import (  # noqa: E402
    POOL_IPAM,
    AttachPlan,
    NicRecord,
    NodeContext,
    PluginVersions,
    named_plugin_types,
)
from netclaim.runtime.supervisor import Supervisor  # noqa: E402

SAMPLE_NODE = "node-1"
SAMPLE_CLUSTER = (
    ipaddress.ip_network("10.245.0.0/16"),
    ipaddress.ip_network("10.96.0.0/16"),
)  # pods, Services
SAMPLE_DRIVER = "netclaim.dev"
CNI_VERSIONS_SPOKEN = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]


@dataclass
class FakePodNetlink:
    """The interfaces as attaching reads and sets them (netclaim.core.node.PodLinks): the
    interfaces of the node (netns None) and of pods' namespaces (their path), keyed (netns, name)."""

    interfaces: dict[tuple[str | None, str], InterfaceState] = field(default_factory=dict)
    shaped: list[tuple[str, int, str]] = field(default_factory=list)  # (name, bits/s, netns)
    removed_ifbs: list[tuple[str, str]] = field(default_factory=list)  # (name, netns)
    links_set: list[tuple[str, int | None, str | None]] = field(default_factory=list)  # (name, mtu, mac)
    fail_shape: list[Exception] = field(default_factory=list)
    sysctls: dict[tuple[str | None, str], dict[str, str]] = field(default_factory=dict)  # as last set
    addresses_given: list[tuple[str, ...] | None] = field(default_factory=list)  # to interface(), each call

    async def interface(
        self,
        name: str,
        netns: str | None = None,
        sysctls: Mapping[str, str] | None = None,
        addresses: tuple[str, ...] | None = None,
    ) -> InterfaceState | None:
        found = self.interfaces.get((netns, name))
        if found is not None and sysctls:
            self.sysctls.setdefault((netns, name), {}).update(sysctls)
        self.addresses_given.append(addresses)
        return found if found is None or addresses is None else replace(found, addresses=addresses)

    async def shape(self, name: str, bits_per_second: int, netns: str) -> None:
        if self.fail_shape:
            raise self.fail_shape.pop(0)
        self.shaped.append((name, bits_per_second, netns))

    async def remove_ifb(self, name: str, netns: str) -> None:
        self.removed_ifbs.append((name, netns))

    async def delete_link(self, name: str, netns: str) -> None:
        self.interfaces.pop((netns, name), None)

    async def set_link(
        self,
        name: str,
        *,
        mtu: int | None = None,
        mac: str | None = None,
        listening: bool | None = None,
        netns: str | None = None,
    ) -> None:
        self.links_set.append((name, mtu, mac))
        current = self.interfaces[(netns, name)]
        self.interfaces[(netns, name)] = replace(
            current,
            mtu=mtu or current.mtu,
            mac=mac or current.mac,
            promisc=current.promisc if listening is None else listening,
            allmulti=current.allmulti if listening is None else listening,
        )

    @contextlib.asynccontextmanager
    async def without_dad(self, netns: str) -> AsyncIterator[None]:
        yield

    def add_host_nic(self, device: Device, *, mtu: int, mac: str) -> None:
        self.interfaces[(None, device.if_name)] = InterfaceState(device.if_name, 2, mac, mtu, ())

    def remove_namespace(self, netns: str) -> None:
        """The namespace went (with its interfaces), as when a sandbox is torn down."""
        for key in [k for k in self.interfaces if k[0] == netns]:
            del self.interfaces[key]
        Path(netns).unlink(missing_ok=True)


@dataclass(frozen=True)
class CniCall:
    command: str  # ADD, DEL, STATUS or GC
    network: str  # the config list's name
    cni_version: str
    invocation: Invocation
    prev_result: dict[str, Any] | None  # what DEL was given as the ADD result (None for ADD)
    valid: tuple[tuple[str, str], ...] = ()  # GC's valid attachments


NO_INVOCATION = Invocation("", "", "", "")  # STATUS and GC act for no attachment


FAKE_BIN_DIR = Path("/nonexistent/cni/bin")


class FakeCni(CniRunner):
    """CNI plugins in memory. ADD leases an address (keyed like host-local's: container ID and interface;
    CNI_ARGS IP= asks for one), puts the interface into the pod's namespace of `netlink`, then raises what
    `fail_add` holds first (a chain failing half-way; None: that ADD succeeds). DEL raises what
    `fail_delete` holds first (None: that DEL succeeds), else releases the lease and removes the interface,
    also when the namespace is gone (netns ""). While `gate` (`delete_gate`) is an unset Event, every ADD
    (DEL) waits for it: a slow plugin; `adding` (`deleting`) tells that one started. STATUS (1.1 chains)
    and CHECK raise what `fail_status` and `fail_check` hold first; GC drops the leases of its network that
    are not valid (as host-local does in its directory), keyed by container ID and interface."""

    def __init__(self, netlink: FakePodNetlink) -> None:
        super().__init__([FAKE_BIN_DIR], timeout=5.0)
        self.netlink = netlink
        self.supported: dict[str, list[str]] = {}  # plugin type -> versions; others speak CNI_VERSIONS_SPOKEN
        self.calls: list[CniCall] = []
        self.version_queries: list[str] = []
        self.leases: dict[tuple[str, str], str] = {}  # (container ID, ifName) -> address
        self.lease_networks: dict[tuple[str, str], str] = {}  # (container ID, ifName) -> network name
        self.fail_add: list[Exception | None] = []
        self.fail_delete: list[Exception | None] = []
        self.fail_versions: list[Exception] = []
        self.fail_status: list[Exception | None] = []
        self.fail_check: list[Exception | None] = []
        self.missing: set[str] = set()  # plugin types not installed on the node
        self.create_interface = True
        self.gate: asyncio.Event | None = None
        self.adding = asyncio.Event()
        self.delete_gate: asyncio.Event | None = None
        self.deleting = asyncio.Event()
        self._hosts = 10

    def commands(self) -> list[tuple[str, str, str]]:
        """(command, container ID, netns) of every call, in order."""
        return [(c.command, c.invocation.container_id, c.invocation.netns) for c in self.calls]

    def plugin_path(self, kind: str) -> Path:
        if kind in self.missing:
            raise ConfigError(f"plugin type {kind!r}: no such plugin in {FAKE_BIN_DIR}")
        return FAKE_BIN_DIR / kind

    async def versions(self, kind: str) -> list[str]:
        self.version_queries.append(kind)
        if kind in self.missing:
            raise ConfigError(f"plugin type {kind!r}: no such plugin in {FAKE_BIN_DIR}")
        if self.fail_versions:
            raise self.fail_versions.pop(0)
        return list(self.supported.get(kind, CNI_VERSIONS_SPOKEN))

    async def add(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        deadline: float,
        runtime_config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        self.calls.append(CniCall("ADD", conflist["name"], conflist["cniVersion"], invocation, None))
        self.adding.set()
        if self.gate is not None:
            await self.gate.wait()
        lease = (invocation.container_id, invocation.if_name)
        asked = dict(p.split("=", 1) for p in invocation.args.split(";") if "=" in p).get("IP")
        if asked:  # host-local's CNI_ARGS IP=: that address again
            self.leases[lease] = f"{asked}/24"
        if lease not in self.leases:
            self.leases[lease] = f"10.90.0.{self._hosts}/24"
            self._hosts += 1
        self.lease_networks[lease] = conflist["name"]
        address = self.leases[lease]
        mac = f"02:00:0a:5a:00:{int(address.split('.')[3].split('/')[0]):02x}"
        if self.create_interface:
            self.netlink.interfaces[(invocation.netns, invocation.if_name)] = InterfaceState(
                invocation.if_name, 3, mac, 1500, (address,)
            )
        failure = self.fail_add.pop(0) if self.fail_add else None
        if failure is not None:
            raise failure
        return {
            "cniVersion": conflist["cniVersion"],
            "interfaces": [{"name": invocation.if_name, "mac": mac, "sandbox": invocation.netns}],
            "ips": [{"address": address, "interface": 0}],
        }

    async def delete(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        result: dict[str, Any] | None,
        deadline: float,
        quiet: bool = False,
    ) -> None:
        self.calls.append(CniCall("DEL", conflist["name"], conflist["cniVersion"], invocation, result))
        self.deleting.set()
        if self.delete_gate is not None:
            await self.delete_gate.wait()
        failure = self.fail_delete.pop(0) if self.fail_delete else None
        if failure is not None:
            raise failure
        self.leases.pop((invocation.container_id, invocation.if_name), None)
        if invocation.netns:
            self.netlink.interfaces.pop((invocation.netns, invocation.if_name), None)

    async def status(self, conflist: dict[str, Any], deadline: float) -> None:
        if not speaks_lifecycle(conflist):
            return
        self.calls.append(CniCall("STATUS", conflist["name"], conflist["cniVersion"], NO_INVOCATION, None))
        failure = self.fail_status.pop(0) if self.fail_status else None
        if failure is not None:
            raise failure

    async def check(
        self, conflist: dict[str, Any], invocation: Invocation, result: dict[str, Any], deadline: float
    ) -> None:
        self.calls.append(CniCall("CHECK", conflist["name"], conflist["cniVersion"], invocation, result))
        failure = self.fail_check.pop(0) if self.fail_check else None
        if failure is not None:
            raise failure

    async def gc(self, conflist: dict[str, Any], valid: list[tuple[str, str]], deadline: float) -> None:
        call = CniCall("GC", conflist["name"], conflist["cniVersion"], NO_INVOCATION, None, tuple(valid))
        self.calls.append(call)
        network = conflist["name"]
        stale = [held for held, n in self.lease_networks.items() if n == network and held not in set(valid)]
        for lease in stale:
            self.leases.pop(lease, None)

    def release_host_local(self, conflist: dict[str, Any], container_id: str) -> list[str]:
        released = [address for (owner, _), address in self.leases.items() if owner == container_id]
        self.leases = {lease: a for lease, a in self.leases.items() if lease[0] != container_id}
        return released


def sample_device(
    if_name: str = "enp1s0", *, shared: bool = True, mtu: int = 1500, mac: str = "52:54:00:12:34:56"
) -> Device:
    """A NIC as this node publishes it: shared (macvlan and the like) or exclusive (moved into the pod)."""
    bandwidth = (
        Capacity(10_000_000_000, default=1_000_000_000, minimum=1_000_000, step=1_000_000)
        if shared
        else Capacity(10_000_000_000)
    )
    return Device(
        name=f"dev-{if_name}",
        if_name=if_name,
        shared=shared,
        attributes={
            "netclaim.dev/ifName": if_name,
            "netclaim.dev/mtu": mtu,
            "netclaim.dev/mac": mac,
            "netclaim.dev/shared": shared,
        },
        capacity={BANDWIDTH: bandwidth},
        tenant_ranges=("10.0.0.0/8", "fd00::/8"),  # where the unit tests' own host-local ranges lie
    )


def sample_conflist(network: str = "lan", master: str = "enp1s0") -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "macvlan",
                "master": master,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.90.0.0/24"}]]},
            }
        ],
    }


def sample_row(
    device: Device | None = None,
    *,
    claim_uid: str = "claim-uid-1",
    claim_name: str = "claim-1",
    pod_uid: str = "pod-uid-1",
    request: str = "net",
    interface_name: str = "net1",
    share_id: str = "",
    bandwidth_bps: int | None = None,
    state: State = State.PREPARED,
) -> Attachment:
    """A stored attachment as prepare writes it (state PREPARED unless told)."""
    device = device or sample_device()
    plan = AttachPlan(
        interface_name=interface_name,
        conflist=sample_conflist(master=device.if_name),
        bandwidth_bps=bandwidth_bps,
        nic=NicRecord.of(device),
    )
    return Attachment(
        claim_uid=claim_uid,
        pool=SAMPLE_NODE,
        device=device.name,
        share_id=share_id,
        claim_namespace="team-a",
        claim_name=claim_name,
        request=request,
        pod_uid=pod_uid,
        plan=plan,
        state=state,
    )


def sample_config(
    parameters: object, source: str = "FromClaim", requests: tuple[str, ...] = ()
) -> DeviceConfig:
    return DeviceConfig(source, requests, SAMPLE_DRIVER, parameters)


def sample_allocation(
    device: Device,
    request: str = "net",
    *,
    pool: str = SAMPLE_NODE,
    share_id: str = "",
    bandwidth: str | None = None,
    driver: str = SAMPLE_DRIVER,
) -> AllocatedDevice:
    consumed = {BANDWIDTH: bandwidth} if bandwidth is not None else {}
    return AllocatedDevice(request, driver, pool, device.name, share_id, consumed)


def sample_claim(
    results: tuple[AllocatedDevice, ...],
    configs: tuple[DeviceConfig, ...],
    *,
    name: str = "claim-1",
    uid: str = "claim-uid-1",
    reserved_for: tuple[ConsumerRef, ...] = (ConsumerRef("pod-1", "pod-uid-1"),),
    allocated: bool = True,
    devices_status: tuple[dict[str, Any], ...] = (),
) -> Claim:
    return Claim(
        namespace="team-a",
        name=name,
        uid=uid,
        resource_version="1",
        allocated=allocated,
        results=results,
        configs=configs,
        reserved_for=reserved_for,
        devices_status=devices_status,
    )


@dataclass
class ConfigureRig:
    """configure/ wired as the agent wires it, on a real Store, with the API, CNI and netlink faked."""

    root: Path
    api: FakeKubeApi
    store: Store
    netlink: FakePodNetlink
    cni: FakeCni
    locks: PodLocks
    attacher: Attacher
    status: StatusWriter
    hooks: PodHooks
    catalog: DeviceCatalog
    preparer: Preparer
    unpreparer: Unpreparer
    reclaimer: Reclaimer
    background: Supervisor
    metadata: DeviceMetadataFiles
    health: dict[str, bool]  # the agent's readiness parts, as PluginReadiness reports them
    collector: NetworkCollector
    checker: AttachmentChecker

    def sandbox(
        self, sandbox_id: str = "sandbox-1", uid: str = "pod-uid-1", name: str = "pod-1"
    ) -> PodSandbox:
        """A running pod sandbox whose network namespace exists (a file under the rig's root)."""
        netns = self.root / "netns" / sandbox_id
        netns.parent.mkdir(exist_ok=True)
        netns.touch()
        return PodSandbox(id=sandbox_id, uid=uid, name=name, namespace="team-a", netns=str(netns))

    async def settle(self) -> None:
        """Let the work hooks leave for later finish: queued Events, rollbacks, then the claims' status."""
        await self.background.settle()
        for target in list(self.status._queued):
            del self.status._queued[target]
            with contextlib.suppress(GoneError):  # as StatusWriter.run: a deleted claim or pod is dropped
                await self.status.write(target)

    def entries(self, claim: ClaimRef) -> list[dict[str, Any]]:
        """status.devices of the claim as the API server has it now, netclaim's entries only."""
        found = self.api.claims[(claim.namespace, claim.name)]
        return [d for d in found.devices_status if d["driver"] == SAMPLE_DRIVER]


def configure_rig(tmp_path: Path) -> ConfigureRig:
    netlink = FakePodNetlink()
    api = FakeKubeApi()
    store = Store(tmp_path / "state")
    cni = FakeCni(netlink)
    locks = PodLocks()
    background = Supervisor()
    health: dict[str, bool] = {}
    readiness, networks = PluginReadiness(cni, health.__setitem__), NetworkGate()
    attacher = Attacher(store, cni, netlink, locks, background, readiness, networks)
    status = StatusWriter(api, SAMPLE_DRIVER, store, background, pods=api)
    catalog = DeviceCatalog()
    addresses = AddressBook(api, SAMPLE_NODE)
    node = NodeContext(SAMPLE_DRIVER, SAMPLE_NODE, catalog.get, reserved=SAMPLE_CLUSTER)
    metadata = DeviceMetadataFiles(tmp_path / "kubelet-plugin", tmp_path / "cdi", SAMPLE_DRIVER)
    preparer = Preparer(store, Gatherer(api, addresses, cni, SAMPLE_DRIVER), node, status, None, metadata)
    unpreparer = Unpreparer(store, attacher, status, None, metadata)
    hooks = PodHooks(store, attacher, status, locks, metadata)
    return ConfigureRig(
        tmp_path,
        api,
        store,
        netlink,
        cni,
        locks,
        attacher,
        status,
        hooks,
        catalog,
        preparer,
        unpreparer,
        Reclaimer(store, api, unpreparer),
        background,
        metadata,
        health,
        NetworkCollector(store, cni, networks, readiness),
        AttachmentChecker(store, attacher, locks, status),
    )


def every_version(claim: Claim) -> PluginVersions:
    """Every plugin the claim's configs name (and the pools' IPAM) speaks every CNI version: for tests of
    planning alone, where no plugin is asked."""
    kinds = named_plugin_types(claim, SAMPLE_DRIVER) | {POOL_IPAM}
    return PluginVersions({kind: CNI_VERSIONS for kind in kinds})


# --- the API server's HTTP answers, for the real adapter (lightkube and httpx on a MockTransport) ---------

import json  # noqa: E402

import httpx2 as httpx  # noqa: E402
from lightkube import KubeConfig  # noqa: E402

KUBECONFIG = KubeConfig.from_dict(
    {
        "clusters": [{"name": "test", "cluster": {"server": "https://api.test"}}],
        "users": [{"name": "agent", "user": {"token": "token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}],
        "current-context": "test",
    }
)


@dataclass
class FakeApiServer:
    """Canned answers by path (`answers`: status and body; `streams`: watch bodies, one per request; a
    write to a path without an answer is answered with what it sent, as an apply is), Events created, and
    every request made."""

    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    # a list answered in pages: the page the request's continue token numbers (the first without one)
    pages: dict[str, list[str]] = field(default_factory=dict)
    streams: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        headers = {"Content-Type": "application/json"}
        if request.method == "POST" and request.url.path.endswith("/events"):
            self.events.append(json.loads(request.content))
            return httpx.Response(201, content=request.content, headers=headers)
        if request.url.params.get("watch") == "true":
            return httpx.Response(200, content=self.streams.pop(0).encode(), headers=headers)
        if request.method == "GET" and request.url.path in self.pages:
            page = self.pages[request.url.path][int(request.url.params.get("continue") or 0)]
            return httpx.Response(200, content=page.encode(), headers=headers)
        if request.method in ("PATCH", "POST") and request.url.path not in self.answers:
            return httpx.Response(200, content=request.content, headers=headers)
        status, body = self.answers.get(request.url.path, (404, api_status(404, "not found", name="x")))
        return httpx.Response(status, content=body.encode(), headers=headers)


def api_status(code: int, message: str, name: str | None = None) -> str:
    """A Status object as the API server answers with (JSON text)."""
    details = {"name": name, "kind": "resourceclaims"} if name else {}
    return json.dumps({"kind": "Status", "code": code, "message": message, "details": details})


# --- port security: the node as netclaim.agent.pods.guard writes it ---

from netclaim.agent.pods.guard import PortGuard  # noqa: E402
from netclaim.core.node import BROADCAST  # noqa: E402


@dataclass
class Hairpins:
    """The NIC's tc filters, by priority (what netclaim.adapters.tc would leave)."""

    filters: dict[str, dict[int, str]] = field(default_factory=dict)  # NIC → priority → MAC ("*": mirror)
    batches: int = 0

    async def ours(self, nic: str, netns: str = "") -> set[int]:
        return set(self.filters.get(nic, {}))

    async def change(
        self,
        nic: str,
        add: Mapping[int, str],
        remove: Iterable[int] = (),
        *,
        broadcast: bool | None = None,
        netns: str = "",
    ) -> None:
        self.batches += 1
        held = self.filters.setdefault(nic, {})
        assert not set(add) & set(held), "a priority given twice"
        held.update(add)
        for priority in remove:
            del held[priority]
        if broadcast:
            held[BROADCAST] = "*"
        elif broadcast is False:
            del held[BROADCAST]

    def macs(self, nic: str) -> set[str]:
        return {mac for mac in self.filters.get(nic, {}).values() if mac != "*"}


@dataclass
class Recorder:
    """The node as the guard writes it: each NIC's table (made, then its set elements), its hairpin."""

    sets: dict[str, set[tuple[str, Any]]] = field(default_factory=dict)  # table → its elements
    made: list[str] = field(default_factory=list)  # tables made whole
    batches: int = 0  # nft runs
    old: list[str] = field(default_factory=list)  # tables of an agent before
    hairpins: Hairpins = field(default_factory=Hairpins)

    async def define(self, netns: str, script: str, *, check_only: bool = False) -> None:
        assert netns == "" and not check_only  # the node's own namespace
        name = script.split()[2]
        self.made.append(name)
        self.sets[name] = set()
        self.batches += 1

    async def apply(self, netns: str, batch: dict[str, Any], *, check_only: bool = False) -> None:
        assert netns == "" and not check_only
        self.batches += 1
        for command in batch["nftables"]:
            [(verb, body)] = command.items()
            if "table" in body:  # a table deleted (its NIC went)
                self.sets.pop(body["table"]["name"], None)
                continue
            element = body["element"]
            for value in element["elem"]:
                entry = (element["name"], tuple(value["concat"]) if isinstance(value, dict) else value)
                getattr(self.sets[element["table"]], "add" if verb == "add" else "remove")(entry)

    def macs(self, table: str) -> set[str]:
        return {value for name, value in self.sets.get(table, set()) if name == "macs"}

    async def tables(self, netns: str) -> list[tuple[str, str]]:
        return [("netdev", name) for name in self.old] + [("inet", "netclaim")]  # a pod's, not the guard's

    def hardware_address(self, name: str) -> str | None:
        """The node's NICs: all there (with the same MAC) but gone0."""
        return None if name == "gone0" else "52:54:00:12:34:56"


def recorded_guard(store: Store, recorder: Recorder, background: Supervisor | None = None) -> PortGuard:
    return PortGuard(store, recorder, recorder.hairpins, recorder, background or Supervisor())
