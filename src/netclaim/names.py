"""DRA device names: always a valid DNS label, stable for the same NIC.

- a NIC with a PCI address: `pci-<domain>-<bus>-<device>-<function>` (survives renames);
- else its ifName, when that already is a DNS label;
- else `net-<base32 of the ifName, lower case, no padding>` (reversible, collision-free).
"""

from __future__ import annotations

import base64
import re

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def is_dns_label(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))


def device_name(if_name: str, pci_address: str | None = None) -> str:
    if pci_address and _PCI_ADDRESS.match(pci_address):
        return "pci-" + pci_address.replace(":", "-").replace(".", "-")
    if is_dns_label(if_name):
        return if_name
    encoded = base64.b32encode(if_name.encode()).decode().rstrip("=").lower()
    return f"net-{encoded}"
