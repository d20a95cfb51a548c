"""The attack corpus: tenant claims that try to reach the node, other tenants or more than their share.

Each case is a claim's netclaim config (its CNI config list, and the CNIConfig fields beside it) that must
be refused, and the field its refusal must name. Every key that names a host interface, a host path, a
socket, the host's routing or firewall is tried, with the spellings a Go plugin reads as the same key;
then addresses that are not the tenant's, MACs, names that break logs and shaping, values nested deep,
sizes that break the claim's status, shares taken beyond the share, children that change the NIC for
every pod on it, and sysctls that make the pod a router. `admin_may` says whether the same config is fine
as a DeviceClass (admin) config on an exclusive device: the boundary is about who writes it.

The corpus runs against the enp0s10 NICs of the test cluster (tests/cluster/policy.yaml: shared, macvlan
children, tenant ranges TENANT_RANGES) with the IP pool CORPUS_POOL installed, served to another namespace.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

MASTER = "{{ device.ifName }}"
HOST_LOCAL: dict[str, Any] = {"type": "host-local", "ranges": [[{"subnet": "10.70.0.0/24"}]]}
# what the test cluster's policy gives tenants on enp0s10 (tests/cluster/policy.yaml)
TENANT_RANGES = ("10.16.0.0/12", "10.32.0.0/11", "10.64.0.0/11", "10.120.0.0/16", "fd00::/16")
# a pool inside the tenant ranges, of another namespace: none of its addresses is a claim's to configure
CORPUS_POOL: dict[str, Any] = {
    "apiVersion": "netclaim.dev/v1alpha1",
    "kind": "IPPool",
    "metadata": {"name": "corpus-pool"},
    "spec": {
        "ranges": [{"subnet": "10.70.200.0/24", "gateway": "10.70.200.1"}],
        "namespaces": ["corpus-other-tenant"],
    },
}
DEEP = 1_500  # levels: what a tenant nested in one value on the real cluster (10 KiB of parameters)


class Nested:
    """A value nested DEEP levels (`[[[…"x"…]]]`): stands for itself until the JSON is written (the JSON
    and YAML writers recurse and give up long before; `deep_json` writes it)."""

    def __repr__(self) -> str:
        return f"<a list nested {DEEP} deep>"


NESTED = Nested()


def deep_json(value: Any) -> str:
    """JSON text of `value`, with each Nested written DEEP levels deep."""
    marker = '"<nested>"'
    text = json.dumps(value, default=lambda _: "<nested>")
    return text.replace(marker, "[" * DEEP + '"x"' + "]" * DEEP)


def nested_value(levels: int = DEEP) -> Any:
    """A list nested `levels` deep, built without recursion."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@dataclass(frozen=True)
class Attack:
    name: str
    config: dict[str, Any]  # the CNI config list of the claim
    field: str  # what the refusal must name
    admin_may: bool = True
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)  # CNIConfig fields beside `config`
    # refused for an admin by Kubernetes' admission only (its CEL's IP rules): the agent trusts a class's
    # addresses
    admin_refused_at_admission: bool = False

    def cni_config(self) -> dict[str, Any]:
        """The claim's opaque parameters (a CNIConfig)."""
        return {
            "apiVersion": "netclaim.dev/v1alpha1",
            "kind": "CNIConfig",
            "config": self.config,
            **self.parameters,
        }


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


# Keys netclaim itself reads (netclaim.core.config.cnikeys), in another spelling: refused whoever writes
# them, the admin too, at admission and at prepare. Every other key is the plugin's: any spelling is an
# admin's to use.
SPELLED_FOR_EVERYONE = frozenset({
    "macvlan Master: eth0", "macvlan MASTER: eth0", "macvlan mAsTeR: eth0", "master and Master",
    "ipvlan Master: eth0", "host-device Device: eth0", "ipam datadir", "ipam DataDir", "ipam DATADIR",
    "ranges and Ranges", "IPAM in capitals", "Ipam", "ipam Ranges alone", "macvlan Mode passthru",
})  # fmt: skip


