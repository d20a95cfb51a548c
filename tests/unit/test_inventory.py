"""Hardware facts from a sysfs tree shaped like a real server's, and declared overrides."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import pytest

from netclaim.agent.publish.inventory import FileInventory, NodeInventory, Sysfs, _apply_override, cni_bridges
from netclaim.core.config.overrides import load_overrides
from netclaim.core.devices.nic import NetworkInterface
from netclaim.core.node import Link, LinkChange
from netclaim.errors import ConfigError
from tests.unit.fakes import FakeNetlink


def _fake_sysfs(root: Path) -> None:
    pf = root / "devices/pci0000:5d/0000:5d:02.0/0000:5e:00.0"
    vf = root / "devices/pci0000:5d/0000:5d:02.0/0000:5e:01.2"
    for device, values in (
        (
            pf,
            {
                "vendor": "0x8086",
                "device": "0x159b",
                "numa_node": "1",
                "sriov_totalvfs": "64",
                "sriov_numvfs": "4",
            },
        ),
        (vf, {"vendor": "0x8086", "device": "0x1889", "numa_node": "1"}),
    ):
        (device / "net").mkdir(parents=True)
        for name, value in values.items():
            (device / name).write_text(value + "\n")
    (vf / "physfn").symlink_to(pf)
    (root / "bus/pci/drivers/ice").mkdir(parents=True)
    (pf / "driver").symlink_to(root / "bus/pci/drivers/ice")
    net = root / "class/net"
    net.mkdir(parents=True)
    for name, device in (("ens1f0", pf), ("ens1f0v2", vf)):
        (net / name).mkdir()
        (net / name / "device").symlink_to(device)
        (net / name / "speed").write_text("25000\n")
    (net / "veth0").mkdir()  # virtual: no device link
    (net / "veth0" / "speed").write_text("-1\n")


def test_pci_facts_and_pcie_root(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path)
    facts = Sysfs(tmp_path).facts("ens1f0")
    assert facts == {
        "speed_bps": 25_000_000_000,
        "virtual": False,
        "driver": "ice",
        "pci_address": "0000:5e:00.0",
        "pcie_root": "pci0000:5d",
        "pci_vendor": "0x8086",
        "pci_device": "0x159b",
        "numa_node": 1,
        "sriov_total_vfs": 64,
        "sriov_num_vfs": 4,
    }
    vf = Sysfs(tmp_path).facts("ens1f0v2")
    assert vf["sriov_pf"] == "0000:5e:00.0" and vf["pcie_root"] == "pci0000:5d"
    assert Sysfs(tmp_path).facts("veth0") == {"virtual": True}


def test_overrides_replace_facts(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    path.write_text(
        "apiVersion: netclaim.dev/v1alpha1\nkind: NicOverrides\ninterfaces:\n"
        "  enp0s10: {speed: 10Gi, numaNode: 0, pcieRoot: pci0000:5d, pciAddress: '0000:5e:00.0'}\n"
    )
    override = load_overrides(path)["enp0s10"]
    veth = NetworkInterface(
        name="enp0s10",
        index=3,
        kind="veth",
        mac="02:00:00:00:00:02",
        mtu=1500,
        up=True,
        virtual=True,
        speed_bps=10_000_000_000,
    )
    changed = _apply_override(veth, override)
    assert changed.speed_bps == 10 * 2**30 and changed.numa_node == 0 and changed.pcie_root == "pci0000:5d"
    assert changed.overridden == ("numa_node", "pci_address", "pcie_root", "speed_bps")


def test_bad_overrides_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    path.write_text(
        "apiVersion: netclaim.dev/v1alpha1\nkind: NicOverrides\ninterfaces: {e1: {speed: quick}}\n"
    )
    with pytest.raises(ConfigError, match=r"interfaces\.e1\.speed"):
        load_overrides(path)


def test_primary_cni_bridges_are_found(tmp_path: Path) -> None:
    (tmp_path / "10-pods.conflist").write_text(
        '{"cniVersion":"1.0.0","name":"p","plugins":[{"type":"bridge","bridge":"br-pods"},{"type":"portmap"}]}'
    )
    (tmp_path / "20-other.conf").write_text('{"cniVersion":"1.0.0","name":"o","type":"bridge"}')
    (tmp_path / "README").write_text("not a config")
    assert cni_bridges(tmp_path) == {"br-pods", "cni0"}


def test_cni_bridges_without_a_usable_config_dir(tmp_path: Path) -> None:
    assert cni_bridges(None) == set()
    assert cni_bridges(tmp_path / "absent") == set()
    (tmp_path / "10-broken.conflist").write_text('{"plugins": [')
    (tmp_path / "20-list.json").write_text('["not", "an", "object"]')
    (tmp_path / "30-odd.conflist").write_text('{"plugins": ["bridge", {"type": "macvlan"}]}')
    (tmp_path / "40-ok.conf").write_text('{"type": "bridge", "bridge": "br0"}')
    assert cni_bridges(tmp_path) == {"br0"}


def test_sysfs_facts_of_unusual_devices(tmp_path: Path) -> None:
    net = tmp_path / "class/net"
    usb = tmp_path / "devices/platform/soc/usb1/1-1"  # a NIC that is no PCI function
    elsewhere = tmp_path / "elsewhere/0000:07:00.0"  # a PCI path outside /sys/devices
    under_platform = tmp_path / "devices/platform/0000:08:00.0"  # PCI, not under a pci<root>
    for device in (usb, elsewhere, under_platform):
        device.mkdir(parents=True)
    (elsewhere / "numa_node").write_text("-1\n")  # no NUMA affinity
    (elsewhere / "sriov_totalvfs").write_text("many\n")
    for name, device, speed in (
        ("usb0", usb, "unknown"),
        ("odd0", elsewhere, "0"),
        ("plat0", under_platform, "1000"),
    ):
        (net / name).mkdir(parents=True)
        (net / name / "device").symlink_to(device)
        (net / name / "speed").write_text(speed + "\n")
    sysfs = Sysfs(tmp_path)
    assert sysfs.facts("usb0") == {"virtual": False}
    assert sysfs.facts("odd0") == {"virtual": False, "pci_address": "0000:07:00.0", "pcie_root": None}
    assert sysfs.facts("plat0") == {
        "speed_bps": 1_000_000_000,
        "virtual": False,
        "pci_address": "0000:08:00.0",
        "pcie_root": None,
    }
    assert sysfs.facts("gone0") == {"virtual": True}


# --- NodeInventory: netlink (faked) + sysfs + overrides ----------------------------------------------------


def link(index: int, name: str, kind: str = "", *, master: int | None = None, loopback: bool = False) -> Link:
    return Link(
        index=index,
        name=name,
        kind=kind,
        mac=f"02:00:00:00:00:{index:02x}",
        mtu=65536 if loopback else 1500,
        up=index % 2 == 0,
        loopback=loopback,
        master=master,
        operstate="UP",
    )


@pytest.fixture
def fake_netlink() -> FakeNetlink:
    return FakeNetlink(
        known_links=[
            link(1, "lo", loopback=True),
            link(2, "eth0"),
            link(3, "ens1f0"),
            link(4, "br-pods", "bridge"),
            link(5, "bond0", "bond"),
            link(6, "ens2f0", master=5),
            link(7, "ens2f1", master=77),
            link(8, "veth1a2b", "veth"),
            link(9, "cali0c1d", "veth"),
            link(10, "enp0s10", "veth"),
            link(11, "cni0", "bridge"),
        ],
        known_addresses={
            3: [ipaddress.ip_interface("192.0.2.10/24"), ipaddress.ip_interface("2001:db8::10/64")],
            10: [ipaddress.ip_interface("198.51.100.7/24")],
        },
        default_route={2},
    )


def _node_inventory(tmp_path: Path, netlink: FakeNetlink) -> NodeInventory:
    _fake_sysfs(tmp_path / "sys")
    cni = tmp_path / "cni"
    cni.mkdir()
    (cni / "10-pods.conflist").write_text('{"name":"p","plugins":[{"type":"bridge","bridge":"br-pods"}]}')
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "apiVersion: netclaim.dev/v1alpha1\nkind: NicOverrides\ninterfaces:\n"
        "  enp0s10: {speed: 10G, numaNode: 0, pcieRoot: pci0000:5d, driver: fake}\n"
        "  absent0: {speed: 1G}\n"
    )
    return NodeInventory(netlink, overrides, cni, Sysfs(tmp_path / "sys"))


async def test_scan_says_why_an_interface_is_never_published(
    tmp_path: Path, fake_netlink: FakeNetlink
) -> None:
    interfaces = await _node_inventory(tmp_path, fake_netlink).scan()
    assert [i.name for i in interfaces] == sorted(link.name for link in fake_netlink.known_links)
    reasons = {i.name: i.never_publish for i in interfaces}
    assert reasons == {
        "lo": "loopback",
        "eth0": "carries the node's default route",
        "ens1f0": None,
        "br-pods": "bridge of the primary pod network",
        "bond0": None,
        "ens2f0": "enslaved to bond0",
        "ens2f1": "enslaved to another interface",
        "veth1a2b": "primary pod network interface",
        "cali0c1d": "primary pod network interface",
        "enp0s10": None,
        "cni0": "primary pod network interface",
    }


async def test_scan_joins_netlink_sysfs_and_overrides(tmp_path: Path, fake_netlink: FakeNetlink) -> None:
    by_name = {i.name: i for i in await _node_inventory(tmp_path, fake_netlink).scan()}
    assert by_name["ens1f0"] == NetworkInterface(
        name="ens1f0",
        index=3,
        kind="physical",
        mac="02:00:00:00:00:03",
        mtu=1500,
        up=False,
        virtual=False,
        speed_bps=25_000_000_000,
        driver="ice",
        pci_address="0000:5e:00.0",
        pci_vendor="0x8086",
        pci_device="0x159b",
        pcie_root="pci0000:5d",
        numa_node=1,
        sriov_total_vfs=64,
        sriov_num_vfs=4,
        ipv4=("192.0.2.10/24",),
        ipv6=("2001:db8::10/64",),
    )
    lo = by_name["lo"]
    assert (lo.kind, lo.virtual, lo.mtu, lo.ipv4) == ("loopback", True, 65536, ())
    veth = by_name["enp0s10"]
    assert veth.kind == "veth" and veth.virtual and veth.up
    assert (veth.speed_bps, veth.numa_node, veth.pcie_root, veth.driver) == (10**10, 0, "pci0000:5d", "fake")
    assert veth.overridden == ("driver", "numa_node", "pcie_root", "speed_bps")
    assert veth.ipv4 == ("198.51.100.7/24",) and veth.ipv6 == ()
    assert all(i.overridden == () for name, i in by_name.items() if name != "enp0s10")


async def test_scan_refuses_a_bad_overrides_file(tmp_path: Path, fake_netlink: FakeNetlink) -> None:
    inventory = _node_inventory(tmp_path, fake_netlink)
    assert inventory.overrides_file is not None
    inventory.overrides_file.write_text("apiVersion: netclaim.dev/v1alpha1\nkind: NicOverrides\nnics: {}\n")
    with pytest.raises(ConfigError, match=r"overrides\.yaml"):
        await inventory.scan()


async def test_node_inventory_changes_follow_netlink_batches(fake_netlink: FakeNetlink) -> None:
    changes = NodeInventory(fake_netlink).changes()
    assert isinstance(changes, AsyncGenerator)
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 7, name="eth7")])
    fake_netlink.batches.put_nowait(
        [LinkChange("RTM_DELADDR", 7, scope=0), LinkChange("RTM_NEWADDR", 7, scope=0)]
    )
    await anext(changes)
    await anext(changes)
    assert fake_netlink.batches.empty() and fake_netlink.subscriptions == ["open"]
    await changes.aclose()
    assert fake_netlink.subscriptions == ["open", "close"], "the netlink socket is closed with the iterator"


async def test_the_primary_networks_links_and_link_local_addresses_change_nothing(
    fake_netlink: FakeNetlink, tmp_path: Path
) -> None:
    """Before, every pod's host-side veth (and the link-local address the kernel gives it) woke a rescan of
    the node: ≈ 10 ms of the agent's CPU for a pod that asked nothing of netclaim."""
    inventory = NodeInventory(fake_netlink, sysfs=Sysfs(tmp_path))
    await inventory.scan()  # the fixture's links: ens1f0 (3) may be published, cni0 (11) may not
    changes = cast(AsyncGenerator[None], inventory.changes())
    ignored = [
        [LinkChange("RTM_NEWLINK", 40, name="veth1a2b3c4d"), LinkChange("RTM_NEWLINK", 11, name="cni0")],
        [LinkChange("RTM_NEWADDR", 40, scope=253), LinkChange("RTM_DELLINK", 40, name="veth1a2b3c4d")],
    ]
    for batch in ignored:
        fake_netlink.batches.put_nowait(batch)
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWADDR", 3, scope=0)])
    await anext(changes)
    assert fake_netlink.batches.empty()  # the ignored batches were read, and yielded nothing
    for relevant in (
        LinkChange("RTM_NEWLINK", 3, name="ens1f0"),
        LinkChange("RTM_NEWLINK", 3, name="veth-renamed"),  # a link that may be published, renamed
        LinkChange("RTM_NEWLINK", 12, name="enp12s0"),  # a new NIC
    ):
        fake_netlink.batches.put_nowait([relevant])
        await anext(changes)
    await changes.aclose()


