"""The attack corpus: tenant configs that try to reach the node through plugin fields.

Each case is a claim's CNI config that must be refused, and the field its refusal must name. Every key
that names a host interface, a host path, a socket, the host's routing or firewall is tried, with the
spellings a Go plugin reads as the same key. `admin_may` says whether the same config is fine as a
DeviceClass (admin) config on an exclusive device: the boundary is about who writes it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

MASTER = "{{ device.ifName }}"
HOST_LOCAL: dict[str, Any] = {"type": "host-local", "ranges": [[{"subnet": "10.70.0.0/24"}]]}


@dataclass(frozen=True)
class Attack:
    name: str
    config: dict[str, Any]  # the CNI config list of the claim
    field: str  # what the refusal must name
    admin_may: bool = True


# of the runtime's own keys, an admin config may set these (the rest are the runtime's alone)
ADMIN_KEYS = ("capabilities", "linkInContainer")


def chain(*plugins: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "attack", "plugins": [copy.deepcopy(p) for p in plugins]}


def macvlan(**fields: Any) -> dict[str, Any]:
    return {"type": "macvlan", "master": MASTER, "mode": "bridge", "ipam": HOST_LOCAL, **fields}


def _without(plugin: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in plugin.items() if k != key}


def _ipam(**fields: Any) -> dict[str, Any]:
    return macvlan(ipam={**HOST_LOCAL, **fields})


def attacks() -> list[Attack]:
    return [
        # the node's uplink: macvlan/ipvlan without a master fall back to the default-route interface
        Attack("macvlan without master", chain(_without(macvlan(), "master")), "plugins[0].master: required"),
        Attack("ipvlan without master", chain({"type": "ipvlan", "ipam": HOST_LOCAL}), "plugins[0].master"),
        # another host interface, by every spelling Go's JSON reads as `master`
        *(
            Attack(
                f"macvlan {key}: eth0",
                chain({**_without(macvlan(), "master"), key: "eth0"}),
                f".{key}: 'eth0'",
            )
            for key in ("master", "Master", "MASTER", "mAsTeR")
        ),
        Attack("master and Master", chain(macvlan(Master="eth0")), "differ only in case"),
        Attack("ipvlan Master: eth0", chain({"type": "ipvlan", "Master": "eth0"}), ".Master: 'eth0'"),
        # a placeholder rendered into a value the check refuses
        Attack("master from another attribute", chain(macvlan(master="{{ device.kind }}")), ".master: "),
        Attack("master from the node name", chain(macvlan(master="{{ node.name }}")), ".master: "),
        # a whole NIC: host-device by other selectors, or on the shared device
        Attack(
            "host-device on a shared NIC",
            chain({"type": "host-device", "device": MASTER}),
            "is shared",
            False,
        ),
        *(
            Attack(f"host-device {key}", chain({"type": "host-device", key: value}), f".{key}: not a field")
            for key, value in (
                ("pciBusID", "0000:00:03.0"),
                ("hwaddr", "52:54:00:12:34:56"),
                ("kernelpath", "/sys/devices/pci0000:00/0000:00:03.0"),
                ("PciBusId", "0000:00:03.0"),
            )
        ),
        Attack(
            "host-device Device: eth0", chain({"type": "host-device", "Device": "eth0"}), ".Device: 'eth0'"
        ),
        Attack("macvlan passthru on a shared NIC", chain(macvlan(mode="passthru")), "passthru", False),
        # files on the node: IPAM and tuning state directories, a resolv.conf to read
        *(
            Attack(f"ipam {key}", chain(_ipam(**{key: "/tmp/x"})), f"ipam.{key}: not a field")
            for key in ("dataDir", "datadir", "DataDir", "DATADIR", "resolvConf", "ResolvConf")
        ),
        *(
            Attack(
                f"tuning {key}",
                chain(macvlan(), {"type": "tuning", key: "/tmp/x"}),
                f"[1].{key}: not a field",
            )
            for key in ("dataDir", "datadir", "DataDir")
        ),
        # sockets and other IPAMs
        Attack("ipam dhcp", chain(_ipam(type="dhcp")), "ipam.type: 'dhcp'"),
        Attack(
            "dhcp daemonSocketPath",
            chain(macvlan(ipam={"type": "dhcp", "daemonSocketPath": "/run/x"})),
            "dhcp",
        ),
        Attack(
            "ipam whereabouts",
            chain(macvlan(ipam={"type": "whereabouts", "range": "10.0.0.0/24"})),
            "whereabouts",  # the admin's (a DeviceClass may use it: deploy/admission.yaml), never a tenant's
        ),
        # host routing and firewall: admin-only plugins
        *(
            Attack(
                f"plugin {kind} {sorted(fields)}",
                chain({"type": kind, **fields}),
                f"'{kind}' is admin-only",
                admin_may=kind.islower(),  # plugin names are file names: `Bridge` is no plugin
            )
            for kind, fields in (
                ("bridge", {"bridge": "cni0", "isGateway": True, "ipMasq": True, "ipam": HOST_LOCAL}),
                ("bridge", {"bridge": "br-tenant", "ipam": HOST_LOCAL}),
                ("ptp", {"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.201.0.0/24"}]]}}),
                ("portmap", {"capabilities": {"portMappings": True}}),
                ("firewall", {"backend": "iptables"}),
                ("dhcp", {}),
                ("bandwidth", {"ingressRate": 1}),
                ("vlan", {"master": MASTER, "vlanId": 5}),
                ("loopback", {}),
                ("Bridge", {"bridge": "cni0"}),
            )
        ),
        Attack(
            "portmap chained after macvlan", chain(macvlan(), {"type": "portmap"}), "'portmap' is admin-only"
        ),
        # what the runtime sets, by any spelling
        *(
            Attack(f"plugin {key}", chain(macvlan(**{key: value})), f".{key}", admin_may=key in ADMIN_KEYS)
            for key, value in (
                ("runtimeConfig", {"portMappings": [{"hostPort": 22, "containerPort": 22}]}),
                ("RuntimeConfig", {"portMappings": [{"hostPort": 22, "containerPort": 22}]}),
                ("runtimeconfig", {}),
                ("args", {"cni": {"ips": ["10.0.0.1"]}}),
                ("Args", {"cni": {}}),
                ("prevResult", {"ips": []}),
                ("PrevResult", {}),
                ("capabilities", {"portMappings": True}),
                ("linkInContainer", True),
                ("cni.dev/x", 1),
            )
        ),
        Attack("conflist runtimeConfig", {**chain(macvlan()), "runtimeConfig": {}}, "config.runtimeConfig"),
        # values out of range or of another kind
        Attack("macvlan mtu too large", chain(macvlan(mtu=70000)), ".mtu: must be a whole number"),
        Attack("macvlan mtu as text", chain(macvlan(mtu="1500")), ".mtu: must be a whole number"),
        Attack("macvlan mode source", chain(macvlan(mode="source")), ".mode: 'source'"),
        Attack("ipvlan mode l2e", chain({"type": "ipvlan", "master": MASTER, "mode": "l2e"}), ".mode: 'l2e'"),
        Attack(
            "tuning multicast mac", chain(macvlan(), {"type": "tuning", "mac": "01:00:5e:00:00:01"}), ".mac:"
        ),
        Attack("tuning promisc as text", chain(macvlan(), {"type": "tuning", "promisc": "yes"}), ".promisc:"),
        *(
            Attack(
                f"tuning sysctl {name}", chain(macvlan(), {"type": "tuning", "sysctl": {name: "1"}}), "sysctl"
            )
            for name in (
                "kernel.core_pattern",
                "net.ipv4/../../kernel/x",
                "net..ipv4",
                "vm.swappiness",
                "net",
            )
        ),
        Attack(
            "tuning sysctl value not text",
            chain(macvlan(), {"type": "tuning", "sysctl": {"net.core.somaxconn": 1}}),
            "must be a string",
        ),
        Attack("vrf name with a slash", chain(macvlan(), {"type": "vrf", "vrfname": "a/b"}), ".vrfname:"),
        Attack("sbr table 0", chain(macvlan(), {"type": "sbr", "table": 0}), ".table:"),
        # nesting: keys deep inside IPAM, and duplicates by case there too
        Attack(
            "ranges and Ranges", chain(_ipam(Ranges=[[{"subnet": "10.71.0.0/24"}]])), "differ only in case"
        ),
        Attack(
            "range with a host path",
            chain(_ipam(ranges=[[{"subnet": "10.70.0.0/24", "file": "/x"}]])),
            ".file",
        ),
        Attack("route with a table", chain(_ipam(routes=[{"dst": "0.0.0.0/0", "table": 100}])), ".table"),
        Attack(
            "gateway outside the subnet",
            chain(_ipam(ranges=[[{"subnet": "10.70.0.0/24", "gateway": "10.201.0.1"}]])),
            "outside the subnet",
        ),
        Attack(
            "range start outside the subnet",
            chain(_ipam(ranges=[[{"subnet": "10.70.0.0/24", "rangeStart": "10.201.0.1"}]])),
            "outside the subnet",
        ),
        Attack(
            "static with a host path",
            chain(
                macvlan(ipam={"type": "static", "addresses": [{"address": "10.70.0.9/24"}], "dataDir": "/x"})
            ),
            "ipam.dataDir",
        ),
        Attack(
            "static dns with a file",
            chain(macvlan(ipam={"type": "static", "dns": {"nameservers": ["1.1.1.1"], "resolvConf": "/x"}})),
            "resolvConf",
        ),
    ]