def attacks() -> list[Attack]:
    return [
        dataclasses.replace(attack, admin_may=False) if attack.name in SPELLED_FOR_EVERYONE else attack
        for attack in _attacks()
    ]


def _attacks() -> list[Attack]:
    return [
        # the node's uplink: macvlan/ipvlan without a master fall back to the default-route interface
        Attack("macvlan without master", chain(_without(macvlan(), "master")), "plugins[0].master: required"),
        Attack("ipvlan without master", chain({"type": "ipvlan", "ipam": HOST_LOCAL}), "plugins[0].master"),
        # another host interface, by every spelling Go's JSON reads as `master`
        Attack(
            "macvlan master: eth0",
            chain({**_without(macvlan(), "master"), "master": "eth0"}),
            ".master: 'eth0'",
        ),
        *(
            Attack(
                f"macvlan {key}: eth0",
                chain({**_without(macvlan(), "master"), key: "eth0"}),
                f".{key}: write it 'master'",
            )
            for key in ("Master", "MASTER", "mAsTeR")
        ),
        Attack("master and Master", chain(macvlan(Master="eth0")), ".Master: write it 'master'"),
        Attack(
            "ipvlan Master: eth0", chain({"type": "ipvlan", "Master": "eth0"}), ".Master: write it 'master'"
        ),
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
            "host-device Device: eth0",
            chain({"type": "host-device", "Device": "eth0"}),
            ".Device: write it 'device'",
        ),
        Attack("macvlan passthru on a shared NIC", chain(macvlan(mode="passthru")), "passthru", False),
        # files on the node: IPAM and tuning state directories, a resolv.conf to read
        *(
            Attack(f"ipam {key}", chain(_ipam(**{key: "/tmp/x"})), f"ipam.{key}: ")
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
            "ranges and Ranges",
            chain(_ipam(Ranges=[[{"subnet": "10.71.0.0/24"}]])),
            "Ranges: write it 'ranges'",
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
        *_addresses(),
        *_macs(),
        *_names(),
        *_nesting(),
        *_sizes(),
        *_shares(),
        *_sysctls(),
        *_spellings(),
    ]


def _static(*addresses: str) -> dict[str, Any]:
    return macvlan(ipam={"type": "static", "addresses": [{"address": a} for a in addresses]})


def _host_local(subnet: str, **fields: Any) -> dict[str, Any]:
    return macvlan(ipam={"type": "host-local", "ranges": [[{"subnet": subnet, **fields}]]})


