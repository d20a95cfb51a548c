"""Durable state of prepared and attached interfaces: SQLite in WAL mode, written through, fsync'd.

One row per allocated device of a claim, keyed by (claim UID, pool, device, share ID); the pod UID says
which pod's sandbox gets it. Rows move prepared → attaching → attached → detached and are deleted by
NodeUnprepareResources. A row in `attaching` after a crash means an ADD may be half done: it is rolled
back (DEL) before anything else. Plans and outcomes are typed and stored as versioned JSON.

Writes never block the event loop, which must answer the runtime's hooks within their budget: they run,
one at a time, on a thread of their own with a connection of its own (_Writer): a prepare's rows (one
fsync each) after every other write asked before they start, the others in the order they were asked.
During a burst kubelet prepares many claims at once while containerd runs one hook after another under
one lock per node: a hook's write waited for every prepare's fsync queued before it (15 queued: 8.8 ms at
p50 on an idle machine's disk, 0.7 ms when it goes first). No write overtakes one about the same row:
the rows a put writes are new (prepare answers from rows already there) and nothing reads them, so
nothing writes them, before that put is made. A caller waits at most WRITE_SECONDS for its write;
past that it gets a StateStoreError (transient: the runtime or kubelet retries) while the write is still
made, in its turn. That is safe because every write records what may happen next before it happens (an
`attaching` row before ADD) or what already happened: a write the caller gave up on and that lands later
says no more than a row that is rolled back or repeated anyway. Reads run on the event loop, on a second
connection: in WAL mode they never wait for the writer, and see every write that returned.

How durable each write is, and why that is enough (WAL mode; a transaction is never half made):
- against kill -9 (or any end of the agent alone) every write that returned is kept, whatever the level:
  with synchronous=NORMAL a commit is in the kernel's page cache when it returns, and the kernel writes it;
- against a power cut or a kernel crash, only writes made with synchronous=FULL (fsync'd) are sure. The
  node reboots: every pod network namespace, every interface netclaim made, is gone; what survives is on
  disk and in the API: host-local's reservations (files in netclaim's own directory) and IPAllocations.
  So the writes that precede what outlives a reboot are FULL: a claim's prepared rows (they name the
  addresses it took in the API, kubelet's checkpoint says the claim is prepared) and, for a chain below
  CNI 1.1 or with `disableGC`, the `attaching` row written before each ADD (it makes the agent DEL, and
  host-local release, what the ADD reserved). A chain its network's GC reaches (cniconfig.
  garbage_collected) needs no fsync there: if the row is lost, it is `prepared` after the reboot, the
  pod's new sandbox is ADDed afresh (which remembers the network again if that write was lost too), and
  what the lost ADD reserved is held for a container no row names, which the network's next GC frees
  (at agent start, then every 10 min). The writes after an ADD, a rollback, a DEL and the deletion of
  rows are NORMAL: losing one leaves the row of before, and each row of before is undone or done again
  safely (an `attaching` row is rolled back, a row that reappears is unprepared again). The hook path
  pays one fsync for a chain the GC does not reach, none for one it does.
Writes after the first only change the row's state columns (`transition`): the plan is written once.

The schema is the store's own: the rows' columns and the plan's JSON (netclaim.core.plan.AttachPlan,
whose parts are msgspec Structs, unknown fields refused). Schema 3 keeps the allocated
NIC as a NicRecord; schema 2 kept publish.devices.Device as it was serialised (changing that dataclass
changed what the store read back), schema 1 untyped dicts. Older rows are migrated when the store opens;
a database of a newer schema than this agent knows is refused, and so is a row it cannot read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from netclaim.core.devices.catalog import Device
from netclaim.core.plan import AttachPlan, NicCapacity, NicRecord, PoolAddresses
from netclaim.errors import PrerequisiteError, StateStoreError

log = logging.getLogger(__name__)
SCHEMA_VERSION = 3
WRITE_SECONDS = 0.5  # the most a caller waits for the disk: a third of the runtime's hook budget
READ_BUSY_SECONDS = 0.25  # a reader waits for SQLite's own locks (a checkpoint) at most this long


class State(StrEnum):
    PREPARED = "prepared"
    ATTACHING = "attaching"
    ATTACHED = "attached"
    DETACHED = "detached"


class Interface(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The interface as read back from the pod's namespace after ADD."""

    name: str
    mac: str
    mtu: int
    addresses: tuple[str, ...]


class Outcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What the last ADD did: its CNI_ARGS (DEL needs the same), the CNI result, the interface; what the
    last CNI CHECK found amiss since, and whether DEL and ADD restored it ("" while every CHECK passed)."""

    cni_args: str = ""
    cni_result: dict[str, Any] | None = None
    interface: Interface | None = None
    check: str = ""

    def with_check(self, told: str) -> Outcome:
        return msgspec.structs.replace(self, check=told)


Key = tuple[str, str, str, str]  # claim UID, pool, device, share ID


@dataclass(frozen=True)
class Attachment:
    claim_uid: str
    pool: str
    device: str
    share_id: str
    claim_namespace: str
    claim_name: str
    request: str
    pod_uid: str
    plan: AttachPlan
    state: State = State.PREPARED
    sandbox_id: str = ""
    netns: str = ""
    outcome: Outcome = field(default_factory=Outcome)
    error: str = ""

    @property
    def key(self) -> Key:
        return (self.claim_uid, self.pool, self.device, self.share_id)

    def with_state(self, state: State, **changes: Any) -> Attachment:
        return replace(self, state=state, **changes)


_COLUMNS = (
    "claim_uid",
    "pool",
    "device",
    "share_id",
    "claim_namespace",
    "claim_name",
    "request",
    "pod_uid",
    "plan",
    "state",
    "sandbox_id",
    "netns",
    "result",
    "error",
)
_PLAN = _COLUMNS.index("plan")
_JSON = msgspec.json.Encoder()
_PLAN_JSON = msgspec.json.Decoder(AttachPlan)
_OUTCOME_JSON = msgspec.json.Decoder(Outcome)


def _plan_v1(plan: dict[str, Any]) -> AttachPlan:
    """A schema-1 plan (an untyped dict; its NIC a record of lists) as an AttachPlan."""
    record = plan["deviceRecord"]
    fields = ("value", "default", "minimum", "step", "maximum")
    return AttachPlan(
        interface_name=plan["interfaceName"],
        conflist=plan["conflist"],
        bandwidth_bps=plan.get("bandwidth"),
        nic=NicRecord(
            name=record["name"],
            if_name=record["ifName"],
            shared=record["shared"],
            attributes=record["attributes"],
            capacity={
                k: NicCapacity(**dict(zip(fields, v, strict=False))) for k, v in record["capacity"].items()
            },
        ),
    )


def _plan_v2(plan: dict[str, Any]) -> AttachPlan:
    """A schema-2 plan (plan version 1 or 2: its NIC as publish.devices.Device was serialised then)."""
    device = plan["device"]
    return AttachPlan(
        interface_name=plan["interface_name"],
        conflist=plan["conflist"],
        bandwidth_bps=plan["bandwidth_bps"],
        nic=NicRecord(
            name=device["name"],
            if_name=device["if_name"],
            shared=device["shared"],
            attributes=device["attributes"],
            capacity={k: msgspec.convert(c, NicCapacity) for k, c in device["capacity"].items()},
        ),
        pool_addresses=tuple(msgspec.convert(p, PoolAddresses) for p in plan.get("pool_addresses", ())),
    )


def _outcome_v1(result: dict[str, Any]) -> Outcome:
    interface = result.get("interface")
    return Outcome(
        cni_args=str(result.get("args", "")),
        cni_result=result.get("cni"),
        interface=Interface(**{**interface, "addresses": tuple(interface["addresses"])})
        if interface
        else None,
    )


def _migrated(schema: int, plan: str, result: str) -> tuple[str, str]:
    """A row's plan and outcome (JSON) of schema `schema` as this schema has them."""
    if schema == 1:
        outcome = _outcome_json(_outcome_v1(json.loads(result))) if result else ""
        return _JSON.encode(_plan_v1(json.loads(plan))).decode(), outcome
    return _JSON.encode(_plan_v2(json.loads(plan))).decode(), result


def _outcome_json(outcome: Outcome) -> str:
    # the fields at their defaults left out (Outcome's omit_defaults): `check` only when a CHECK found
    # something, which the agent before it (a rolled-back upgrade) could not read
    return "" if outcome == Outcome() else _JSON.encode(outcome).decode()