async def test_the_primary_networks_links_are_dropped_undecoded_after_their_first_event(
    fake_netlink: FakeNetlink, tmp_path: Path
) -> None:
    """Decoding the dozen RTM_NEWLINK of each pod's veth was a tenth of the agent's CPU in a burst: the
    links a scan (or a first event) found named as the primary network's are dropped by index, until their
    RTM_DELLINK frees the index for another link."""
    inventory = NodeInventory(fake_netlink, sysfs=Sysfs(tmp_path))
    await inventory.scan()  # the fixture's veth1a2b (8), cali0c1d (9) and cni0 (11)
    changes = cast(AsyncGenerator[None], inventory.changes())
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", index, name="x") for index in (8, 9, 11)])
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 40, name="veth40")])  # new: decoded once
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 40, name="veth40")] * 4)
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWADDR", 40, scope=0)])  # even a global address
    fake_netlink.batches.put_nowait([LinkChange("RTM_DELLINK", 40, name="veth40")])
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 40, name="enp40s0")])  # its index, reused
    await anext(changes)
    assert fake_netlink.batches.empty()
    assert fake_netlink.quieted == 3 + 5, "the known veths' and the new veth's later events were dropped"
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 3, name="ens1f0")])  # a NIC: never quiet
    await anext(changes)
    assert fake_netlink.quieted == 8
    fake_netlink.known_links.append(link(41, "veth41", "veth"))
    await inventory.scan()  # a rescan while the events are followed: its veths are quiet too
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 41, name="veth41")])
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 3, name="ens1f0")])
    await anext(changes)
    assert fake_netlink.quieted == 9
    await changes.aclose()