def _addresses() -> list[Attack]:
    """Addresses that are not the tenant's: special ones, the node's, the cluster's, another's pool."""
    pool = CORPUS_POOL["spec"]["ranges"][0]
    return [
        Attack("static: the cloud metadata address", chain(_static("169.254.169.254/32")), "link-local"),
        Attack("static: loopback 127.0.0.2", chain(_static("127.0.0.2/8")), "loopback"),
        Attack("static: IPv6 link-local fe80::1", chain(_static("fe80::1/64")), "link-local"),
        Attack("static: multicast 224.0.0.5", chain(_static("224.0.0.5/32")), "multicast"),
        Attack("static: the unspecified address", chain(_static("0.0.0.0/0")), "unspecified"),
        Attack("static: the broadcast address", chain(_static("255.255.255.255/32")), "reserved"),
        Attack("static: IPv6 loopback", chain(_static("::1/128")), "loopback"),
        # Kubernetes' CEL refuses IPv4-mapped CIDRs, as its API validation does: an admin's too
        Attack(
            "static: the metadata address, IPv4-mapped",
            chain(_static("::ffff:169.254.169.254/128")),
            "mapped",
            admin_may=False,
            admin_refused_at_admission=True,
        ),
        Attack(
            "static: a tenant address, IPv4-mapped",
            chain(_static("::ffff:10.70.0.5/120")),
            "mapped",
            admin_may=False,
            admin_refused_at_admission=True,
        ),
        Attack(
            "static: an address of another's pool", chain(_static("10.70.200.5/24")), "IPPool corpus-pool"
        ),
        Attack(
            "static: another pool's gateway", chain(_static(f"{pool['gateway']}/24")), "IPPool corpus-pool"
        ),
        Attack("host-local: another's pool subnet", chain(_host_local(pool["subnet"])), "IPPool corpus-pool"),
        Attack(
            "host-local: a range around another's pool",
            chain(_host_local("10.70.0.0/16")),
            "IPPool corpus-pool",
        ),
        Attack(
            "static: the node's management address",
            chain(_static("10.202.0.1/24")),
            "outside the ranges the admin gave tenants",
        ),
        Attack(
            "host-local: the node's management network",
            chain(_host_local("10.202.0.0/24")),
            "outside the ranges the admin gave tenants",
        ),
        Attack(
            "host-local: the cluster's pod network",
            chain(_host_local("10.245.0.0/16")),
            "outside the ranges the admin gave tenants",
        ),
        Attack(
            "static: the cluster's DNS Service address",
            chain(_static("10.96.0.10/32")),
            "outside the ranges the admin gave tenants",
        ),
        Attack(
            "host-local: all of 10/8", chain(_host_local("10.0.0.0/8")), "outside the ranges the admin gave"
        ),
        Attack("static: a tenant address with a /0 prefix", chain(_static("10.70.1.5/0")), "unspecified"),
        Attack(
            "host-local: the legacy subnet field, link-local",
            chain(macvlan(ipam={"type": "host-local", "subnet": "169.254.0.0/16"})),
            "link-local",
        ),
        Attack(
            "host-local: a second range set outside",
            chain(
                macvlan(
                    ipam={
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.70.1.0/24"}], [{"subnet": "192.168.0.0/24"}]],
                    }
                )
            ),
            "ranges[1][0].subnet: 192.168.0.0/24 is outside",
        ),
        Attack(
            "static: IPv6 outside the tenant ranges", chain(_static("2001:db8::5/64")), "outside the ranges"
        ),
        Attack(
            "host-device on a shared NIC with a pool's address",
            chain({"type": "host-device", "device": MASTER, "ipam": _static("10.70.200.9/24")["ipam"]}),
            "takes the whole NIC",
            admin_may=False,
        ),
    ]


def _macs() -> list[Attack]:
    """MACs that are not a locally administered unicast: a router's, a vendor's, group addresses."""
    return [
        Attack(
            f"tuning mac {mac} ({why})",
            chain(macvlan(), {"type": "tuning", "mac": mac}),
            ".mac: ",
        )
        for mac, why in (
            ("00:00:5e:00:01:01", "the VRRP router MAC"),
            ("3c:fd:fe:00:00:01", "a vendor's universal address"),
            ("ff:ff:ff:ff:ff:ff", "broadcast"),
            ("33:33:00:00:00:01", "IPv6 multicast"),
            ("00:00:00:00:00:00", "all zeros"),
            ("02:00:00:00:00:0g", "not hexadecimal"),
        )
    ]


def _names() -> list[Attack]:
    """Interface and network names that break teardown, logs or the shaping devices (whoever wrote them)."""
    cases = [
        Attack(
            f"interfaceName {name!r}",
            chain(macvlan()),
            "interfaceName",
            admin_may=False,
            parameters={"interfaceName": name},
        )
        for name in (
            "net\u0000",
            "net\u001b[31m",
            "ifb0",
            "ifbnet",
            "eth0",
            "lo",
            "-net",
            "net 1",
            "net1\n",
            "x" * 16,
            "né",
            "all",
            "default",
        )
    ]
    cases += [
        Attack(f"network name {name!r}", {**chain(macvlan()), "name": name}, "name", admin_may=False)
        for name in ("../../var/lib/cni/networks/cbr0", "net\u0000", "a b", "-net", "x" * 64)
    ]
    cases += [
        Attack(f"vrf name {name!r}", chain(macvlan(), {"type": "vrf", "vrfname": name}), ".vrfname: ")
        for name in ("ifb9", "eth0", "vrf\u0000")
    ]
    return cases


