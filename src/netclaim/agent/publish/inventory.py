"""What NICs this node has: netlink for links and addresses, sysfs for hardware facts, declared overrides.

The inventory reports facts only. Which of them become DRA devices, and how, is the policy's job
(`netclaim.core.devices.rules`); a few interfaces are never candidates and carry the reason here.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import AsyncIterator
from dataclasses import MISSING, fields, replace
from pathlib import Path

import yaml

from netclaim.core.config.overrides import NicOverride, load_overrides
from netclaim.core.devices.nic import NetworkInterface
from netclaim.core.names import PCI_ADDRESS
from netclaim.core.node import Link, LinkChange, NodeLinks
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError

# Host ends of pod veths and the bridges of common primary CNIs: never a NIC to hand out.
POD_NETWORK_GLOBS = ("veth*", "cali*", "lxc*", "cilium*", "flannel*", "cni*", "docker*", "kube-*", "weave*")


class Sysfs:
    """Hardware facts of a netdev from /sys (a different root in unit tests)."""

    def __init__(self, root: Path = Path("/sys")) -> None:
        self.root = root

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None  # absent, or EINVAL (speed of a link that is down)

    def _int(self, path: Path) -> int | None:
        text = self._read(path)
        try:
            return int(text, 0) if text is not None else None
        except ValueError:
            return None

    def facts(self, if_name: str) -> dict[str, object]:
        net = self.root / "class" / "net" / if_name
        facts: dict[str, object] = {}
        speed = self._int(net / "speed")
        if speed is not None and speed > 0:
            facts["speed_bps"] = speed * 1_000_000
        device = net / "device"
        if not device.exists():
            facts["virtual"] = True
            return facts
        facts["virtual"] = False
        resolved = device.resolve()
        driver = (device / "driver").resolve().name if (device / "driver").exists() else None
        if driver:
            facts["driver"] = driver
        pci = next((p for p in (resolved, *resolved.parents) if PCI_ADDRESS.fullmatch(p.name)), None)
        if pci is None:
            return facts
        facts["pci_address"] = pci.name
        facts["pcie_root"] = _pcie_root(pci, self.root)
        for key, name in (("pci_vendor", "vendor"), ("pci_device", "device")):
            value = self._read(pci / name)
            if value:
                facts[key] = value
        numa = self._int(pci / "numa_node")
        if numa is not None and numa >= 0:
            facts["numa_node"] = numa
        for key, name in (("sriov_total_vfs", "sriov_totalvfs"), ("sriov_num_vfs", "sriov_numvfs")):
            count = self._int(pci / name)
            if count is not None:
                facts[key] = count
        if (pci / "physfn").exists():
            facts["sriov_pf"] = (pci / "physfn").resolve().name
        return facts


def _pcie_root(pci_device: Path, sys_root: Path) -> str | None:
    """`pci<domain>:<bus>`: the first element under /sys/devices of the device's path."""
    try:
        relative = pci_device.relative_to((sys_root / "devices").resolve())
    except ValueError:
        return None
    first = relative.parts[0] if relative.parts else ""
    return first if first.startswith("pci") else None


def _apply_override(interface: NetworkInterface, override: NicOverride) -> NetworkInterface:
    changes: dict[str, object] = {}
    if override.speed is not None:
        changes["speed_bps"] = int(parse_quantity(override.speed))
    for source, target in (
        ("numaNode", "numa_node"),
        ("pciAddress", "pci_address"),
        ("pcieRoot", "pcie_root"),
        ("pciVendor", "pci_vendor"),
        ("pciDevice", "pci_device"),
        ("driver", "driver"),
    ):
        value = getattr(override, source)
        if value is not None:
            changes[target] = value
    return replace(interface, overridden=tuple(sorted(changes)), **changes)  # type: ignore[arg-type]


def cni_bridges(cni_conf_dir: Path | None) -> set[str]:
    """Bridges the node's primary CNI config creates (never published)."""
    names: set[str] = set()
    if cni_conf_dir is None or not cni_conf_dir.is_dir():
        return names
    for path in sorted(cni_conf_dir.iterdir()):
        if path.suffix not in {".conf", ".conflist", ".json"}:
            continue
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for plugin in config.get("plugins", [config]) if isinstance(config, dict) else []:
            if isinstance(plugin, dict) and plugin.get("type") == "bridge":
                names.add(str(plugin.get("bridge", "cni0")))
    return names