async def test_a_nics_own_event_that_changes_nothing_scanned_wakes_no_rescan(
    fake_netlink: FakeNetlink, tmp_path: Path
) -> None:
    """A macvlan made on a NIC and moved into a pod gives the NIC two RTM_NEWLINK that alter nothing the
    scan reads; every attach and every detach cost the node a rescan."""
    inventory = NodeInventory(fake_netlink, sysfs=Sysfs(tmp_path))
    await inventory.scan()
    changes = cast(AsyncGenerator[None], inventory.changes())
    as_scanned = link(3, "ens1f0")
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 3, name="ens1f0", link=as_scanned)] * 2)
    fake_netlink.batches.put_nowait([LinkChange("RTM_NEWADDR", 3, scope=0)])
    await anext(changes)
    assert fake_netlink.batches.empty()  # the NIC's unchanged links were read, and yielded nothing
    for changed in (
        dataclasses.replace(as_scanned, mtu=9000),
        dataclasses.replace(as_scanned, operstate="LOWERLAYERDOWN"),  # its carrier lost
        dataclasses.replace(as_scanned, vf_count=8),
        dataclasses.replace(as_scanned, up=not as_scanned.up),
    ):
        fake_netlink.batches.put_nowait([LinkChange("RTM_NEWLINK", 3, name="ens1f0", link=changed)])
        await anext(changes)
    fake_netlink.batches.put_nowait([LinkChange("RTM_DELLINK", 3, name="ens1f0", link=as_scanned)])
    await anext(changes)
    await changes.aclose()