def _nesting() -> list[Attack]:
    """A value nested 1,500 deep at each field a claim may fill (written by `deep_json`); refused whoever
    wrote it (admin_may=False): the decoder reads no value deeper than any config needs."""
    tuning = {"type": "tuning", "sysctl": {"net.ipv4.tcp_syncookies": NESTED}}
    cases = [
        ("interfaceName", chain(macvlan()), {"interfaceName": NESTED}),
        ("bandwidth", chain(macvlan()), {"bandwidth": NESTED}),
        ("cniVersions", {**chain(macvlan()), "cniVersions": NESTED}, {}),
        ("name", {**chain(macvlan()), "name": NESTED}, {}),
        ("master", chain(macvlan(master=NESTED)), {}),
        ("mtu", chain(macvlan(mtu=NESTED)), {}),
        ("ranges", chain(_ipam(ranges=NESTED)), {}),
        ("subnet", chain(_host_local(NESTED)), {}),  # type: ignore[arg-type]
        ("sysctl", chain(macvlan(), tuning), {}),
        ("dns", chain(macvlan(ipam={"type": "static", "dns": {"search": NESTED}})), {}),
        ("plugins[1].x", chain(macvlan(), {"type": "static", "x": NESTED}), {}),  # an IPAM as a plugin
        ("ipam.x", chain(macvlan(ipam={"type": "macvlan", "x": NESTED})), {}),  # a plugin as an IPAM
    ]
    return [
        Attack(f"nested {where}", config, where, admin_may=False, parameters=parameters)
        for where, config, parameters in cases
    ]


def _sizes() -> list[Attack]:
    """What would make the claim's status too big for the API server (ips ≤ 16, data ≤ 10 KiB)."""
    many = [f"10.70.9.{i}/24" for i in range(1, 18)]
    return [
        Attack("static: 17 addresses", chain(_static(*many)), "addresses: at most"),
        Attack(
            "static dns: 200 search domains",
            chain(
                macvlan(
                    ipam={
                        "type": "static",
                        "addresses": [{"address": "10.70.9.1/24"}],
                        "dns": {"search": [f"d{i}.example" for i in range(200)]},
                    }
                )
            ),
            "search: at most",
        ),
        Attack(
            "static: 200 routes",
            chain(
                macvlan(
                    ipam={
                        "type": "static",
                        "addresses": [{"address": "10.70.9.1/24"}],
                        "routes": [{"dst": f"10.71.{i}.0/24"} for i in range(200)],
                    }
                )
            ),
            "routes: at most",
        ),
    ]


def _shares() -> list[Attack]:
    """Taking more of a shared NIC than the share, or changing it for the other pods on it."""
    return [
        Attack(
            "bandwidth none on a shared NIC", chain(macvlan()), "bandwidth", parameters={"bandwidth": "none"}
        ),
        Attack(
            "ipvlan on a macvlan NIC",
            chain({"type": "ipvlan", "master": MASTER, "mode": "l2", "ipam": HOST_LOCAL}),
            "shared through macvlan children",
            admin_may=False,
        ),
        Attack(
            "ipvlan l3s on a macvlan NIC",
            chain({"type": "ipvlan", "master": MASTER, "mode": "l3s", "ipam": HOST_LOCAL}),
            "shared through macvlan children",
            admin_may=False,
        ),
        Attack(
            "ipvlan and macvlan in one chain",
            chain(macvlan(), {"type": "ipvlan", "master": MASTER}),
            "shared through macvlan children",
            admin_may=False,
        ),
        Attack(
            "tuning promisc on a shared NIC",
            chain(macvlan(), {"type": "tuning", "promisc": True}),
            ".promisc: on a shared NIC",
        ),
        Attack(
            "tuning allmulti on a shared NIC",
            chain(macvlan(), {"type": "tuning", "allmulti": True}),
            ".allmulti: on a shared NIC",
        ),
    ]


