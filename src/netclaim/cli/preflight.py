"""`netclaim preflight`: what the agent needs of its node and of the cluster, checked before it starts, each
failure with what to fix. The DaemonSet runs it as the agent pod's init container (a failed check keeps the
pod in Init with this report in its log, instead of an agent that never becomes Ready); an admin runs it on
a node by hand the same way.

Node: containerd's NRI socket answers (NRI enabled), the CDI spec directory is there and writable, the CNI
plugins netclaim runs are installed, and the kernel caps bandwidth (a veth in a new, empty network
namespace shaped exactly as a pod's interface: ifb, tbf, ingress, u32, mirred). Cluster, with the agent's
own token: it is bound to this node (the own-node admission policies read the node from it), and the API
server keeps the fields netclaim publishes (a dry-run slice: a feature gate that is off drops its fields
silently).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from netclaim.adapters.cni import find_plugin
from netclaim.core.devices.catalog import BANDWIDTH, LINK_DOWN
from netclaim.core.ipam.reservation import BINDING_FIELDS
from netclaim.core.kubeapi import PreflightApi
from netclaim.errors import ConfigError, KernelError, NetclaimError, PrerequisiteError

Severity = Literal["ok", "warn", "fail"]
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# what the agent itself runs: children of shared NICs, whole NICs moved into pods, pool addresses
DEFAULT_PLUGINS = ("macvlan", "host-device", "static")


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    detail: str  # what was found
    fix: str = ""  # what to do about it, unless ok


@dataclass(frozen=True)
class NodePaths:
    nri_socket: Path
    cdi_spec_dir: Path
    cni_bin_dirs: tuple[Path, ...]
    plugins: tuple[str, ...] = DEFAULT_PLUGINS


async def node_findings(
    paths: NodePaths,
    nri_reachable: Callable[[str], Awaitable[None]],
    probe_shaping: Callable[[], Awaitable[None]],
    probe_port_security: Callable[[], Awaitable[None]],
) -> list[Finding]:
    return [
        await _nri(paths.nri_socket, nri_reachable),
        _cdi(paths.cdi_spec_dir),
        _plugins(paths.cni_bin_dirs, paths.plugins),
        await _shaping(probe_shaping),
        await _port_security(probe_port_security),
    ]


async def _nri(socket: Path, reachable: Callable[[str], Awaitable[None]]) -> Finding:
    enable = (
        "enable NRI in the runtime and restart it: containerd 1.7, config.toml "
        '[plugins."io.containerd.nri.v1.nri"] disable = false (2.x has it on); CRI-O before 1.30, a '
        "crio.conf.d drop-in [crio.nri] enable_nri = true (docs/platforms.md); if it listens elsewhere, set "
        "agent.hostPaths.nriSocket (--nri-socket)"
    )
    try:
        await reachable(str(socket))
    except FileNotFoundError:
        return Finding("NRI", "fail", f"no socket at {socket}: the runtime's NRI is off or elsewhere", enable)
    except OSError as err:
        return Finding("NRI", "fail", f"{socket}: nothing answers ({err.strerror or err})", enable)
    return Finding("NRI", "ok", f"{socket} answers")


def _cdi(directory: Path) -> Finding:
    fix = (
        "mount the runtime's CDI spec directory (cdi_spec_dirs; /var/run/cdi by default in containerd and "
        "CRI-O) at --cdi-spec-dir (agent.hostPaths.cdiSpecDir); containerd 1.7 also needs enable_cdi = true"
    )
    if not directory.is_dir():
        return Finding("CDI", "fail", f"no directory {directory}", fix)
    if not os.access(directory, os.W_OK):
        return Finding("CDI", "fail", f"{directory} is not writable", fix)
    return Finding("CDI", "ok", f"{directory} is writable (each claim's fail-closed hook goes there)")


def _plugins(directories: tuple[Path, ...], needed: tuple[str, ...]) -> Finding:
    found: dict[str, Path] = {}
    problems: list[str] = []
    for name in needed:
        try:
            found[name] = find_plugin(directories, name)
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        return Finding(
            "CNI plugins",
            "fail",
            "; ".join(problems),
            "install the CNI reference plugins (containernetworking/plugins) in one of these directories, "
            "or add the directory where they are to agent.hostPaths.cniBinDirs (--cni-bin-dir DIR:DIR)",
        )
    where = sorted({str(path.parent) for path in found.values()})
    return Finding("CNI plugins", "ok", f"{', '.join(needed)} in {', '.join(where)}")


async def _shaping(probe: Callable[[], Awaitable[None]]) -> Finding:
    try:
        await probe()
    except KernelError as err:
        return Finding(
            "bandwidth caps",
            "fail",
            f"the kernel refused {err}",
            "load the modules named (modprobe ifb sch_tbf sch_ingress cls_u32 act_mirred), or build the "
            "kernel with them; claims on shared NICs are capped at their bandwidth with them",
        )
    return Finding("bandwidth caps", "ok", "ifb, tbf, ingress, u32 and mirred work (a veth shaped)")


async def _port_security(probe: Callable[[], Awaitable[None]]) -> Finding:
    try:
        await probe()
    except (KernelError, PrerequisiteError) as err:
        return Finding(
            "port security",
            "fail",
            f"a NIC's table or its hairpin cannot be made: {err}",
            "pods on a shared macvlan NIC are held to their own MAC and addresses by an nftables netdev "
            "egress chain (Linux >= 5.16) and tc (Debian: iproute2, nftables); without them their claims "
            "fail at prepare. Upgrade the kernel, or set portSecurity: false in the NIC's publish rule "
            "(docs/security.md says what a pod can then do)",
        )
    return Finding("port security", "ok", "nftables' netdev egress hook and tc are there")


async def api_findings(api: PreflightApi, node: str, driver: str) -> list[Finding]:
    findings = [await _token(api, node)]
    try:
        answered = await api.dry_run_slice(probe_slice(node, driver))
    except NetclaimError as err:
        findings.append(
            Finding(
                "ResourceSlice",
                "fail",
                f"a dry-run slice of node {node} was refused: {err}",
                "the agent's RBAC and the own-node admission policies must let it write its node's slices: "
                "install deploy/ or the chart as shipped",
            )
        )
        return findings
    return [*findings, *gate_findings(answered)]


async def _token(api: PreflightApi, node: str) -> Finding:
    try:
        user, extra = await api.identity()
    except NetclaimError as err:
        return Finding("node-bound token", "fail", f"the API server did not say who this is: {err}")
    bound = extra.get(NODE_NAME_EXTRA, [])
    if bound != [node]:
        return Finding(
            "node-bound token",
            "fail",
            f"{user} is bound to node {bound[0] if bound else '(none)'}, not {node}",
            "run the agent with its pod's projected ServiceAccount token (the DaemonSet's default); the API "
            "server puts the node in it (ServiceAccountTokenPodNodeInfo, on by default since 1.30)",
        )
    return Finding("node-bound token", "ok", f"{user}, bound to node {node}")


def probe_slice(node: str, driver: str) -> dict[str, Any]:
    """A slice of this node's pool with one device carrying the fields netclaim publishes that feature
    gates govern: shared capacity (DRAConsumableCapacity), a taint (DRADeviceTaints) and the pools' binding
    conditions (DRADeviceBindingConditions)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-preflight"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "preflight",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        BANDWIDTH: {
                            "value": "10G",
                            "requestPolicy": {"default": "1M", "validRange": {"min": "1M", "step": "1M"}},
                        }
                    },
                    "taints": [{"key": LINK_DOWN, "effect": "NoSchedule"}],
                    **BINDING_FIELDS,
                }
            ],
        },
    }