# --- FileInventory -------------------------------------------------------------------------------------

INVENTORY = """\
- {name: enp1s0, index: 2, kind: physical, mac: "02:00:00:00:00:02", mtu: 9000, up: true, virtual: false,
   speed_bps: 25000000000, pci_address: "0000:5e:00.0", ipv4: [192.0.2.2/24], overridden: [speed_bps]}
- {name: veth0, index: 3, kind: veth, mac: "02:00:00:00:00:03", mtu: 1500, up: false, virtual: true,
   never_publish: primary pod network interface}
"""


async def test_file_inventory_scan(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    enp1s0, veth0 = await FileInventory(path).scan()
    assert enp1s0 == NetworkInterface(
        name="enp1s0",
        index=2,
        kind="physical",
        mac="02:00:00:00:00:02",
        mtu=9000,
        up=True,
        virtual=False,
        speed_bps=25_000_000_000,
        pci_address="0000:5e:00.0",
        ipv4=("192.0.2.2/24",),
        overridden=("speed_bps",),
    )
    assert veth0.never_publish == "primary pod network interface" and veth0.ipv6 == ()
    path.write_text("")
    assert await FileInventory(path).scan() == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, "cannot read the inventory", id="absent"),
        pytest.param("- [unclosed", "cannot read the inventory", id="not yaml"),
        pytest.param("interfaces: []", "expected a list of interfaces", id="not a list"),
        pytest.param(
            INVENTORY + "- {name: x, colour: red}\n", r"\[2\]: unknown fields \['colour'\]", id="unknown"
        ),
    ],
)
async def test_file_inventory_errors_name_the_file(tmp_path: Path, text: str | None, expected: str) -> None:
    path = tmp_path / "inventory.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as err:
        await FileInventory(path).scan()
    assert str(err.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param("- 5\n", id="a number"),
        pytest.param("- \n", id="an empty entry"),
        pytest.param("- {name: enp1s0, index: 2}\n", id="missing fields"),
    ],
)
async def test_file_inventory_refuses_any_bad_entry_as_a_config_error(tmp_path: Path, entry: str) -> None:
    """A bad inventory file must stop the agent with its name (agent.run scans before it starts), never
    look like a bug in netclaim (a TypeError is logged with a traceback and retried forever)."""
    path = tmp_path / "inventory.yaml"
    path.write_text(entry)
    with pytest.raises(ConfigError, match=r"\[0\]"):
        await FileInventory(path).scan()


