"""Names and their syntax, one regex each (matched whole: a trailing newline is not a name).

DRA device names are always a valid DNS label, stable for the same NIC:
- a NIC with a PCI address: `pci-<domain>-<bus>-<device>-<function>` (survives renames);
- else its ifName, when that already is a DNS label;
- else `net-<base32 of the ifName, lower case, no padding>` (reversible, collision-free).
"""

from __future__ import annotations

import base64
import re

DRIVER_DOMAIN = "netclaim.dev"
STANDARD_DOMAIN = "resource.kubernetes.io"
POD_CLAIM_NAME = (
    f"{STANDARD_DOMAIN}/pod-claim-name"  # on a claim made from a pod's template: the pod's name for it
)
API_VERSION = f"{DRIVER_DOMAIN}/v1alpha1"
SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"  # which controller keeps an EndpointSlice
SLICE_SERVICE_NAME = "kubernetes.io/service-name"  # the Service an EndpointSlice is of
# The ConfigMaps of network policy rules the controller writes for the agents (netclaim.controller.policy)
POLICY_RULES_LABEL = f"{DRIVER_DOMAIN}/policy-rules"
POLICY_RULES_KEY = "rules.json"
# The network a NIC is on: the attribute the admin's publish policy sets, IPPool.spec.network, the label
# of a Service over it, and the key that carries it in a claim's status.devices[].data.
NETWORK = f"{DRIVER_DOMAIN}/network"

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
PCI_ID = re.compile(r"0x[0-9a-f]{4}")
MAC = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")
# Linux accepts any 1-15 bytes but '/', ':' and white space; a name inside a pod is narrower, so that it
# is one token in every status, Event, log line and tool that shows it: ASCII letters, digits, '_', '.',
# '-', starting with a letter or digit (no control characters, no NUL, no `%d` kernel template).
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
# Names a pod's interface may not take: loopback, the primary network's interface, and the prefix of the
# ingress-shaping devices netclaim creates beside it (netclaim.adapters.netlink.ifb_name).
RESERVED_INTERFACE_NAMES = frozenset({"lo", "eth0", "all", "default"})  # the last two: sysctl net.*.conf.X
RESERVED_INTERFACE_PREFIX = "ifb"
# A CNI network's name (the spec's rule): host-local keys its reservations by it, libcni its cache files.
NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
PLUGIN_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
QUALIFIED_NAME = re.compile(
    r"(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}"
)


def pattern(regex: re.Pattern[str]) -> str:
    """The regex anchored at both ends, for `msgspec.Meta(pattern=...)`."""
    return rf"^(?:{regex.pattern})\Z"


def is_dns_label(name: str) -> bool:
    return DNS_LABEL.fullmatch(name) is not None


def check_interface_name(name: str) -> str:
    """`name` when it may name a NIC (on the node or in a pod); else a ValueError."""
    if INTERFACE_NAME.fullmatch(name) is None:
        raise ValueError(
            f"{name!r} is not a usable interface name: 1-15 of A-Z a-z 0-9 _ . -, starting with a letter "
            "or digit"
        )
    return name


def check_pod_interface_name(name: str) -> str:
    """`name` when a pod's interface may take it: a usable name that is not the pod's loopback or primary
    interface, nor one of netclaim's shaping devices; else a ValueError."""
    check_interface_name(name)
    if name in RESERVED_INTERFACE_NAMES or name.startswith(RESERVED_INTERFACE_PREFIX):
        raise ValueError(
            f"{name!r} is taken inside the pod: lo, eth0 (the primary network), all and default (the "
            "sysctls of every interface) and ifb* (netclaim's shaping devices) are not a claim's to name"
        )
    return name


def device_name(if_name: str, pci_address: str | None = None) -> str:
    if pci_address and PCI_ADDRESS.fullmatch(pci_address):
        return "pci-" + pci_address.replace(":", "-").replace(".", "-")
    if is_dns_label(if_name):
        return if_name
    encoded = base64.b32encode(if_name.encode()).decode().rstrip("=").lower()
    return f"net-{encoded}"
