"""Run CNI plugins (spec 1.1, and the ≤ 1.0.0 plugins distributions ship): ADD, DEL, CHECK, VERSION, and
for chains of cniVersion 1.1.0, STATUS and GC.

Plugins run only from the configured directories (the first that has one: /opt/cni/bin, then Debian's
/usr/lib/cni by default), by name (never a path), without a shell, with a bounded
time, and never outlive the call that started them (a timeout or a cancellation kills the plugin's process
group before the call ends). A network config list is a chain: ADD runs the plugins in order passing each
result on as `prevResult`; DEL runs them in reverse with the final ADD result. A chain that fails half-way
is rolled back with DEL by the caller (netclaim.agent.pods.attach).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netclaim.adapters import processes
from netclaim.core.config.cniconfig import garbage_collected, speaks_lifecycle
from netclaim.core.names import PLUGIN_TYPE
from netclaim.core.node import Invocation, host_local_dirs
from netclaim.errors import CNI_TRY_AGAIN, CniError, CniTryAgainError, ConfigError, NetclaimError

log = logging.getLogger(__name__)

# How long a plugin's ready answer to STATUS is believed, per network: pods of a network ask once in that
# time (kubelet itself polls the runtime's network status every 5-10 s; an ADD to a plugin that went
# unready meanwhile fails with the plugin's own error, and the next STATUS says so)
STATUS_FRESH_SECONDS = 30.0


def find_plugin(directories: Sequence[Path], kind: str) -> Path:
    """The file CNI's own lookup runs for plugin `kind` (the first of the directories that has that name;
    a plugin that delegates, as macvlan does to its IPAM plugin, looks it up the same way in CNI_PATH), or
    a ConfigError unless it is an executable file of that very directory: the search never goes on past
    a link out of it to find another."""
    for directory in directories:
        path = directory / kind
        if not os.path.lexists(path):
            continue
        if path.resolve().parent != directory.resolve() or not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(
                f"plugin type {kind!r}: {path} is not an executable file of {directory} (a link out of it?)"
            )
        return path
    raise ConfigError(f"plugin type {kind!r}: no such plugin in {', '.join(map(str, directories))}")


class CniRunner:
    def __init__(
        self,
        bin_dirs: Sequence[Path],
        allowed: frozenset[str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.bin_dirs = tuple(d.resolve() for d in bin_dirs)
        self.allowed = allowed
        self.timeout = timeout
        self._versions: dict[str, tuple[float, list[str]]] = {}
        self._ready_until: dict[str, float] = {}  # a network's plugin's STATUS answer: ready, until then

    def release_host_local(self, conflist: dict[str, Any], container_id: str) -> list[str]:
        """Remove host-local's reservations of `container_id` by hand, when its own DEL cannot run: one
        file per address in <dataDir>/<network name>/, whose first line is the container ID. Returns
        the addresses released."""
        released: list[str] = []
        if not container_id:
            return released
        for network in host_local_dirs(conflist):
            for reservation in sorted(network.glob("*")) if network.is_dir() else []:
                try:
                    owner = reservation.read_text().splitlines()[:1]
                except (OSError, UnicodeDecodeError):
                    continue
                if owner == [container_id]:
                    reservation.unlink(missing_ok=True)
                    released.append(reservation.name)
        return released

    def host_local_reservations(self, conflist: dict[str, Any]) -> set[str]:
        """The addresses host-local holds for the network (one file each, named by the address)."""
        held: set[str] = set()
        for network in host_local_dirs(conflist):
            for path in network.glob("*") if network.is_dir() else []:
                with contextlib.suppress(ValueError):
                    held.add(str(ipaddress.ip_address(path.name)))
        return held

    def plugin_path(self, kind: str) -> Path:
        """The binary for plugin `kind`, or a ConfigError saying why it cannot run."""
        if not PLUGIN_TYPE.fullmatch(kind):
            raise ConfigError(f"plugin type {kind!r}: not a plugin name (no paths)")
        if self.allowed is not None and kind not in self.allowed:
            raise ConfigError(
                f"plugin type {kind!r}: not allowed on this node (allowed: {sorted(self.allowed)})"
            )
        return find_plugin(self.bin_dirs, kind)

    async def _exec(
        self, kind: str, command: str, stdin: dict[str, Any], invocation: Invocation | None, deadline: float
    ) -> dict[str, Any]:
        path = self.plugin_path(kind)
        env = {
            "CNI_COMMAND": command,
            "CNI_PATH": ":".join(map(str, self.bin_dirs)),
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        }
        if invocation is not None:
            env |= {
                "CNI_CONTAINERID": invocation.container_id,
                "CNI_NETNS": invocation.netns,
                "CNI_IFNAME": invocation.if_name,
                "CNI_ARGS": invocation.args,
            }
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CniTryAgainError(
                kind, command, CNI_TRY_AGAIN, "no time left for the plugin (the runtime's hook budget)"
            )
        # a cancelled call (the runtime dropped the hook's connection) kills its plugin before it ends: an
        # orphaned ADD must never race the DEL of whoever repairs the pod next
        try:
            finished = await processes.run(
                [str(path)], stdin=json.dumps(stdin).encode(), env=env, time_limit=remaining
            )
        except TimeoutError:  # before OSError, its base class
            raise CniTryAgainError(
                kind, command, CNI_TRY_AGAIN, f"timed out after {remaining:.2f} s"
            ) from None
        except (OSError, ValueError) as err:  # ValueError: a NUL byte in an argument or the environment
            raise CniError(kind, command, 999, f"cannot run {path}: {err}") from err
        output = _json(finished.stdout)
        if finished.returncode != 0:
            code, message, details = output.get("code"), output.get("msg"), output.get("details")
            if not isinstance(message, str) or not message:
                message = finished.stderr.decode(errors="replace").strip()[:500] or "failed"
            code = code if isinstance(code, int) else 999
            raise CniError.of(kind, command, code, message, details if isinstance(details, str) else "")
        return output

    async def versions(self, kind: str) -> list[str]:
        """Spec versions the installed plugin speaks (cached until its binary changes)."""
        path = self.plugin_path(kind)
        stamp = path.stat().st_mtime
        cached = self._versions.get(kind)
        if cached and cached[0] == stamp:
            return cached[1]
        output = await self._exec(
            kind, "VERSION", {"cniVersion": "0.4.0"}, None, time.monotonic() + self.timeout
        )
        supported = [str(v) for v in output.get("supportedVersions", [])]
        self._versions[kind] = (stamp, supported)
        return supported

    def _stdin(
        self,
        conflist: dict[str, Any],
        plugin: dict[str, Any],
        prev: dict[str, Any] | None,
        runtime_config: dict[str, Any] | None,
    ) -> dict[str, Any]:
        stdin = {**plugin, "cniVersion": conflist["cniVersion"], "name": conflist["name"]}
        if prev is not None:
            stdin["prevResult"] = prev
        if runtime_config:
            stdin["runtimeConfig"] = runtime_config
        return stdin

    async def add(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        deadline: float,
        runtime_config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """ADD the whole chain. A failure is raised as it is: undoing the part that was added (DEL of the
        whole chain, as the spec asks after a failed ADD) is the caller's, within its own time budget."""
        result: dict[str, Any] | None = None
        for plugin in conflist["plugins"]:
            stdin = self._stdin(conflist, plugin, result, runtime_config)
            result = await self._exec(str(plugin["type"]), "ADD", stdin, invocation, deadline)
        assert result is not None
        return result

    async def status(self, conflist: dict[str, Any], deadline: float) -> None:
        """STATUS of every plugin of a 1.1 chain (each asks its own IPAM plugin); CniNotReadyError names
        the first plugin that cannot serve an ADD now. Older chains have no STATUS: nothing is asked."""
        if not speaks_lifecycle(conflist):
            return
        now = time.monotonic()
        self._ready_until = {k: until for k, until in self._ready_until.items() if until > now}
        for plugin in conflist["plugins"]:
            ipam = plugin.get("ipam")
            # the network's plugin and its IPAM plugin, not the claim's rendering (a pool claim's static
            # addresses would make every ADD ask again)
            asked = json.dumps(
                [conflist["name"], plugin["type"], ipam.get("type") if isinstance(ipam, dict) else None]
            )
            if asked in self._ready_until:
                continue
            stdin = self._stdin(conflist, plugin, None, None)
            await self._exec(str(plugin["type"]), "STATUS", stdin, None, deadline)
            self._ready_until[asked] = time.monotonic() + STATUS_FRESH_SECONDS

    async def check(
        self, conflist: dict[str, Any], invocation: Invocation, result: dict[str, Any], deadline: float
    ) -> None:
        """CHECK the chain against the ADD's `result`: the first plugin that finds its part missing or
        changed raises (CNI errors are the plugin's words). A list with `disableCheck: true` is not
        checked (the spec's key, as libcni reads it)."""
        if conflist.get("disableCheck") is True:
            return
        for plugin in conflist["plugins"]:
            stdin = self._stdin(conflist, plugin, result, None)
            await self._exec(str(plugin["type"]), "CHECK", stdin, invocation, deadline)

    async def gc(self, conflist: dict[str, Any], valid: list[tuple[str, str]], deadline: float) -> None:
        """GC of a 1.1 chain with the attachments (container ID, interface) that are still valid: each
        plugin, and the IPAM plugin it delegates to, since a main plugin need not forward GC (v1.10's
        macvlan does not). Every plugin is called even if one fails (first failure raised). Only chains
        that are garbage_collected."""
        if not garbage_collected(conflist):
            return
        attachments = [{"containerID": container, "ifname": name} for container, name in valid]
        first: NetclaimError | None = None
        for plugin in conflist["plugins"]:
            # both keys, as libcni sends them: "cni.dev/attachments" is the name plugins read before 1.1.0
            stdin = self._stdin(conflist, plugin, None, None) | {
                "cni.dev/valid-attachments": attachments,
                "cni.dev/attachments": attachments,
            }
            ipam = plugin.get("ipam")
            kinds = [str(plugin["type"])]
            if isinstance(ipam, dict) and isinstance(ipam.get("type"), str):
                kinds.append(ipam["type"])
            for kind in kinds:
                try:
                    await self._exec(kind, "GC", stdin, None, deadline)
                except NetclaimError as err:
                    log.warning("CNI GC failed", extra={"plugin": kind, "error": str(err)})
                    first = first or err
        if first is not None:
            raise first

    async def delete(
        self,
        conflist: dict[str, Any],
        invocation: Invocation,
        result: dict[str, Any] | None,
        deadline: float,
        quiet: bool = False,
    ) -> None:
        """DEL the chain in reverse order; every plugin is called even if one fails (first failure raised)."""
        first: NetclaimError | None = None
        for plugin in reversed(conflist["plugins"]):
            try:
                await self._exec(
                    str(plugin["type"]),
                    "DEL",
                    self._stdin(conflist, plugin, result, None),
                    invocation,
                    deadline,
                )
            except NetclaimError as err:
                log.warning("CNI DEL failed", extra={"plugin": plugin.get("type"), "error": str(err)})
                first = first or err
        if first is not None and not quiet:
            raise first


def _json(data: bytes) -> dict[str, Any]:
    """A plugin's answer; what is not a JSON object (or is nested past what json reads) is its message."""
    try:
        value = json.loads(data or b"{}")
    except (ValueError, RecursionError):
        return {"msg": data.decode(errors="replace").strip()[:500]}
    return value if isinstance(value, dict) else {}