class _Writer:
    """One thread running writes one at a time: the urgent ones first, each kind in the order asked."""

    URGENT, BULK, END = 0, 1, 2

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], None] | None, Future[None] | None]]
        self._queue = queue.PriorityQueue()
        self._order = itertools.count()
        # a daemon: the agent closes the store on its way out, and a program that did not must not hang
        self._thread = threading.Thread(target=self._serve, name="netclaim-store", daemon=True)
        self._thread.start()

    def submit(self, write: Callable[[], None], *, urgent: bool) -> Future[None]:
        made: Future[None] = Future()
        self._queue.put((self.URGENT if urgent else self.BULK, next(self._order), write, made))
        return made

    def _serve(self) -> None:
        while True:
            _, _, write, made = self._queue.get()
            if write is None or made is None:
                return
            if not made.set_running_or_notify_cancel():
                continue
            try:
                write()
            except BaseException as err:  # noqa: BLE001 - handed to the caller, whoever it is
                made.set_exception(err)
            else:
                made.set_result(None)
            del write, made  # not held while waiting for the next: the rows a write made go with it

    def shutdown(self) -> None:
        """Once every write asked so far is made."""
        self._queue.put((self.END, next(self._order), None, None))
        self._thread.join()


class StoredRows:
    """The store's rows as they are, read-only: the agent's Store reads through it, and `netclaim state`
    opens a node's database with it (`read_only`) beside the running agent, which it never blocks."""

    def __init__(self, path: Path, reader: sqlite3.Connection) -> None:
        self.path = path
        self._reader = reader
        # each stored row as last read, by its key, with the columns it was read from: a row is read at
        # every hook, status write and port-guard pass (each pass reads them all) and changes a few times
        # in its life, its plan never (rows and plans are frozen). Kept for the rows there are, never for
        # the gone: a plan is 8 KiB, and a cache by text kept every pod's that came and went (33 MiB at
        # 4,096)
        self._rows: dict[Key, tuple[tuple[Any, ...], Attachment]] = {}

    @classmethod
    def read_only(cls, directory: Path) -> StoredRows:
        """The database in `directory`, opened for reading only; PrerequisiteError when there is none or
        it is of another schema than this program's."""
        path = directory / "netclaim.db"
        if not path.is_file():
            raise PrerequisiteError(f"{path}: no state database (is this the agent's --state-dir?)")
        reader = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=READ_BUSY_SECONDS)
        try:
            found = reader.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.DatabaseError as err:
            reader.close()
            raise PrerequisiteError(f"{path}: not a netclaim state database ({err})") from err
        if found is None or int(found[0]) != SCHEMA_VERSION:
            reader.close()
            raise PrerequisiteError(
                f"{path}: schema {found[0] if found else 'none'}, this program reads {SCHEMA_VERSION}: run "
                "the agent's own version (kubectl exec into its pod)"
            )
        return cls(path, reader)

    def close(self) -> None:
        self._reader.close()

    def _row(self, values: tuple[Any, ...]) -> Attachment:
        key: Key = values[:4]
        known = self._rows.get(key)
        if known is not None and known[0] == values:
            return known[1]
        data = dict(zip(_COLUMNS, values, strict=True))
        try:
            text = data.pop("plan")
            same_plan = known is not None and known[0][_PLAN] == text
            plan = known[1].plan if known is not None and same_plan else _PLAN_JSON.decode(text)
            result = data.pop("result")
            outcome = _OUTCOME_JSON.decode(result) if result else Outcome()
            state = State(data.pop("state"))
        except ValueError as err:  # msgspec's DecodeError and ValidationError are ValueErrors too
            raise PrerequisiteError(
                f"{self.path}: row of claim {data['claim_uid']} device {data['device']} is not a row this "
                f"agent understands (written by a newer agent?): {err}"
            ) from err
        row = Attachment(**data, plan=plan, outcome=outcome, state=state)
        self._rows[key] = (values, row)
        return row

    def _select(self, where: str, parameters: tuple[Any, ...] = ()) -> list[Attachment]:
        order = "ORDER BY claim_uid, pool, device, share_id"
        query = f"SELECT {', '.join(_COLUMNS)} FROM attachments {where} {order}"  # noqa: S608 - fixed fragments
        try:
            rows = self._reader.execute(query, parameters).fetchall()
        except sqlite3.OperationalError as err:
            raise StateStoreError(f"{self.path}: {err}") from err
        return [self._row(row) for row in rows]

    def get(self, key: Key) -> Attachment | None:
        """The row as stored now (None once deleted)."""
        found = self._select("WHERE claim_uid = ? AND pool = ? AND device = ? AND share_id = ?", key)
        return found[0] if found else None

    def for_claim(self, claim_uid: str) -> list[Attachment]:
        return self._select("WHERE claim_uid = ?", (claim_uid,))

    def for_pod(self, pod_uid: str) -> list[Attachment]:
        return self._select("WHERE pod_uid = ?", (pod_uid,))

    def all(self) -> list[Attachment]:
        rows = self._select("")
        if len(self._rows) > len(rows):  # a delete that raised (made late, or not): its row goes here
            self._rows = {row.key: self._rows[row.key] for row in rows}
        return rows

    def networks(self) -> dict[str, dict[str, Any]]:
        """The networks remembered, by key."""
        try:
            found = self._reader.execute("SELECT key, conflist FROM networks ORDER BY key").fetchall()
        except sqlite3.OperationalError as err:
            raise StateStoreError(f"{self.path}: {err}") from err
        return {key: json.loads(conflist) for key, conflist in found}