def _sysctls() -> list[Attack]:
    """Sysctls beyond the pod's own interface: other interfaces, every interface, routing, proxying."""
    return [
        Attack(
            f"tuning sysctl {name}", chain(macvlan(), {"type": "tuning", "sysctl": {name: value}}), "sysctl"
        )
        for name, value in (
            ("net.ipv4.conf.eth0.forwarding", "1"),
            ("net.ipv4.conf.all.forwarding", "1"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.net1.proxy_arp", "1"),
            ("net.ipv4.conf.net1.forwarding", "1"),
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv4.ip_forward", "1"),
            ("net.core.somaxconn", "4096"),
            ("net.ipv4.conf.net1.arp_notify", "1; reboot"),
        )
    ]


def _spellings() -> list[Attack]:
    """Keys in another case: a plugin reads them as the canonical key, netclaim must never skip them. The
    admission policy reads `type`, `plugins` and `cniVersion` exactly for an admin too (admin_may=False)."""
    return [
        Attack(
            "IPAM in capitals",
            chain({**_without(macvlan(), "ipam"), "IPAM": HOST_LOCAL}),
            ".IPAM: write it 'ipam'",
        ),
        Attack("Ipam", chain({**_without(macvlan(), "ipam"), "Ipam": HOST_LOCAL}), ".Ipam: write it 'ipam'"),
        Attack(
            "ipam Type",
            chain(macvlan(ipam={"Type": "host-local", "ranges": [[{"subnet": "10.70.0.0/24"}]]})),
            "Type",
            admin_may=False,
        ),
        Attack(
            "ipam Ranges alone",
            chain(macvlan(ipam={"type": "host-local", "Ranges": [[{"subnet": "10.70.0.0/24"}]]})),
            ".Ranges: write it 'ranges'",
        ),
        Attack(
            "range RangeStart",
            chain(_host_local("10.70.0.0/24", RangeStart="10.70.0.5")),
            ".RangeStart: write it 'rangeStart'",
        ),
        Attack("route Dst", chain(_ipam(routes=[{"Dst": "0.0.0.0/0"}])), ".Dst: write it 'dst'"),
        Attack("macvlan Mode passthru", chain(macvlan(Mode="passthru")), ".Mode: write it 'mode'"),
        Attack(
            "plugin Type tuning",
            chain(macvlan(), {"Type": "tuning"}),
            ".Type: write it 'type'",
            admin_may=False,
        ),
        Attack(
            "conflist Plugins",
            {"cniVersion": "1.0.0", "name": "attack", "Plugins": [macvlan()]},
            "Plugins",
            admin_may=False,
        ),
        Attack(
            "conflist CNIVersion",
            {**_without(chain(macvlan()), "cniVersion"), "CNIVersion": "1.0.0"},
            "CNIVersion",
            admin_may=False,
        ),
    ]


@dataclass(frozen=True)
class ClaimAttack:
    """A claim (template) whose requests, not its config, take more than a tenant's share or another
    namespace's pool. `refused_at`: admission (when written), prepare (the agent, naming `field`) or
    scheduling (never allocated: the pod stays Pending, nothing consumed)."""

    name: str
    requests: tuple[dict[str, Any], ...]
    field: str
    refused_at: str
    config: dict[str, Any] = dataclasses.field(default_factory=lambda: chain(macvlan()))
    address_config: dict[str, Any] | None = None


CORPUS_OPEN_POOL: dict[str, Any] = {  # a pool any namespace may use: two requests on it are one too many
    "apiVersion": "netclaim.dev/v1alpha1",
    "kind": "IPPool",
    "metadata": {"name": "corpus-open"},
    "spec": {"ranges": [{"subnet": "10.70.201.0/24"}]},
}
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


def _nic(**exactly: Any) -> dict[str, Any]:
    return {
        "name": "nic",
        "exactly": {
            "deviceClassName": "netclaim-shared",
            "selectors": [{"cel": {"expression": ON_ENP0S10}}],
            **exactly,
        },
    }


def _pool_request(name: str, device_class: str, pool: str) -> dict[str, Any]:
    selector = f'device.attributes["netclaim.dev"].pool == "{pool}"'
    return {
        "name": name,
        "exactly": {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]},
    }