def gate_findings(answered: dict[str, Any]) -> list[Finding]:
    """What the API server kept of probe_slice: a gate that is off drops its fields without a word."""
    [device] = answered["spec"]["devices"]
    capacity = (device.get("capacity") or {}).get(BANDWIDTH) or {}
    consumable = device.get("allowMultipleAllocations") is True and "requestPolicy" in capacity
    taints = bool(device.get("taints"))
    return [
        Finding(
            "DRAConsumableCapacity",
            "ok" if consumable else "fail",
            "the API server keeps shared capacity"
            if consumable
            else "the API server dropped allowMultipleAllocations and requestPolicy from a dry-run slice",
            ""
            if consumable
            else "enable the DRAConsumableCapacity gate on kube-apiserver, kube-scheduler, "
            "kube-controller-manager and kubelet (on by default from 1.36; alpha before): without it no "
            "shared NIC and no IP pool can be published",
        ),
        Finding(
            "DRADeviceTaints",
            "ok" if taints else "warn",
            "the API server keeps device taints"
            if taints
            else "the API server dropped a device taint from a dry-run slice",
            ""
            if taints
            else "enable the DRADeviceTaints gate (GA in 1.37): without it a NIC whose link is "
            "down stays allocatable",
        ),
        Finding(
            "pool addresses",
            "ok",
            "the API server keeps binding conditions: the controller can reserve them before the pod binds "
            "(--address-reservation=before-binding, once kube-scheduler has DRADeviceBindingConditions too, "
            "as from 1.36 by default; docs/ipam.md)"
            if device.get("bindingConditions")
            else "taken at kubelet's prepare: the API server dropped binding conditions from a dry-run slice "
            "(DRADeviceBindingConditions off, as before 1.36; docs/ipam.md)",
        ),
    ]


def render(findings: list[Finding]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for finding in findings:
        lines.append(f"{marks[finding.severity]}  {finding.check}: {finding.detail}")
        if finding.fix:
            lines.append(f"      fix: {finding.fix}")
    failed = sum(1 for f in findings if f.severity == "fail")
    lines.append(
        f"preflight: {failed} of {len(findings)} checks failed" if failed else "preflight: every check passed"
    )
    return "\n".join(lines) + "\n"
