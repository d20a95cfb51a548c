"""Run CNI plugins (spec 1.1, and the ≤ 1.0.0 plugins distributions ship): ADD, DEL, VERSION.

Plugins run only from the configured directory, by name (never a path), without a shell, with a bounded
time. A network config list is a chain: ADD runs the plugins in order passing each result on as
`prevResult`; DEL runs them in reverse with the final ADD result. A chain that fails half-way is rolled
back with DEL by the caller (netclaim.attach).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netclaim.config import PLUGIN_TYPE
from netclaim.errors import ConfigError, NetclaimError

log = logging.getLogger(__name__)

DEFAULT_BIN_DIR = Path("/usr/lib/cni")


class CniError(NetclaimError):
    """A plugin failed (its CNI error code and message) or could not be run in time."""

    def __init__(self, plugin: str, command: str, code: int, message: str, details: str = "") -> None:
        self.plugin, self.command, self.code, self.message, self.details = (
            plugin,
            command,
            code,
            message,
            details,
        )
        detail = f" ({details})" if details else ""
        super().__init__(f"CNI {command} {plugin}: code {code}: {message}{detail}")


@dataclass(frozen=True)
class Invocation:
    """Who the plugins act for: the runtime's container ID, the netns and the interface name."""

    container_id: str
    netns: str
    if_name: str
    args: str  # CNI_ARGS


def cni_args(namespace: str, pod: str, sandbox_id: str, pod_uid: str) -> str:
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};"
        f"K8S_POD_INFRA_CONTAINER_ID={sandbox_id};K8S_POD_UID={pod_uid}"
    )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def plugin_types(conflist: dict[str, Any]) -> list[str]:
    """Every binary a chain will run: each plugin and each delegated IPAM plugin."""
    types = []
    for plugin in conflist["plugins"]:
        types.append(str(plugin["type"]))
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and "type" in ipam:
            types.append(str(ipam["type"]))
    return types


class CniRunner:
    def __init__(
        self,
        bin_dir: Path = DEFAULT_BIN_DIR,
        allowed: frozenset[str] | None = None,
        timeout: float = 10.0,
        ipam_data_dir: Path | None = None,
    ) -> None:
        self.bin_dir = bin_dir.resolve()
        self.allowed = allowed
        self.timeout = timeout
        self.ipam_data_dir = ipam_data_dir
        self._versions: dict[str, tuple[float, list[str]]] = {}

    def with_node_defaults(self, conflist: dict[str, Any]) -> dict[str, Any]:
        """The config list with this node's defaults filled in where the config names none: host-local
        IPAM keeps its reservations in `ipam_data_dir` (when set), not in the plugin's /var/lib/cni."""
        if self.ipam_data_dir is None:
            return conflist
        plugins = []
        for plugin in conflist["plugins"]:
            ipam = plugin.get("ipam")
            if isinstance(ipam, dict) and ipam.get("type") == "host-local" and "dataDir" not in ipam:
                plugin = {**plugin, "ipam": {**ipam, "dataDir": str(self.ipam_data_dir)}}
            plugins.append(plugin)
        return {**conflist, "plugins": plugins}

    def plugin_path(self, kind: str) -> Path:
        """The binary for plugin `kind`, or a ConfigError saying why it cannot run."""
        if not PLUGIN_TYPE.match(kind):
            raise ConfigError(f"plugin type {kind!r}: not a plugin name (no paths)")
        if self.allowed is not None and kind not in self.allowed:
            raise ConfigError(
                f"plugin type {kind!r}: not allowed on this node (allowed: {sorted(self.allowed)})"
            )
        path = self.bin_dir / kind
        if path.resolve().parent != self.bin_dir or not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"plugin type {kind!r}: no such plugin in {self.bin_dir}")
        return path

    async def _exec(
        self, kind: str, command: str, stdin: dict[str, Any], invocation: Invocation | None, deadline: float
    ) -> dict[str, Any]:
        path = self.plugin_path(kind)
        env = {"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        if invocation is not None:
            env |= {
                "CNI_CONTAINERID": invocation.container_id,
                "CNI_NETNS": invocation.netns,
                "CNI_IFNAME": invocation.if_name,
                "CNI_ARGS": invocation.args,
            }
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CniError(kind, command, 11, "no time left for the plugin (the runtime's hook budget)")
        process = await asyncio.create_subprocess_exec(
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(
                process.communicate(json.dumps(stdin).encode()), remaining
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the plugin and anything it started
            await process.wait()
            raise CniError(kind, command, 11, f"timed out after {remaining:.2f} s") from None
        output = _json(stdout)
        if process.returncode != 0:
            raise CniError(
                kind,
                command,
                int(output.get("code", 999)),
                str(output.get("msg") or stderr.decode(errors="replace").strip() or "failed"),
                str(output.get("details", "")),
            )
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

    async def negotiate(self, conflist: dict[str, Any]) -> dict[str, Any]:
        """The config list with `cniVersion` set to the highest version every plugin of the chain speaks.

        `cniVersions` lists what the config accepts; a lone `cniVersion` is the highest it accepts (older
        plugins are then spoken to in the highest version they share, ≥ 0.4.0, which a log line notes).
        """
        wanted = conflist.get("cniVersions") or [conflist["cniVersion"]]
        supported = [set(await self.versions(kind)) for kind in plugin_types(conflist)]
        common = set.intersection(*supported) if supported else set()
        candidates = sorted((v for v in common if v in wanted), key=_version_key, reverse=True)
        if not candidates and "cniVersions" not in conflist:
            ceiling = _version_key(conflist["cniVersion"])
            candidates = sorted(
                (v for v in common if (0, 4, 0) <= _version_key(v) <= ceiling), key=_version_key, reverse=True
            )
            if candidates:
                log.info(
                    "CNI version lowered to what the installed plugins speak",
                    extra={"asked": conflist["cniVersion"], "using": candidates[0]},
                )
        if not candidates:
            raise ConfigError(
                f"cniVersion: the config asks for {wanted}, the installed plugins "
                f"{plugin_types(conflist)} share only {sorted(common, key=_version_key)}"
            )
        negotiated = {k: v for k, v in conflist.items() if k != "cniVersions"}
        negotiated["cniVersion"] = candidates[0]
        return negotiated

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
    try:
        value = json.loads(data or b"{}")
    except ValueError:
        return {"msg": data.decode(errors="replace").strip()[:500]}
    return value if isinstance(value, dict) else {}