def claim_attacks() -> list[ClaimAttack]:
    restricted = CORPUS_POOL["metadata"]["name"]
    without_ipam = chain(_without(macvlan(), "ipam"))
    every_shared = {"deviceClassName": "netclaim-shared", "selectors": [{"cel": {"expression": "true"}}]}
    return [
        ClaimAttack(
            "allocationMode All: every shared NIC of a node",
            ({"name": "nic", "exactly": {**every_shared, "allocationMode": "All"}},),
            "its DeviceClass allows 1 per request",
            "prepare",
        ),
        ClaimAttack(
            "count 2: two NICs for one interface",
            ({"name": "nic", "exactly": {**every_shared, "count": 2}},),
            "its DeviceClass allows 1 per request",
            "prepare",
        ),
        ClaimAttack(
            "two requests on one pool",
            (
                _nic(),
                _pool_request("ip1", "netclaim-address", "corpus-open"),
                _pool_request("ip2", "netclaim-address", "corpus-open"),
            ),
            "take addresses from IPPool corpus-open",
            "prepare",
            config=without_ipam,
        ),
        ClaimAttack(
            "another namespace's pool, through its class",
            (_nic(), _pool_request("ip", f"netclaim-pool-{restricted}", restricted)),
            f"IPPool {restricted}, which serves namespaces",
            "admission",
            config=without_ipam,
        ),
        ClaimAttack(
            "another namespace's pool, through netclaim-address",
            (_nic(), _pool_request("ip", "netclaim-address", restricted)),
            "",
            "scheduling",
            config=without_ipam,
        ),
        ClaimAttack(
            "another namespace's pool's address, asked for",
            (_nic(), _pool_request("ip", "netclaim-address", restricted)),
            "",
            "scheduling",
            config=without_ipam,
            address_config={
                "apiVersion": "netclaim.dev/v1alpha1",
                "kind": "AddressConfig",
                "addresses": ["10.70.200.9"],
            },
        ),
        ClaimAttack(
            "two attachments of one shared NIC, over two requests",
            (_nic(), {**_nic(), "name": "nic2"}),
            "takes 2 attachments of device",
            "prepare",
            config={**chain(macvlan()), "name": "attack"},
        ),
        ClaimAttack(
            "all 32 attachments of a shared NIC",
            (_nic(capacity={"requests": {"netclaim.dev/attachments": "32"}}),),
            "",
            "scheduling",
        ),
    ]


def claim_template_json(name: str, attack: Attack | ClaimAttack) -> str:
    """The attack as a ResourceClaimTemplate, in JSON (its nested values written out by `deep_json`)."""
    if isinstance(attack, Attack):
        requests: tuple[dict[str, Any], ...] = (_nic(),)
        parameters = attack.cni_config()
        address_config = None
    else:
        requests = attack.requests
        parameters = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "config": attack.config}
        address_config = attack.address_config
    config = [{"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": parameters}}]
    if address_config is not None:
        config.append(
            {"requests": ["ip"], "opaque": {"driver": "netclaim.dev", "parameters": address_config}}
        )
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": list(requests), "config": config}}},
    }
    return deep_json(template)


def pool_device_class(pool: str) -> dict[str, Any]:
    """The DeviceClass an admin makes for a pool restricted to some namespaces (docs/ipam.md)."""
    attributes = 'device.attributes["netclaim.dev"]'
    expression = f'device.driver == "netclaim.dev" && "pool" in {attributes} && {attributes}.pool == "{pool}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"netclaim-pool-{pool}"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
