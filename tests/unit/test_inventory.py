"""Hardware facts from a sysfs tree shaped like a real server's, and declared overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from netclaim.api.overrides import load_overrides
from netclaim.errors import ConfigError
from netclaim.publish.inventory import NetworkInterface, Sysfs, _apply_override, cni_bridges


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
