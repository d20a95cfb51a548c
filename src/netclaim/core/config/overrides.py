"""`kind: NicOverrides`: facts a veth (or a lying driver) cannot report, declared per interface.

    apiVersion: netclaim.dev/v1alpha1
    kind: NicOverrides
    interfaces:
      enp0s10: {speed: 10G, numaNode: 0, pciAddress: "0000:5e:00.0", pcieRoot: pci0000:5d}

The local cluster file's NIC `properties` are the same type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netclaim.core.config.files import load_yaml_model
from netclaim.core.names import PCI_ADDRESS, PCI_ID, PCIE_ROOT, pattern
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError


class NicOverride(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    speed: str | None = Field(default=None, description="link speed as a Kubernetes quantity of bits/s")
    numaNode: int | None = Field(default=None, ge=0, le=1023)
    pciAddress: str | None = Field(default=None, pattern=pattern(PCI_ADDRESS))
    pcieRoot: str | None = Field(default=None, pattern=pattern(PCIE_ROOT))
    pciVendor: str | None = Field(default=None, pattern=pattern(PCI_ID))
    pciDevice: str | None = Field(default=None, pattern=pattern(PCI_ID))
    driver: str | None = Field(default=None, max_length=64)

    @field_validator("speed")
    @classmethod
    def _speed(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_quantity(value)
            except ConfigError as err:
                raise ValueError(str(err)) from err
        return value


class NicOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["NicOverrides"]
    interfaces: dict[str, NicOverride] = {}


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
