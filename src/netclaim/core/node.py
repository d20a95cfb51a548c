"""The node as the agent's parts see it: what its adapters carry (a pod sandbox, a link, an interface, a CNI
invocation, a prepared device) and the Protocols they implement (netclaim.adapters: cni, netlink, nftables,
tc). agent/main.py hands the adapters in; the unit tests hand in fakes. Nothing here does I/O."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

HOST_LOCAL_DATA_DIR = Path("/var/lib/cni/networks")  # host-local's default dataDir
Ruleset = dict[str, Any]  # nft's JSON: {"nftables": [commands]}


@dataclass(frozen=True)
class PodSandbox:
    """A pod sandbox as the runtime describes it; `netns` is "" for a pod on the host network."""

    id: str
    uid: str
    name: str
    namespace: str
    netns: str
    labels: Mapping[str, str] = field(default_factory=dict)  # the pod's (what policies select on)


class SandboxEvents(Protocol):
    """What netclaim does on the runtime's pod sandbox events (NRI); each call must finish within `budget`
    seconds."""

    async def synchronize(self, pods: list[PodSandbox]) -> None: ...

    async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None: ...

    async def stop_pod_sandbox(self, pod: PodSandbox, budget: float) -> None: ...

    async def remove_pod_sandbox(self, pod: PodSandbox, budget: float) -> None: ...


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as kubelet gets it back from NodePrepareResources."""

    request: str
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...] = ()


# --- CNI --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """Who the plugins act for: the runtime's container ID, the netns and the interface name."""

    container_id: str
    netns: str
    if_name: str
    args: str  # CNI_ARGS


def cni_args(namespace: str, pod: str, sandbox_id: str, pod_uid: str) -> str:
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};"
        f"K8S_POD_INFRA_CONTAINER_ID={sandbox_id};K8S_POD_UID={pod_uid}"
    )


def pod_of_cni_args(args: str) -> tuple[str, str]:
    """The pod's namespace and name from what cni_args made."""
    pairs = dict(part.split("=", 1) for part in args.split(";") if "=" in part)
    return pairs.get("K8S_POD_NAMESPACE", ""), pairs.get("K8S_POD_NAME", "")


def host_local_dirs(conflist: dict[str, Any]) -> list[Path]:
    """The directories where the chain's host-local plugins keep this network's reservations."""
    dirs: list[Path] = []
    for plugin in conflist.get("plugins", []):
        ipam = plugin.get("ipam") if isinstance(plugin, dict) else None
        if isinstance(ipam, dict) and ipam.get("type") == "host-local":
            dirs.append(Path(str(ipam.get("dataDir") or HOST_LOCAL_DATA_DIR)) / str(conflist.get("name", "")))
    return dirs


class Cni(Protocol):
    """The node's CNI plugins, run for a network's config list (netclaim.adapters.cni.CniRunner)."""

    timeout: float  # what one plugin's call may take

    def plugin_path(self, kind: str) -> Path: ...

    async def versions(self, kind: str) -> list[str]: ...

    async def add(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        deadline: float,
        runtime_config: dict[str, Any] | None = None,
    ) -> dict[str, Any]: ...

    async def status(self, conflist: dict[str, Any], deadline: float) -> None: ...

    async def check(
        self, conflist: dict[str, Any], invocation: Invocation, result: dict[str, Any], deadline: float
    ) -> None: ...

    async def gc(self, conflist: dict[str, Any], valid: list[tuple[str, str]], deadline: float) -> None: ...

    async def delete(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        result: dict[str, Any] | None,
        deadline: float,
        quiet: bool = False,
    ) -> None: ...

    def release_host_local(self, conflist: dict[str, Any], container_id: str) -> list[str]: ...

    def host_local_reservations(self, conflist: dict[str, Any]) -> set[str]: ...


# --- links ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # "" for physical devices; veth, macvlan, bridge, bond… for virtual ones
    mac: str
    mtu: int
    up: bool
    loopback: bool
    master: int | None
    operstate: str
    vf_count: int = 0  # SR-IOV virtual functions enabled (IFLA_NUM_VF)
    carrier: bool = True  # IFLA_CARRIER: the link has a peer (cable, switch port, veth peer up)
    carrier_changes: int = 0  # IFLA_CARRIER_CHANGES: the kernel's count of carrier losses and returns


