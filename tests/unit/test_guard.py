"""Port security's decisions (netclaim.configure.guard, the plan's guarded children): which rows bind which
child, what the NIC's table holds, and when the table and hairpin are written (the kernel's side:
tests/test_port_guard_kernel.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from netclaim.configure.guard import Binding, PortGuard, binding_of, guarded_nic, link_local, ruleset
from netclaim.configure.plan import child_mac, guarded_child
from netclaim.configure.store import Interface, Outcome, State, Store
from netclaim.objects import AllocatedDevice
from netclaim.publish.devices import PORT_SECURITY
from tests.unit.fakes import sample_device, sample_row

MAC = "02:00:00:00:00:0a"


def test_a_guarded_child_is_vepa_with_a_mac_known_before_it_exists() -> None:
    allocated = AllocatedDevice("net", "netclaim.dev", "node-1", "dev-enp1s0", "share-1", {})
    mac = child_mac("claim-uid-1", allocated)
    assert mac == child_mac("claim-uid-1", allocated) != child_mac("claim-uid-2", allocated)  # stable
    assert int(mac[:2], 16) & 0x03 == 0x02  # locally administered, unicast
    plugin = {"type": "macvlan", "master": "enp1s0", "mode": "bridge"}
    assert guarded_child(plugin, mac) == {**plugin, "mode": "vepa", "mac": mac}
    assert guarded_child({**plugin, "mode": "private", "mac": MAC}, mac)["mode"] == "private"
    assert guarded_child({**plugin, "mac": MAC}, mac)["mac"] == MAC  # the config's own MAC is kept


def test_the_link_local_address_is_the_kernels_eui64() -> None:
    assert link_local("52:54:00:12:34:56") == "fe80::5054:ff:fe12:3456"


def _row(**plugin: Any) -> Any:
    device = sample_device("enp1s0")
    row = sample_row(device)
    macvlan = {**row.plan.conflist["plugins"][0], **plugin}
    plan = row.plan.model_copy(update={"conflist": {**row.plan.conflist, "plugins": [macvlan]}})
    return replace(row, plan=plan)


def test_a_rows_child_is_bound_to_its_planned_mac_and_addresses_then_to_what_it_has() -> None:
    static = {"type": "static", "addresses": [{"address": "10.3.0.7/24"}, {"address": "fd03::7/64"}]}
    planned = _row(mac=MAC, ipam=static)
    assert guarded_nic(planned) == "enp1s0"
    assert binding_of(planned) == Binding(MAC, ("10.3.0.7", "fd03::7", "fe80::ff:fe00:a"))
    interface = Interface(
        name="net1", mac=MAC, mtu=1500, addresses=("10.90.0.9/24",)
    )  # a tenant's host-local: told by the ADD
    attached = planned.with_state(State.ATTACHED, outcome=Outcome(interface=interface))
    assert binding_of(attached) == Binding(MAC, ("10.3.0.7", "10.90.0.9", "fd03::7", "fe80::ff:fe00:a"))
    assert binding_of(_row()) is None  # planned before netclaim chose MACs: bound once attached


def test_an_exclusive_nic_and_a_nic_without_port_security_are_not_guarded() -> None:
    exclusive = sample_row(sample_device("enp2s0", shared=False))
    assert guarded_nic(exclusive) is None
    opted_out = sample_device("enp3s0")
    opted_out.attributes[PORT_SECURITY] = False
    assert guarded_nic(sample_row(opted_out)) is None


def test_the_table_holds_our_names_and_the_childrens_values_only() -> None:
    made = ruleset("enp1s0", ["52:54:00:12:34:56"], [Binding(MAC, ("10.3.0.7", "fd03::7"))])
    commands = made["nftables"]
    table = {"family": "netdev", "name": "netclaim-enp1s0"}
    assert commands[:3] == [
        {"add": {"table": table}},
        {"delete": {"table": table}},
        {"add": {"table": table}},
    ]
    chains = [c["add"]["chain"] for c in commands if "chain" in c.get("add", {})]
    assert [c["name"] for c in chains] == ["child_0", "egress"]
    assert chains[1]["hook"] == "egress" and chains[1]["dev"] == "enp1s0"
    text = json.dumps(made)
    assert "0xfd030000000000000000000000000007" in text  # the advertisement target it may claim
    egress = [
        c["add"]["rule"]["expr"]
        for c in commands
        if c.get("add", {}).get("rule", {}).get("chain") == "egress"
    ]
    assert egress[-1] == [{"drop": None}]  # any other source MAC
    assert ruleset("enp1s0", [], [])["nftables"] == commands[:2]  # no child: the table goes
    with pytest.raises(ValueError, match="not a usable interface name"):
        ruleset('enp1s0" ; flush ruleset', [], [])


@dataclass
class Recorder:
    tables: list[tuple[str, list[str]]] = field(default_factory=list)  # (table, the children's MACs)
    hairpins: list[tuple[str, list[str]]] = field(default_factory=list)
    old: list[str] = field(default_factory=list)  # tables of an agent before

    async def apply(self, netns: str, made: dict[str, Any]) -> None:
        assert netns == ""  # the node's own namespace
        name = made["nftables"][0]["add"]["table"]["name"]
        vmaps = [
            e["vmap"]["data"]["set"]
            for c in made["nftables"]
            for e in c.get("add", {}).get("rule", {}).get("expr", [])
            if "vmap" in e
        ]
        self.tables.append((name, [mac for vmap in vmaps for mac, _ in vmap]))

    async def hairpin(self, nic: str, macs: Sequence[str]) -> None:
        self.hairpins.append((nic, list(macs)))

    async def host_mac(self, nic: str) -> str | None:
        return None if nic == "gone0" else "52:54:00:12:34:56"

    async def our_tables(self) -> list[str]:
        return self.old


def _guard(store: Store, recorder: Recorder) -> PortGuard:
    return PortGuard(store, recorder.apply, recorder.hairpin, recorder.host_mac, recorder.our_tables)


async def test_children_are_bound_before_they_are_stored_and_unbound_once_gone(tmp_path: Path) -> None:
    store, recorder = Store(tmp_path), Recorder()
    guard = _guard(store, recorder)
    row = _row(mac=MAC)
    await guard.follow(["enp1s0"], extra=[row])  # prepare: before the row is stored
    assert recorder.tables == [("netclaim-enp1s0", [MAC])] and recorder.hairpins == [("enp1s0", [MAC])]
    await store.put(row)
    await guard.follow(["enp1s0"])
    assert len(recorder.tables) == 1  # unchanged: nothing written
    assert guard.covers(row)
    interface = Interface(name="net1", mac=MAC, mtu=1500, addresses=("10.90.0.9/24",))
    attached = row.with_state(State.ATTACHED, outcome=Outcome(interface=interface))
    assert not guard.covers(attached)  # its ADD told an address prepare could not know
    await store.delete(row)
    await guard.follow(["enp1s0"])
    assert recorder.tables[-1] == ("netclaim-enp1s0", []) and recorder.hairpins[-1] == ("enp1s0", [])
    store.close()


async def test_after_a_restart_every_nic_is_written_again_and_an_old_table_of_a_gone_nic_goes(
    tmp_path: Path,
) -> None:
    store, recorder = Store(tmp_path), Recorder(old=["netclaim-enp9s0", "netclaim-gone0"])
    await store.put(_row(mac=MAC))
    await _guard(store, recorder).start()
    assert sorted(recorder.tables) == [
        ("netclaim-enp1s0", [MAC]),  # written though the last agent may have written the same
        ("netclaim-enp9s0", []),
        ("netclaim-gone0", []),
    ]
    assert sorted(recorder.hairpins) == [("enp1s0", [MAC]), ("enp9s0", [])]  # none for a NIC that is gone
    store.close()


def test_without_a_host_mac_no_empty_set_reaches_nft() -> None:
    """nft refuses an empty anonymous set: a NIC whose own MAC could not be read gets no host rule."""
    made = json.dumps(ruleset("enp1s0", [], [Binding(MAC, ("10.3.0.7",))]))
    assert '{"set": []}' not in made


def _static(mac: str, address: str, **row: str) -> Any:
    planned = _row(mac=mac, ipam={"type": "static", "addresses": [{"address": f"{address}/24"}]})
    return replace(planned, **row)


async def test_a_pods_children_on_one_nic_may_send_as_each_other_never_as_another_pod(tmp_path: Path) -> None:
    """Two interfaces of one pod in one subnet: the kernel answers ARP and replies from either (ARP flux);
    that is the pod's own business. Another pod's addresses stay another's."""
    store = Store(tmp_path)
    await store.put(
        _static("02:00:00:00:00:01", "10.3.0.1"),
        _static("02:00:00:00:00:02", "10.3.0.2", claim_uid="claim-uid-2"),
        _static("02:00:00:00:00:03", "10.3.0.3", claim_uid="claim-uid-3", pod_uid="pod-uid-3"),
    )
    bound = {b.mac: set(b.addresses) for b in _guard(store, Recorder())._wanted("enp1s0", [])}
    first, second, other = (bound[f"02:00:00:00:00:0{i}"] for i in (1, 2, 3))
    assert first == second and {"10.3.0.1", "10.3.0.2"} <= first and "10.3.0.3" not in first
    assert "10.3.0.1" not in other
    store.close()
