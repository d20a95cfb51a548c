"""Durable state of prepared and attached interfaces: SQLite in WAL mode, written through, fsync'd.

One row per allocated device of a claim, keyed by (claim UID, pool, device, share ID); the pod UID says
which pod's sandbox gets it. Rows move prepared → attaching → attached → detached and are deleted by
NodeUnprepareResources. A row in `attaching` after a crash means an ADD may be half done: it is rolled
back (DEL) before anything else. Schema changes bump SCHEMA_VERSION; an unknown newer version is refused.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from netclaim.errors import PrerequisiteError

SCHEMA_VERSION = 1


class State(StrEnum):
    PREPARED = "prepared"
    ATTACHING = "attaching"
    ATTACHED = "attached"
    DETACHED = "detached"


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
    plan: dict[str, Any]
    state: State = State.PREPARED
    sandbox_id: str = ""
    netns: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
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


class Store:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.chmod(0o700)
        path = directory / "netclaim.db"
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._migrate()

    def _migrate(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise PrerequisiteError(
                    f"the state database has schema {row[0]}, newer than this agent's {SCHEMA_VERSION}: "
                    "run the newer agent (downgrades are not supported)"
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
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def _row(values: tuple[Any, ...]) -> Attachment:
        data = dict(zip(_COLUMNS, values, strict=True))
        data["plan"] = json.loads(data["plan"])
        data["result"] = json.loads(data["result"]) if data["result"] else {}
        data["state"] = State(data["state"])
        return Attachment(**data)

    def _select(self, where: str, parameters: tuple[Any, ...] = ()) -> list[Attachment]:
        order = "ORDER BY claim_uid, pool, device, share_id"
        query = f"SELECT {', '.join(_COLUMNS)} FROM attachments {where} {order}"  # noqa: S608 - fixed fragments
        return [self._row(row) for row in self._db.execute(query, parameters).fetchall()]

    def put(self, *rows: Attachment) -> None:
        """Insert or replace rows in one transaction (all or nothing)."""
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
                        json.dumps(row.plan, sort_keys=True),
                        row.state.value,
                        row.sandbox_id,
                        row.netns,
                        json.dumps(row.result, sort_keys=True) if row.result else "",
                        row.error,
                        time.time(),
                    ),
                )

    def delete(self, *rows: Attachment) -> None:
        with self._transaction() as db:
            for row in rows:
                db.execute(
                    "DELETE FROM attachments WHERE claim_uid = ? AND pool = ? AND device = ? "
                    "AND share_id = ?",
                    row.key,
                )

    def for_claim(self, claim_uid: str) -> list[Attachment]:
        return self._select("WHERE claim_uid = ?", (claim_uid,))

    def for_pod(self, pod_uid: str) -> list[Attachment]:
        return self._select("WHERE pod_uid = ?", (pod_uid,))

    def all(self) -> list[Attachment]:
        return self._select("")