@dataclass(frozen=True)
class LinkChange:
    """One notification: its kind (RTM_NEWLINK, RTM_DELADDR…), the link's index, and for link events its
    name and the link as the message describes it (the kernel sends a whole RTM_NEWLINK for any change,
    also one that alters nothing a scan reads: a macvlan made on a NIC, or moved away from it), or the
    address's scope (address events)."""

    event: str
    index: int
    name: str | None = None
    scope: int | None = None
    link: Link | None = None


@dataclass(frozen=True)
class InterfaceState:
    """An interface as the kernel has it (read back from a pod's namespace for the claim status)."""

    name: str
    index: int
    mac: str
    mtu: int
    addresses: tuple[str, ...]  # canonical CIDR form, global scope
    promisc: bool = False
    allmulti: bool = False


class LinkEventStream(Protocol):
    async def next_batch(self) -> list[LinkChange]:
        """Wait for the next burst of events."""
        ...


class NodeLinks(Protocol):
    """The node's own links, as the inventory scans and follows them (netclaim.adapters.netlink)."""

    async def links(self, netns: str | None = None) -> list[Link]: ...

    async def addresses(
        self, netns: str | None = None
    ) -> dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]: ...

    async def default_route_interfaces(self, netns: str | None = None) -> set[int]: ...

    def link_events(
        self, quiet: Callable[[int], bool] | None = None
    ) -> contextlib.AbstractAsyncContextManager[LinkEventStream]: ...


class Interfaces(Protocol):
    async def interface(
        self,
        name: str,
        netns: str | None = None,
        sysctls: Mapping[str, str] | None = None,
        addresses: tuple[str, ...] | None = None,
    ) -> InterfaceState | None:
        """The interface as the kernel has it (None: there is none of that name), first set to `sysctls`
        (paths under /proc/sys/net) when given; its `addresses` as given (a CNI result's: not read)."""
        ...


class HardwareAddresses(Protocol):
    def hardware_address(self, name: str) -> str | None:
        """The MAC of link `name` in the node's own namespace (None: there is none of that name)."""
        ...


class PodLinks(Interfaces, Protocol):
    """Interfaces in pods' namespaces and on the node, as attaching reads and sets them
    (netclaim.adapters.netlink)."""

    async def set_link(
        self,
        name: str,
        *,
        mtu: int | None = None,
        mac: str | None = None,
        listening: bool | None = None,
        netns: str | None = None,
    ) -> None: ...

    async def shape(self, name: str, bits_per_second: int, netns: str) -> None: ...

    async def delete_link(self, name: str, netns: str) -> None: ...

    async def remove_ifb(self, name: str, netns: str) -> None: ...

    def without_dad(self, netns: str) -> contextlib.AbstractAsyncContextManager[None]: ...


# --- packet filters ---------------------------------------------------------------------------------------


ApplyRuleset = Callable[[str, Ruleset], Awaitable[None]]  # a namespace's ruleset, in one transaction


class Nft(Protocol):
    """nftables in a namespace ("": the node's own; netclaim.adapters.nftables)."""

    async def apply(self, netns: str, ruleset: Ruleset, *, check_only: bool = False) -> None: ...

    async def define(self, netns: str, script: str, *, check_only: bool = False) -> None: ...

    async def tables(self, netns: str) -> list[tuple[str, str]]: ...


BROADCAST = 49152  # the hairpin's mirror of broadcast and multicast: 0xc000, far from what tools pick
CHILDREN = range(49153, 57345)  # a child's MAC each: 8,192 children on a NIC at most


class Hairpin(Protocol):
    """A NIC's hairpin filters: its children's frames handed back to its receive path, one filter per
    child's MAC at a priority of CHILDREN, and the mirror at BROADCAST (netclaim.adapters.tc)."""

    async def ours(self, nic: str, netns: str = "") -> set[int]: ...

    async def change(
        self,
        nic: str,
        add: Mapping[int, str],
        remove: Iterable[int] = (),
        *,
        broadcast: bool | None = None,
        netns: str = "",
    ) -> None: ...
