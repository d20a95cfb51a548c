"""A NIC as the node reports it (netclaim.agent.publish.inventory reads it): its facts, and the attributes
they become, grouped by domain as a CEL selector sees them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from netclaim.core.config.publishpolicy import AttributeValue
from netclaim.core.names import DRIVER_DOMAIN, STANDARD_DOMAIN


@dataclass(frozen=True)
class NetworkInterface:
    name: str
    index: int
    kind: str  # "physical" when the kernel reports no link kind
    mac: str
    mtu: int
    up: bool
    virtual: bool
    carrier: bool = True
    carrier_changes: int = 0  # the kernel's count of carrier losses and returns
    speed_bps: int | None = None
    driver: str | None = None
    pci_address: str | None = None
    pci_vendor: str | None = None
    pci_device: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    sriov_total_vfs: int | None = None
    sriov_num_vfs: int | None = None
    sriov_pf: str | None = None  # for a VF: the PCI address of its PF
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()
    never_publish: str | None = None  # why this interface is never a candidate, or None
    overridden: tuple[str, ...] = field(default=())  # which facts came from declared overrides


def facts_as_attributes(interface: NetworkInterface) -> dict[str, dict[str, AttributeValue]]:
    """The standard attributes of an interface, grouped by domain as CEL sees them."""
    own: dict[str, AttributeValue | None] = {
        "ifName": interface.name,
        "mac": interface.mac,
        "mtu": interface.mtu,
        "state": "up" if interface.up else "down",
        "kind": interface.kind,
        "virtual": interface.virtual,
        "speed": interface.speed_bps // 1_000_000 if interface.speed_bps else None,
        "driver": interface.driver,
        "pciAddress": interface.pci_address,
        "pciVendor": interface.pci_vendor,
        "pciDevice": interface.pci_device,
        "numaNode": interface.numa_node,
        "sriov": (interface.sriov_total_vfs or 0) > 0 if interface.sriov_total_vfs is not None else None,
        "sriovTotalVfs": interface.sriov_total_vfs,
        "sriovNumVfs": interface.sriov_num_vfs,
        "isSriovVf": interface.sriov_pf is not None,
        "sriovPF": interface.sriov_pf,
        "ipv4": interface.ipv4[0] if interface.ipv4 else None,
        "ipv6": interface.ipv6[0] if interface.ipv6 else None,
    }
    standard: dict[str, AttributeValue | None] = {
        "pcieRoot": interface.pcie_root,
        "pciBusID": interface.pci_address,
        "numaNode": interface.numa_node,  # as other drivers publish theirs: matchAttribute with their GPUs
    }
    return {
        DRIVER_DOMAIN: {k: v for k, v in own.items() if v is not None},
        STANDARD_DOMAIN: {k: v for k, v in standard.items() if v is not None},
    }


# An interface with every fact known: what policy CEL expressions and attribute names are checked against.
SAMPLE_INTERFACE = NetworkInterface(
    name="enp0s10",
    index=2,
    kind="physical",
    mac="02:00:00:00:00:01",
    mtu=1500,
    up=True,
    virtual=False,
    speed_bps=10_000_000_000,
    driver="ice",
    pci_address="0000:5e:00.0",
    pci_vendor="0x8086",
    pci_device="0x159b",
    pcie_root="pci0000:5d",
    numa_node=0,
    sriov_total_vfs=64,
    sriov_num_vfs=0,
    sriov_pf="0000:5e:00.0",
    ipv4=("192.0.2.10/24",),
    ipv6=("2001:db8::10/64",),
)


class InventorySource(Protocol):
    async def scan(self) -> list[NetworkInterface]: ...

    def changes(self) -> AsyncIterator[None]:
        """Yields once per burst of changes that may alter the scan."""
        ...