class Store(StoredRows):
    def __init__(self, directory: Path, write_seconds: float = WRITE_SECONDS) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.chmod(0o700)
        path = directory / "netclaim.db"
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        self.path = path
        self.write_seconds = write_seconds
        # the writer's: used by the writer thread only, once migrated here
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._durable = True  # the writer connection's synchronous level: FULL, else NORMAL
        self._migrate()
        super().__init__(path, sqlite3.connect(path, isolation_level=None, timeout=READ_BUSY_SECONDS))
        self._writer = _Writer()
        self._networks = set(self.networks())  # their keys: remember_network writes a new one only

    def _migrate(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            found = int(row[0]) if row is not None else SCHEMA_VERSION
            if found > SCHEMA_VERSION:
                raise PrerequisiteError(
                    f"{self.path}: the state database has schema {found}, newer than this agent's "
                    f"{SCHEMA_VERSION}: run the newer agent (downgrades are not supported)"
                )
            db.execute("""
                CREATE TABLE IF NOT EXISTS attachments (
                    claim_uid TEXT NOT NULL, pool TEXT NOT NULL, device TEXT NOT NULL, share_id TEXT NOT NULL,
                    claim_namespace TEXT NOT NULL, claim_name TEXT NOT NULL, request TEXT NOT NULL,
                    pod_uid TEXT NOT NULL, plan TEXT NOT NULL, state TEXT NOT NULL,
                    sandbox_id TEXT NOT NULL, netns TEXT NOT NULL, result TEXT NOT NULL, error TEXT NOT NULL,
                    updated REAL NOT NULL,
                    PRIMARY KEY (claim_uid, pool, device, share_id))""")
            db.execute("CREATE INDEX IF NOT EXISTS attachments_by_pod ON attachments (pod_uid)")
            # the CNI 1.1 networks this node has attached to, for their plugins' GC (configure.lifecycle);
            # a table older agents never read, so no schema change
            db.execute(
                "CREATE TABLE IF NOT EXISTS networks (key TEXT PRIMARY KEY, conflist TEXT NOT NULL, "
                "used REAL NOT NULL)"
            )
            old = db.execute("SELECT rowid, plan, result FROM attachments").fetchall() if found < 3 else []
            for rowid, plan, result in old:
                update = "UPDATE attachments SET plan = ?, result = ? WHERE rowid = ?"
                db.execute(update, (*_migrated(found, plan, result), rowid))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    @contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction of the writer thread; `durable`: fsync'd at commit (synchronous=FULL), else
        kept by the kernel only (NORMAL: lost to a power cut, never to the agent's own end)."""
        try:
            if durable != self._durable:  # a connection's level, set between its transactions
                self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                self._durable = durable
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as err:
            raise StateStoreError(f"{self.path}: {err}") from err

    def close(self) -> None:
        """After the writes asked so far are made."""
        self._writer.shutdown()
        super().close()
        self._db.close()

    async def _write(self, write: Callable[[], None], *, urgent: bool = True) -> None:
        """Run `write` on the writer thread (`urgent`: before the bulk writes waiting); wait for it at most
        `write_seconds`."""
        made = asyncio.wrap_future(self._writer.submit(write, urgent=urgent))
        try:
            await asyncio.wait_for(asyncio.shield(made), self.write_seconds)
        except BaseException as err:
            if not made.done():  # the caller stops waiting (past its bound, or cancelled): not the write
                made.add_done_callback(self._late)
            if isinstance(err, TimeoutError):
                raise StateStoreError(
                    f"{self.path}: the disk did not take a write within {self.write_seconds} s (it is "
                    "still made, in its turn)"
                ) from None
            raise

    def _late(self, made: asyncio.Future[None]) -> None:
        """A write nobody waits for any more: what became of it goes to the log."""
        if not made.cancelled() and made.exception() is not None:
            log.warning("a late state write failed", extra={"error": str(made.exception())})

    async def put(self, *rows: Attachment) -> None:
        """Insert or replace rows in one transaction (all or nothing), fsync'd, after the other writes
        waiting (the module's text)."""
        await self._write(lambda: self._put(rows), urgent=False)

    def _put(self, rows: tuple[Attachment, ...]) -> None:
        with self._transaction() as db:
            for row in rows:
                db.execute(
                    f"INSERT OR REPLACE INTO attachments ({', '.join(_COLUMNS)}, updated) "  # noqa: S608
                    f"VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})",
                    (
                        row.claim_uid,
                        row.pool,
                        row.device,
                        row.share_id,
                        row.claim_namespace,
                        row.claim_name,
                        row.request,
                        row.pod_uid,
                        _JSON.encode(row.plan).decode(),
                        row.state.value,
                        row.sandbox_id,
                        row.netns,
                        _outcome_json(row.outcome),
                        row.error,
                        time.time(),
                    ),
                )

    async def transition(self, *rows: Attachment, durable: bool) -> None:
        """Write the rows' state columns (state, sandbox, netns, outcome, error), in one transaction; the
        plan and the claim's columns are as `put` wrote them. `durable`: see the module's docstring."""
        await self._write(lambda: self._transition(rows, durable))

    def _transition(self, rows: tuple[Attachment, ...], durable: bool) -> None:
        with self._transaction(durable) as db:
            for row in rows:
                db.execute(
                    "UPDATE attachments SET state = ?, sandbox_id = ?, netns = ?, result = ?, error = ?, "
                    "updated = ? WHERE claim_uid = ? AND pool = ? AND device = ? AND share_id = ?",
                    (
                        row.state.value,
                        row.sandbox_id,
                        row.netns,
                        _outcome_json(row.outcome),
                        row.error,
                        time.time(),
                        *row.key,
                    ),
                )

    async def delete(self, *rows: Attachment) -> None:
        await self._write(lambda: self._delete(rows))
        for row in rows:
            self._rows.pop(row.key, None)

    def _delete(self, rows: tuple[Attachment, ...]) -> None:
        with self._transaction(durable=False) as db:
            for row in rows:
                db.execute(
                    "DELETE FROM attachments WHERE claim_uid = ? AND pool = ? AND device = ? "
                    "AND share_id = ?",
                    row.key,
                )

    async def remember_network(self, key: str, conflist: dict[str, Any]) -> None:
        """Keep a network's config for its plugins' GC, once (not fsync'd: a network lost to a power cut
        is written again at its next attach, and its leftovers wait for that)."""
        if key in self._networks:
            return

        def write() -> None:
            with self._transaction(durable=False) as db:
                db.execute(
                    "INSERT OR REPLACE INTO networks VALUES (?, ?, ?)",
                    (key, json.dumps(conflist), time.time()),
                )

        await self._write(write)
        self._networks.add(key)

    async def forget_network(self, key: str) -> None:
        def write() -> None:
            with self._transaction(durable=False) as db:
                db.execute("DELETE FROM networks WHERE key = ?", (key,))

        self._networks.discard(key)
        await self._write(write)

    def held_devices(self, present: set[str]) -> list[Device]:
        """Whole NICs now inside pods: gone from the node's netns, still this node's (allocated) devices."""
        return [
            row.plan.nic.published()
            for row in self.all()
            if not row.plan.shared
            and row.state in (State.ATTACHING, State.ATTACHED)
            and row.device not in present
        ]
