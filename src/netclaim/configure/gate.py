"""Fail closed: a container of a pod with a netclaim claim never starts without the claim's interfaces.

containerd runs the NRI hooks only while the agent answers: a RunPodSandbox that finds the agent down,
stalled or late lets the sandbox start unconfigured. So prepare also returns, per claim, a CDI device
(`netclaim.dev/net=<claim UID>`) whose spec gives every container that uses the claim a `createRuntime`
OCI hook. runc runs it on the host after the container's namespaces exist and before its process starts;
it checks, in the container's own network namespace (`/proc/<pid>/net/dev`, the pid from the OCI state on
its stdin), that each of the claim's interfaces is there, and fails otherwise: the container is not
created and kubelet retries it, until the agent (back, or done) has attached them.

The hook needs nothing of netclaim's on the host: /bin/sh and its builtins. It checks the kernel, not the
agent's state, so a restart with a lost state directory never blocks a pod whose interface is in place,
and pods without our claims are never touched. Failure modes (docs/security.md): containerd without CDI
(`enable_cdi = false`) ignores the device and fails open; a CDI spec directory the agent cannot write
fails the claim's prepare (kubelet retries).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from netclaim.errors import StateStoreError

CDI_KIND = "netclaim.dev/net"
CDI_VERSION = "0.6.0"


def device_id(claim_uid: str) -> str:
    return f"{CDI_KIND}={claim_uid}"


def hook_script(claim: str, interfaces: list[str]) -> str:
    """The shell line of the hook: every interface must be in the container's network namespace.

    Shell builtins only: runc starts one process per container (sh), not a pipeline of sed, cut and grep
    per interface. Names are compared whole and literally, each held in its own quoted word."""
    missing = [f"m{index}=1" for index in range(len(interfaces))]
    found = " ".join(
        f'[ "$name" = {shlex.quote(name)} ] && m{index}=;' for index, name in enumerate(interfaces)
    )
    message = (
        f"netclaim: interfaces {' '.join(interfaces)} of claim {claim} are not attached yet; "
        "the container waits for them (kubelet retries)"
    )
    all_found = "".join(f"$m{index}" for index in range(len(interfaces)))
    return (
        # the OCI state on stdin (one JSON line, maybe without its newline): the container's pid
        'IFS= read -r state; pid=${state#*\\"pid\\":}; [ "$pid" != "$state" ] || pid=; '
        'pid=${pid#"${pid%%[! ]*}"}; pid=${pid%%[!0-9]*}; '
        f"{' '.join(missing)}; n=0; "
        # /proc/<pid>/net/dev: two header lines, then "  <name>: <counters>" per interface
        '[ -n "$pid" ] && while IFS= read -r line; do n=$((n + 1)); [ "$n" -gt 2 ] || continue; '
        f'name=${{line%%:*}}; name=${{name##* }}; {found} done < "/proc/$pid/net/dev"; '
        f'[ -n "$pid" ] && [ -z "{all_found}" ] || {{ printf "%s\\n" {shlex.quote(message)} >&2; exit 1; }}'
    )


def spec(claim: str, claim_uid: str, interfaces: list[str]) -> dict[str, Any]:
    """The CDI spec of one claim."""
    hook = {
        "hookName": "createRuntime",
        "path": "/bin/sh",
        "args": ["sh", "-c", hook_script(claim, interfaces)],
    }
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": claim_uid, "containerEdits": {"hooks": [hook]}}],
    }


class CdiGate:
    """The claims' CDI specs in the runtime's CDI directory, one file per claim."""

    def __init__(self, spec_dir: Path) -> None:
        self.spec_dir = spec_dir

    def path(self, claim_uid: str) -> Path:
        return self.spec_dir / f"netclaim.dev-{claim_uid}.json"

    def write(self, claim: str, claim_uid: str, interfaces: list[str]) -> list[str]:
        """Write (atomically) the claim's spec; returns its CDI device IDs."""
        target = self.path(claim_uid)
        try:
            self.spec_dir.mkdir(parents=True, exist_ok=True)
            temporary = target.with_suffix(".tmp")
            temporary.write_text(json.dumps(spec(claim, claim_uid, interfaces), indent=1))
            temporary.replace(target)
        except OSError as err:
            raise StateStoreError(f"CDI spec {target}: {err.strerror}") from err
        return [device_id(claim_uid)]

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)