class NodeInventory:
    """The node's real interfaces (netlink + sysfs), with declared overrides applied."""

    def __init__(
        self,
        links: NodeLinks,
        overrides_file: Path | None = None,
        cni_conf_dir: Path | None = None,
        sysfs: Sysfs | None = None,
    ) -> None:
        self.links = links
        self.overrides_file = overrides_file
        self.cni_conf_dir = cni_conf_dir
        self.sysfs = sysfs or Sysfs()
        self._candidates: dict[int, Link] = {}  # the last scan's links that may be published
        self._pod_network: set[int] = set()  # links named as the primary network's: their changes are dropped
        # A NIC without carrier reads no speed: the last one read stands, or the bandwidth a device offers
        # would change (and its slice be rewritten) with every loss of its link.
        self._speeds: dict[str, int] = {}

    async def scan(self) -> list[NetworkInterface]:
        links, addresses, uplinks = await asyncio.gather(
            self.links.links(), self.links.addresses(), self.links.default_route_interfaces()
        )
        overrides = load_overrides(self.overrides_file)
        bridges = cni_bridges(self.cni_conf_dir)
        by_index = {link.index: link for link in links}
        interfaces = []
        for link in sorted(links, key=lambda item: item.name):
            facts = self.sysfs.facts(link.name)
            speed = facts.get("speed_bps")
            if isinstance(speed, int):
                self._speeds[link.name] = speed
            elif not link.carrier and link.name in self._speeds:
                facts["speed_bps"] = self._speeds[link.name]
            ips = addresses.get(link.index, [])
            interface = NetworkInterface(
                name=link.name,
                index=link.index,
                kind=link.kind or ("loopback" if link.loopback else "physical"),
                mac=link.mac,
                mtu=link.mtu,
                up=link.up,
                carrier=link.carrier,
                carrier_changes=link.carrier_changes,
                virtual=bool(facts.pop("virtual", True)),
                ipv4=tuple(str(ip) for ip in ips if ip.version == 4),
                ipv6=tuple(str(ip) for ip in ips if ip.version == 6),
                never_publish=_never_publish(link, uplinks, bridges, by_index),
                **facts,  # type: ignore[arg-type]
            )
            if link.name in overrides:
                interface = _apply_override(interface, overrides[link.name])
            interfaces.append(interface)
        self._candidates = {i.index: by_index[i.index] for i in interfaces if i.never_publish is None}
        self._pod_network.clear()  # in place: the open LinkEvents asks this set
        self._pod_network.update(link.index for link in links if _pod_network_name(link.name))
        return interfaces

    async def changes(self) -> AsyncIterator[None]:
        """A burst that may change the scan. Not the events of the primary network's links (every pod's
        host-side veth, the bridge it joins: they cannot be published and were not) nor link-scope
        addresses (never read): before, each pod without a claim cost a rescan of the node (≈ 10 ms of the
        agent's CPU). Nor a NIC's own RTM_NEWLINK that leaves the link as the last scan read it: the
        kernel sends two for every macvlan made on the NIC and moved into a pod, so each attach and
        detach cost a rescan.

        A link of the primary network is known by name at its first event (or scan) and by index after
        it: netlink drops its events undecoded (a dozen for each pod), but its RTM_DELLINK, which frees the
        index for the next link. Renamed away from such a name, a link is found at the next resync."""
        async with self.links.link_events(quiet=self._pod_network.__contains__) as events:
            while True:
                if any(self._may_change_scan(c) for c in await events.next_batch()):
                    yield None

    def _may_change_scan(self, change: LinkChange) -> bool:
        if change.name is None:
            return change.scope == 0
        if change.event == "RTM_DELLINK":
            self._pod_network.discard(change.index)
        elif change.index not in self._candidates and _pod_network_name(change.name):
            self._pod_network.add(change.index)
        if change.index in self._candidates:
            return change.event != "RTM_NEWLINK" or change.link != self._candidates[change.index]
        return not _pod_network_name(change.name)


def _never_publish(
    link: Link, uplinks: set[int], cni_bridge_names: set[str], by_index: dict[int, Link]
) -> str | None:
    if link.loopback:
        return "loopback"
    if link.index in uplinks:
        return "carries the node's default route"
    if link.name in cni_bridge_names:
        return "bridge of the primary pod network"
    if link.master is not None:
        master = by_index.get(link.master)
        return f"enslaved to {master.name if master else 'another interface'}"
    if _pod_network_name(link.name):
        return "primary pod network interface"
    return None


def _pod_network_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in POD_NETWORK_GLOBS)


class FileInventory:
    """A synthetic inventory from a YAML/JSON list (scale tests, kubelet-less nodes); re-read on change."""

    def __init__(self, path: Path, poll_seconds: float = 0.2) -> None:
        self.path = path
        self.poll_seconds = poll_seconds

    async def scan(self) -> list[NetworkInterface]:
        try:
            # libyaml's safe parser when PyYAML has it (its wheels do): 1,024 interfaces in 0.06 s, not 0.4 s
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            raw = yaml.load(self.path.read_text(), Loader=loader) or []  # noqa: S506 - a safe loader
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{self.path}: cannot read the inventory: {err}") from err
        if not isinstance(raw, list):
            raise ConfigError(f"{self.path}: expected a list of interfaces")
        known = {f.name for f in fields(NetworkInterface)}
        required = {
            f.name for f in fields(NetworkInterface) if f.default is MISSING and f.default_factory is MISSING
        }
        interfaces = []
        for position, entry in enumerate(raw):
            where = f"{self.path}: [{position}]"
            if not isinstance(entry, dict):
                raise ConfigError(f"{where}: expected a mapping of interface facts, not {entry!r}")
            if set(entry) - known:
                raise ConfigError(f"{where}: unknown fields {sorted(set(entry) - known)}")
            if required - set(entry):
                raise ConfigError(f"{where}: missing fields {sorted(required - set(entry))}")
            for key in ("ipv4", "ipv6", "overridden"):
                if key in entry:
                    entry[key] = tuple(entry[key])
            interfaces.append(NetworkInterface(**entry))
        return interfaces

    async def changes(self) -> AsyncIterator[None]:
        last = self.path.stat().st_mtime_ns if self.path.exists() else 0
        while True:
            await asyncio.sleep(self.poll_seconds)
            current = self.path.stat().st_mtime_ns if self.path.exists() else 0
            if current != last:
                last = current
                yield None
