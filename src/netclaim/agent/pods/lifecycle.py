"""The CNI 1.1 lifecycle around attach: STATUS before an ADD, GC of what plugins keep for attachments that
are gone. Both exist only for chains that run at cniVersion 1.1.0 (the reference plugins from v1.10 on);
older chains (Debian's 1.0-level plugins) skip STATUS, and their host-local reservations are released by
hand when a DEL cannot run (adapters.cni.release_host_local).

STATUS: the attach asks every plugin of the chain before it writes anything (PluginReadiness); a plugin
that answers 50/51 fails the sandbox with its own words, kubelet retries, and the agent's /readyz names
the plugin until it answers ready again (each GC round asks again, so a plugin no pod asks for any more
does not keep the agent unready). A ready answer is believed for 30 s per network and plugin (the
adapter's STATUS_FRESH_SECONDS): the pods of a network ask once in that time.

GC: at start and every GC_SECONDS, for every network this node attached to (the store remembers each at
its first attach), with the attachments the store still holds for it (NetworkCollector). A network's
ADDs and its GC never overlap (NetworkGate): a reservation an ADD made after GC listed the valid
attachments would be collected as stale. One network failing is logged and counted; the round goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from netclaim.agent.store import State, Store
from netclaim.core.config.cniconfig import plugin_types, speaks_lifecycle
from netclaim.core.node import Cni, host_local_dirs
from netclaim.errors import CniError, PodBusyError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
GC_SECONDS = 600.0
GC_CALL_SECONDS = 10.0  # one network's GC, every plugin of its chain
HOLDING = (State.ATTACHING, State.ATTACHED)  # rows whose plugins may hold something (ADD not undone)


def network_key(conflist: dict[str, Any]) -> str:
    """What one GC covers: the network's name and where its IPAM keeps reservations (two tenants'
    networks of one name are two networks: plan.with_node_defaults gives each its own directory)."""
    return json.dumps([conflist.get("name"), [str(d) for d in host_local_dirs(conflist)]])


class NetworkGate:
    """ADDs of a network run side by side; its GC waits for those in flight and holds back new ones."""

    def __init__(self) -> None:
        self._adding: Counter[str] = Counter()
        self._drained: dict[str, asyncio.Event] = {}  # set when the key's last ADD in flight ends
        self._collecting: dict[str, asyncio.Event] = {}  # a GC under way: set when it ends

    @contextlib.asynccontextmanager
    async def adding(self, key: str, deadline: float) -> AsyncIterator[None]:
        while (collecting := self._collecting.get(key)) is not None:
            try:
                await asyncio.wait_for(collecting.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise PodBusyError(
                    "the network's CNI GC is still running; nothing was changed, the runtime will retry"
                ) from None
        self._adding[key] += 1
        try:
            yield
        finally:
            self._adding[key] -= 1
            if not self._adding[key]:
                del self._adding[key]
                drained = self._drained.pop(key, None)
                if drained is not None:
                    drained.set()

    @contextlib.asynccontextmanager
    async def collecting(self, key: str) -> AsyncIterator[None]:
        while (collecting := self._collecting.get(key)) is not None:
            await collecting.wait()
        done = self._collecting[key] = asyncio.Event()
        try:
            while self._adding[key]:
                await self._drained.setdefault(key, asyncio.Event()).wait()
            yield
        finally:
            del self._collecting[key]
            done.set()


class PluginReadiness:
    """STATUS of a chain, told to the agent's readiness as `cni/<plugin>`: False from a not-ready answer
    until the plugin's next ready one."""

    def __init__(self, cni: Cni, report: Callable[[str, bool], None]) -> None:
        self.cni = cni
        self.report = report

    async def check(self, conflist: dict[str, Any], deadline: float) -> None:
        if not speaks_lifecycle(conflist):
            return
        try:
            await self.cni.status(conflist, deadline)
        except CniError as err:
            metrics.CNI_NOT_READY.labels(plugin=err.plugin).inc()
            self.report(f"cni/{err.plugin}", False)
            raise
        for kind in plugin_types(conflist):
            self.report(f"cni/{kind}", True)


class NetworkCollector:
    """GC of every network this node has attached to (the module's text)."""

    def __init__(
        self,
        store: Store,
        cni: Cni,
        gate: NetworkGate,
        readiness: PluginReadiness,
        seconds: float = GC_SECONDS,
    ) -> None:
        self.store = store
        self.cni = cni
        self.gate = gate
        self.readiness = readiness
        self.seconds = seconds

    async def run(self) -> None:
        """A round now, then one every `seconds` (what the agent keeps running)."""
        while True:
            await self.collect()
            await asyncio.sleep(self.seconds)

    async def collect(self) -> dict[str, list[str]]:
        """One round; returns what each network's GC removed (host-local's addresses), by network name."""
        removed: dict[str, list[str]] = {}
        for key, conflist in self.store.networks().items():
            try:
                removed[str(conflist.get("name"))] = await self._collect(key, conflist)
            except Exception as err:  # this network's only: the round goes on, the next one retries it
                metrics.CNI_GC_RUNS.labels(result="error").inc()
                log.warning(
                    "CNI GC of a network failed; the next round retries",
                    extra={"network": conflist.get("name"), "error": str(err)},
                    exc_info=None if isinstance(err, CniError) else err,
                )
        return removed

    async def _collect(self, key: str, conflist: dict[str, Any]) -> list[str]:
        with contextlib.suppress(CniError):  # said by the readiness; GC is still worth running
            await self.readiness.check(conflist, time.monotonic() + GC_CALL_SECONDS)
        async with self.gate.collecting(key):
            valid = sorted(
                {
                    (row.sandbox_id, row.plan.interface_name)
                    for row in self.store.all()
                    if row.state in HOLDING and network_key(row.plan.conflist) == key
                }
            )
            before = self.cni.host_local_reservations(conflist)
            await self.cni.gc(conflist, valid, time.monotonic() + GC_CALL_SECONDS)
            left = self.cni.host_local_reservations(conflist)
            if not valid and not left:  # nothing of it left here: its next attach remembers it again
                await self.store.forget_network(key)
        removed = sorted(before - left)
        metrics.CNI_GC_RUNS.labels(result="ok").inc()
        metrics.CNI_GC_REMOVED.inc(len(removed))
        if removed:
            log.info(
                "CNI GC removed plugin leftovers",
                extra={"network": conflist.get("name"), "removed": removed, "valid": len(valid)},
            )
        return removed
