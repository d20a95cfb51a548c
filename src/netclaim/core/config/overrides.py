"""`kind: NicOverrides`: facts a veth (or a lying driver) cannot report, declared per interface.

    apiVersion: netclaim.dev/v1alpha1
    kind: NicOverrides
    interfaces:
      enp0s10: {speed: 10G, numaNode: 0, pciAddress: "0000:5e:00.0", pcieRoot: pci0000:5d}

The local cluster file's NIC `properties` are the same type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from netclaim.core.config.files import load_yaml_model
from netclaim.core.names import PCI_ADDRESS, PCI_ID, PCIE_ROOT, pattern
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError


class NicOverride(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    speed: str | None = None  # link speed as a Kubernetes quantity of bits/s
    numaNode: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    pciAddress: Annotated[str, msgspec.Meta(pattern=pattern(PCI_ADDRESS))] | None = None
    pcieRoot: Annotated[str, msgspec.Meta(pattern=pattern(PCIE_ROOT))] | None = None
    pciVendor: Annotated[str, msgspec.Meta(pattern=pattern(PCI_ID))] | None = None
    pciDevice: Annotated[str, msgspec.Meta(pattern=pattern(PCI_ID))] | None = None
    driver: Annotated[str, msgspec.Meta(max_length=64)] | None = None

    def __post_init__(self) -> None:
        if self.speed is not None:
            try:
                parse_quantity(self.speed)
            except ConfigError as err:
                raise ValueError(f"speed: {err}") from None


class NicOverrides(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["NicOverrides"]
    interfaces: dict[str, NicOverride] = msgspec.field(default_factory=dict)


def load_overrides(path: Path | None) -> dict[str, NicOverride]:
    """A missing or empty file declares nothing: the DaemonSet mounts the node's /etc/netclaim, where an
    administrator writes the file on the nodes that need it."""
    if path is None:
        return {}
    try:
        if path.stat().st_size == 0:
            return {}
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    return load_yaml_model(path, NicOverrides, "kind: NicOverrides").interfaces