async def test_file_inventory_changes_when_the_file_does(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    changes = FileInventory(path, poll_seconds=0).changes()
    assert isinstance(changes, AsyncGenerator)
    first = asyncio.ensure_future(anext(changes))
    for _ in range(20):  # let it poll the unchanged file many times (zero sleeps are yields, not waits)
        await asyncio.sleep(0)
    assert not first.done(), "an unchanged file is no change"
    os.utime(path, ns=(2_000_000_000, 2_000_000_000))
    async with asyncio.timeout(10):
        await first
    second = asyncio.ensure_future(anext(changes))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not second.done(), "a change is reported once"
    path.unlink()  # gone is a change too
    async with asyncio.timeout(10):
        await second
    await changes.aclose()


def test_an_empty_or_absent_overrides_file_declares_nothing_and_an_unreadable_one_is_an_error(
    tmp_path: Path,
) -> None:
    """The DaemonSet mounts the node's /etc/netclaim: most nodes have no file there; one that cannot be
    read is a mistake, said with the path."""
    empty = tmp_path / "nic-overrides.yaml"
    empty.touch()
    assert load_overrides(empty) == {}
    assert load_overrides(tmp_path / "absent.yaml") == {}
    (tmp_path / "a-directory.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"a-directory\.yaml: cannot read"):
        load_overrides(tmp_path / "a-directory.yaml")
