"""Fail closed: a container of a pod with a netclaim claim never starts without the claim's interfaces.

containerd runs the NRI hooks only while the agent answers: a RunPodSandbox that finds the agent down,
stalled or late lets the sandbox start unconfigured. So prepare also returns, per claim, a CDI device
(`netclaim.dev/net=<interfaces>-<digest>`, one for all the claims that ask the same interfaces) whose spec
gives every container that uses the claim a `createRuntime` OCI hook. runc runs it on the host after
the container's namespaces exist and before its process starts; it checks, in the container's own
network namespace (`/proc/<pid>/net/dev`, the pid from the OCI state on its stdin), that each of the
claim's interfaces is there, and fails otherwise: the container is not created and kubelet retries it,
until the agent (back, or done) has attached them.

The hook needs nothing of netclaim's on the host: /bin/sh and its builtins. It checks the kernel, not the
agent's state, so a restart with a lost state directory never blocks a pod whose interface is in place,
and pods without our claims are never touched. Failure modes (docs/security.md): containerd without CDI
(`enable_cdi = false`) ignores the device and fails open; a CDI spec directory the agent cannot write
fails the claim's prepare (kubelet retries).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from netclaim.errors import StateStoreError

CDI_KIND = "netclaim.dev/net"
CDI_VERSION = "0.6.0"
FILE_PREFIX = "netclaim.dev-"


def device_name(interfaces: list[str]) -> str:
    """The CDI device of the claims that ask these interfaces: named after the hook it runs, so that a
    netclaim whose hook differs never takes another version's file for its own."""
    digest = hashlib.sha256(hook_script(interfaces).encode()).hexdigest()[:16]
    return f"{'_'.join(interfaces)[:40]}-{digest}"


def hook_script(interfaces: list[str]) -> str:
    """The shell line of the hook: every interface must be in the container's network namespace.

    Shell builtins only: runc starts one process per container (sh), not a pipeline of sed, cut and grep
    per interface. Names are compared whole and literally, each held in its own quoted word."""
    missing = [f"m{index}=1" for index in range(len(interfaces))]
    found = " ".join(
        f'[ "$name" = {shlex.quote(name)} ] && m{index}=;' for index, name in enumerate(interfaces)
    )
    message = (
        f"netclaim: interfaces {' '.join(interfaces)} of the pod's claim are not attached yet; "
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


def spec(interfaces: list[str]) -> dict[str, Any]:
    """The CDI spec of the claims that ask these interfaces."""
    hook = {"hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", hook_script(interfaces)]}
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": device_name(interfaces), "containerEdits": {"hooks": [hook]}}],
    }


class CdiGate:
    """The gate's CDI specs in the runtime's CDI directory, one per set of interfaces: the claims that ask
    the same interfaces (most ask net1) share one device and its file, written when the first of them is
    prepared and removed when the last is unprepared. containerd rescans every spec of its CDI directories
    at each change there: a file per claim made each prepare cost O(claims on the node).

    The claims in use are the store's at start (`prepared`: claim UID, interface name of each row); a file
    there that no stored claim uses (the state directory was lost) may serve a running pod's restarts, so it
    is never removed."""

    def __init__(self, spec_dir: Path, prepared: Iterable[tuple[str, str]] = ()) -> None:
        self.spec_dir = spec_dir
        interfaces: dict[str, list[str]] = defaultdict(list)
        for claim_uid, interface in prepared:
            interfaces[claim_uid].append(interface)
        self._users: dict[str, set[str]] = defaultdict(set)  # device name → UIDs of the claims using it
        for claim_uid, names in interfaces.items():
            self._users[device_name(names)].add(claim_uid)
        found = spec_dir.glob(f"{FILE_PREFIX}*.json") if spec_dir.is_dir() else ()
        self._kept = {p.name.removeprefix(FILE_PREFIX).removesuffix(".json") for p in found} - set(
            self._users
        )

    def path(self, name: str) -> Path:
        return self.spec_dir / f"{FILE_PREFIX}{name}.json"

    def write(self, claim_uid: str, interfaces: list[str]) -> list[str]:
        """The claim's CDI device IDs, its spec written (atomically) unless another claim's is in place."""
        name = device_name(interfaces)
        target = self.path(name)
        if not target.exists():
            try:
                self.spec_dir.mkdir(parents=True, exist_ok=True)
                temporary = target.with_suffix(".tmp")
                temporary.write_text(json.dumps(spec(interfaces), indent=1))
                temporary.replace(target)
            except OSError as err:
                raise StateStoreError(f"CDI spec {target}: {err.strerror}") from err
        self._users[name].add(claim_uid)
        return [f"{CDI_KIND}={name}"]

    def remove(self, claim_uid: str) -> None:
        """The claim no longer uses its spec: removed if no other claim does. Also a spec of its own, as
        earlier netclaims wrote them (netclaim.dev-<claim UID>.json)."""
        self.path(claim_uid).unlink(missing_ok=True)
        for name in [n for n, users in self._users.items() if claim_uid in users]:
            self._users[name].discard(claim_uid)
            if not self._users[name]:
                del self._users[name]
                if name not in self._kept:
                    self.path(name).unlink(missing_ok=True)
