"""The state database: rows survive restarts and move through their states; what it cannot read is refused."""

from __future__ import annotations

import asyncio
import gc
import json
import sqlite3
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent.store import SCHEMA_VERSION, Attachment, Interface, Outcome, State, Store, StoredRows
from netclaim.cli import main as cli
from netclaim.core.devices.catalog import ATTACHMENTS, BANDWIDTH, Capacity
from netclaim.core.plan import AttachPlan
from netclaim.errors import PrerequisiteError, StateStoreError
from tests.unit.fakes import sample_device, sample_row

ATTACHED_OUTCOME = Outcome(
    cni_args="IgnoreUnknown=1;K8S_POD_NAME=pod-1",
    cni_result={"cniVersion": "1.0.0", "ips": [{"address": "10.90.0.10/24"}]},
    interface=Interface(name="net1", mac="02:00:0a:5a:00:0a", mtu=1500, addresses=("10.90.0.10/24",)),
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "state")
    yield opened
    opened.close()


async def test_a_row_reads_back_as_written_also_after_a_restart(tmp_path: Path) -> None:
    row = sample_row(bandwidth_bps=250_000_000, share_id="share-1").with_state(
        State.ATTACHED, sandbox_id="sandbox-1", netns="/run/netns/a", outcome=ATTACHED_OUTCOME, error="x"
    )
    first = Store(tmp_path / "state")
    await first.put(row)
    assert first.get(row.key) == row
    first.close()
    again = Store(tmp_path / "state")
    assert again.get(row.key) == row
    assert again.get(("other-claim", *row.key[1:])) is None
    again.close()


def test_the_state_directory_and_database_are_private(tmp_path: Path) -> None:
    Store(tmp_path / "state").close()
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state" / "netclaim.db").stat().st_mode) == 0o600


async def test_a_hooks_write_goes_before_the_prepares_queued_and_each_kind_keeps_its_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst: kubelet's prepares queue their fsync'd rows while containerd, under its one lock per node,
    waits for a hook whose `attaching` write was queued after them. The hook's write goes as soon as the
    write under way ends; the prepares' rows follow in the order they were asked, and every row lands."""
    hooked = sample_row(claim_uid="hooked")
    await store.put(hooked)
    made: list[str] = []
    started, release = threading.Event(), threading.Event()
    put, transition = store._put, store._transition

    def slow_put(rows: tuple[Attachment, ...]) -> None:
        made.append(f"put {rows[0].claim_uid}")
        if rows[0].claim_uid == "first":  # the write under way when the others are asked
            started.set()
            release.wait(5)
        put(rows)

    def recorded_transition(rows: tuple[Attachment, ...], durable: bool) -> None:
        made.append(f"transition {rows[0].claim_uid}")
        transition(rows, durable)

    monkeypatch.setattr(store, "_put", slow_put)
    monkeypatch.setattr(store, "_transition", recorded_transition)
    first = asyncio.ensure_future(store.put(sample_row(claim_uid="first")))
    assert await asyncio.to_thread(started.wait, 5)
    queued = [asyncio.ensure_future(store.put(sample_row(claim_uid=f"later-{i}"))) for i in range(3)]
    await asyncio.sleep(0)  # each has asked for its write
    attaching = asyncio.ensure_future(store.transition(hooked.with_state(State.ATTACHING), durable=False))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *queued, attaching)
    assert made == ["put first", "transition hooked", "put later-0", "put later-1", "put later-2"]
    assert [row.claim_uid for row in store.all()] == ["first", "hooked", "later-0", "later-1", "later-2"]
    current = store.get(hooked.key)
    assert current is not None and current.state == State.ATTACHING


async def test_a_row_moves_prepared_attaching_attached_detached(store: Store) -> None:
    row = sample_row()
    await store.put(row)
    seen = [store.get(row.key)]
    for state in (State.ATTACHING, State.ATTACHED, State.DETACHED):
        await store.put(row.with_state(state, sandbox_id="sandbox-1"))
        seen.append(store.get(row.key))
    assert [r.state for r in seen if r is not None] == [
        State.PREPARED,
        State.ATTACHING,
        State.ATTACHED,
        State.DETACHED,
    ]
    assert len(store.all()) == 1  # the key stays; the row is replaced


async def test_rows_are_found_by_claim_and_by_pod_and_deleted_one_by_one(store: Store) -> None:
    a1 = sample_row(sample_device("enp1s0"), claim_uid="claim-a", pod_uid="pod-1")
    a2 = sample_row(sample_device("enp2s0"), claim_uid="claim-a", pod_uid="pod-1", request="net2")
    b = sample_row(sample_device("enp1s0"), claim_uid="claim-b", pod_uid="pod-2", share_id="s2")
    await store.put(b, a2, a1)
    assert store.for_claim("claim-a") == [a1, a2]
    assert store.for_pod("pod-2") == [b]
    assert store.all() == [a1, a2, b]
    assert store.for_claim("nobody") == []
    await store.delete(a1, b)
    assert store.all() == [a2]
    await store.delete(a1)  # already gone: nothing to do
    assert store.all() == [a2]


async def test_held_devices_are_exclusive_nics_inside_pods_and_missing_from_the_node(store: Store) -> None:
    inside = sample_device("enp1s0", shared=False)
    half_moved = sample_device("enp2s0", shared=False)
    returned = sample_device("enp3s0", shared=False)
    not_yet = sample_device("enp4s0", shared=False)
    shared = sample_device("enp5s0")
    await store.put(
        sample_row(inside, claim_uid="c1", state=State.ATTACHED),
        sample_row(half_moved, claim_uid="c2", state=State.ATTACHING),
        sample_row(returned, claim_uid="c3", state=State.DETACHED),
        sample_row(not_yet, claim_uid="c4", state=State.PREPARED),
        sample_row(shared, claim_uid="c5", state=State.ATTACHED),
    )
    held = store.held_devices(present={shared.name, returned.name, not_yet.name})
    assert held == [replace(inside, tenant_ranges=()), replace(half_moved, tenant_ranges=())]
    # a NIC seen on the node again is not held, whatever its row says
    assert store.held_devices(present={inside.name, half_moved.name}) == []


def _old_database(directory: Path, schema: int, rows: list[tuple[str, str, str, str]]) -> None:
    """A database as an agent of `schema` wrote it (schemas 1 and 2 have the same table): (claim UID,
    state, plan JSON, result JSON or "")."""
    directory.mkdir()
    db = sqlite3.connect(directory / "netclaim.db")
    db.executescript(f"""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '{schema}');
        CREATE TABLE attachments (
            claim_uid TEXT NOT NULL, pool TEXT NOT NULL, device TEXT NOT NULL, share_id TEXT NOT NULL,
            claim_namespace TEXT NOT NULL, claim_name TEXT NOT NULL, request TEXT NOT NULL,
            pod_uid TEXT NOT NULL, plan TEXT NOT NULL, state TEXT NOT NULL,
            sandbox_id TEXT NOT NULL, netns TEXT NOT NULL, result TEXT NOT NULL, error TEXT NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (claim_uid, pool, device, share_id));
        CREATE INDEX attachments_by_pod ON attachments (pod_uid);
    """)
    for claim_uid, state, plan, result in rows:
        db.execute(
            "INSERT INTO attachments VALUES (?, 'node-1', 'pci-0000-01-00-0', '', 'team-a', 'c', 'net', "
            "'pod-uid-1', ?, ?, 'sandbox-1', '/run/netns/a', ?, '', 0)",
            (claim_uid, plan, state, result),
        )
    db.commit()
    db.close()


SCHEMA_1_PLAN: dict[str, Any] = {
    "interfaceName": "net1",
    "conflist": {"cniVersion": "1.0.0", "name": "lan", "plugins": [{"type": "host-device"}]},
    "bandwidth": 500_000_000,
    "shared": False,
    "deviceRecord": {
        "name": "pci-0000-01-00-0",
        "ifName": "enp1s0",
        "shared": False,
        "attributes": {"netclaim.dev/mtu": 9000, "netclaim.dev/mac": "52:54:00:00:00:01"},
        "capacity": {BANDWIDTH: [10_000_000_000, None, None, None]},
    },
    "host": {"ifName": "enp1s0", "mtu": 9000, "mac": "52:54:00:00:00:01"},
}
SCHEMA_1_RESULT: dict[str, Any] = {
    "args": "IgnoreUnknown=1;K8S_POD_NAME=p",
    "cni": {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}]},
    "interface": {"name": "net1", "mac": "02:00:00:00:00:05", "mtu": 9000, "addresses": ["10.1.0.5/24"]},
}


def test_a_schema_1_database_is_migrated_to_typed_plans(tmp_path: Path) -> None:
    plan = json.dumps(SCHEMA_1_PLAN)
    _old_database(
        tmp_path / "state",
        1,
        [
            ("prepared", "prepared", json.dumps({**SCHEMA_1_PLAN, "bandwidth": None}), ""),
            ("attaching", "attaching", plan, json.dumps({"args": "IgnoreUnknown=1"})),
            ("attached", "attached", plan, json.dumps(SCHEMA_1_RESULT)),
        ],
    )
    store = Store(tmp_path / "state")
    attached = store.for_claim("attached")[0]
    assert attached.state == State.ATTACHED
    assert attached.plan.interface_name == "net1"
    assert attached.plan.bandwidth_bps == 500_000_000
    assert attached.plan.conflist == SCHEMA_1_PLAN["conflist"]
    assert not attached.plan.shared
    assert (attached.plan.nic.name, attached.plan.nic.if_name) == ("pci-0000-01-00-0", "enp1s0")
    assert (attached.plan.nic.mtu, attached.plan.nic.mac) == (9000, "52:54:00:00:00:01")
    assert attached.plan.nic.published().capacity == {BANDWIDTH: Capacity(10_000_000_000)}
    assert attached.outcome == Outcome(
        cni_args="IgnoreUnknown=1;K8S_POD_NAME=p",
        cni_result=SCHEMA_1_RESULT["cni"],
        interface=Interface(name="net1", mac="02:00:00:00:00:05", mtu=9000, addresses=("10.1.0.5/24",)),
    )
    # an ADD cut short kept only its CNI_ARGS: DEL needs them to release the same reservation
    assert store.for_claim("attaching")[0].outcome == Outcome(cni_args="IgnoreUnknown=1")
    prepared = store.for_claim("prepared")[0]
    assert prepared.outcome == Outcome()
    assert prepared.plan.bandwidth_bps is None
    store.close()
    raw = sqlite3.connect(tmp_path / "state" / "netclaim.db")
    assert raw.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (str(SCHEMA_VERSION),)
    raw.close()
    reopened = Store(tmp_path / "state")  # a migrated database opens as it is
    assert reopened.for_claim("attached") == [attached]
    reopened.close()


# Rows as the agent of schema 2 (fd40ace) wrote them, byte for byte: a plan of version 2 (pool addresses)
# of a whole NIC, attached; a plan of version 1 (written before pool addresses) of a shared NIC, prepared.
SCHEMA_2_ATTACHED_PLAN = (
    '{"version":2,"interface_name":"net1","conflist":{"cniVersion":"1.0.0","name":"lan","plugins":[{"type":'
    '"host-device","device":"enp7s0"}]},"bandwidth_bps":250000000,"device":{"name":"pci-0000-07-00-0",'
    '"if_name":"enp7s0","shared":false,"attributes":{"netclaim.dev/ifName":"enp7s0","netclaim.dev/mtu":9000,'
    '"netclaim.dev/mac":"52:54:00:00:07:00","netclaim.dev/shared":false,"netclaim.dev/pciAddress":'
    '"0000:07:00.0"},"capacity":{"netclaim.dev/bandwidth":{"value":10000000000,"default":null,"minimum":'
    'null,"step":null,"maximum":null}},"tenant_ranges":["10.0.0.0/8","fd00::/8"]},"pool_addresses":[{'
    '"request":"addr","pool":"netclaim.dev/ip-pools","device":"lan3","share_id":"share-a","ips":'
    '["10.10.3.17/24"]}]}'
)
SCHEMA_2_ATTACHED_RESULT = (
    '{"cni_args":"IgnoreUnknown=1;K8S_POD_NAME=pod-1","cni_result":{"cniVersion":"1.0.0","ips":[{"address":'
    '"10.10.3.17/24"}]},"interface":{"name":"net1","mac":"52:54:00:00:07:00","mtu":9000,"addresses":'
    '["10.10.3.17/24"]}}'
)
SCHEMA_2_PREPARED_PLAN = (
    '{"version":1,"interface_name":"net1","conflist":{"cniVersion":"1.0.0","name":"lan","plugins":[{"type":'
    '"macvlan","master":"enp1s0"}]},"bandwidth_bps":null,"device":{"name":"dev-enp1s0","if_name":"enp1s0",'
    '"shared":true,"attributes":{"netclaim.dev/ifName":"enp1s0","netclaim.dev/shared":true},"capacity":{'
    '"netclaim.dev/bandwidth":{"value":10000000000,"default":1000000000,"minimum":1000000,"step":1000000,'
    '"maximum":null},"netclaim.dev/attachments":{"value":32,"default":1,"minimum":1,"step":1,"maximum":4}},'
    '"tenant_ranges":[]}}'
)


async def test_a_schema_2_database_as_todays_agent_wrote_it_is_migrated(tmp_path: Path) -> None:
    """The NIC kept as publish.devices.Device was serialised becomes a NicRecord: attach, detach, the host
    NIC's restore, network-status and the publishing of a NIC inside a pod read what they read before."""
    _old_database(
        tmp_path / "state",
        2,
        [
            ("attached", "attached", SCHEMA_2_ATTACHED_PLAN, SCHEMA_2_ATTACHED_RESULT),
            ("prepared", "prepared", SCHEMA_2_PREPARED_PLAN, ""),
        ],
    )
    store = Store(tmp_path / "state")
    [attached] = store.for_claim("attached")
    plan = attached.plan
    assert (plan.version, plan.interface_name, plan.bandwidth_bps) == (3, "net1", 250_000_000)
    assert plan.conflist == json.loads(SCHEMA_2_ATTACHED_PLAN)["conflist"]
    nic = plan.nic
    assert (nic.name, nic.if_name, nic.shared) == ("pci-0000-07-00-0", "enp7s0", False)
    assert (nic.mtu, nic.mac, nic.pci_address) == (9000, "52:54:00:00:07:00", "0000:07:00.0")
    assert [(p.device, p.share_id, p.ips) for p in plan.pool_addresses] == [
        ("lan3", "share-a", ("10.10.3.17/24",))
    ]
    assert attached.outcome == msgspec.json.decode(SCHEMA_2_ATTACHED_RESULT, type=Outcome)
    [held] = store.held_devices(present=set())
    assert held.to_api() == {
        "name": "pci-0000-07-00-0",
        "attributes": {
            "netclaim.dev/ifName": {"string": "enp7s0"},
            "netclaim.dev/mtu": {"int": 9000},
            "netclaim.dev/mac": {"string": "52:54:00:00:07:00"},
            "netclaim.dev/shared": {"bool": False},
            "netclaim.dev/pciAddress": {"string": "0000:07:00.0"},
        },
        "capacity": {BANDWIDTH: {"value": "9765625Ki"}},  # 10,000,000,000
    }
    [prepared] = store.for_claim("prepared")
    assert prepared.plan.shared and prepared.plan.pool_addresses == ()
    assert prepared.plan.nic.published().capacity[ATTACHMENTS] == Capacity(32, 1, 1, 1, 4)
    assert prepared.outcome == Outcome()
    store.close()
    raw = sqlite3.connect(tmp_path / "state" / "netclaim.db")
    assert raw.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("3",)
    [plan_json] = raw.execute("SELECT plan FROM attachments WHERE claim_uid = 'attached'").fetchone()
    assert set(json.loads(plan_json)) == {
        "version",
        "interface_name",
        "conflist",
        "bandwidth_bps",
        "nic",
        "pool_addresses",
    }
    raw.close()
    reopened = Store(tmp_path / "state")  # a migrated database opens as it is
    assert reopened.for_claim("attached") == [attached]
    reopened.close()


def test_a_database_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / "state").close()
    raw = sqlite3.connect(tmp_path / "state" / "netclaim.db")
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    with pytest.raises(PrerequisiteError, match=f"schema {SCHEMA_VERSION + 1}, newer than this agent's"):
        Store(tmp_path / "state")


async def test_a_row_this_agent_cannot_read_is_refused_naming_it(store: Store) -> None:
    row = sample_row(claim_uid="claim-x")
    await store.put(row)
    newer_plan = {**msgspec.to_builtins(row.plan), "version": 2, "vlan": 7}
    store._db.execute("UPDATE attachments SET plan = ?", (json.dumps(newer_plan),))
    with pytest.raises(
        PrerequisiteError,
        match=f"row of claim claim-x device {row.device} is not a .* this agent understands",
    ):
        store.all()


async def test_a_row_in_a_state_this_agent_does_not_know_is_refused(store: Store) -> None:
    row = sample_row(claim_uid="claim-x")
    await store.put(row)
    store._db.execute("UPDATE attachments SET state = 'quarantined'")
    with pytest.raises(PrerequisiteError, match=f"row of claim claim-x device {row.device}"):
        store.for_pod(row.pod_uid)


async def test_a_locked_database_is_a_transient_error_and_changes_nothing(store: Store) -> None:
    await store.put(sample_row(claim_uid="before"))
    store._db.execute("PRAGMA busy_timeout = 0")  # sqlite would wait 5 s for the lock first
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with pytest.raises(StateStoreError, match="locked"):
        await store.put(sample_row(claim_uid="during"), sample_row(claim_uid="during-2"))
    with pytest.raises(StateStoreError, match="locked"):
        await store.delete(sample_row(claim_uid="before"))
    other.execute("ROLLBACK")
    other.close()
    assert [r.claim_uid for r in store.all()] == ["before"]
    await store.put(sample_row(claim_uid="after"))  # the next write works once the lock is gone
    assert [r.claim_uid for r in store.all()] == ["after", "before"]


async def test_a_failed_write_leaves_none_of_its_rows(store: Store) -> None:
    await store.put(sample_row(claim_uid="kept"))
    with pytest.raises(sqlite3.IntegrityError):
        # the second row breaks a NOT NULL column: the first one must not be written alone
        await store.put(sample_row(claim_uid="new"), sample_row(claim_uid=None))  # type: ignore[arg-type]
    assert [r.claim_uid for r in store.all()] == ["kept"]


def test_a_read_the_database_refuses_is_a_state_store_error(store: Store) -> None:
    store._db.execute("DROP TABLE attachments")
    with pytest.raises(StateStoreError, match="no such table"):
        store.all()


async def test_a_database_held_by_another_process_never_holds_up_the_event_loop(tmp_path: Path) -> None:
    """An operator's sqlite3 shell holds the database: the write waits for it on the store's own thread,
    the event loop goes on answering the runtime, the caller stops waiting at its bound (transient: the
    runtime retries), and the write is still made, before the next one."""
    store = Store(tmp_path / "state", write_seconds=0.05)
    await store.put(sample_row(claim_uid="before"))
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            beats += 1
            await asyncio.sleep(0)

    beating = asyncio.create_task(heartbeat())
    try:
        with pytest.raises(StateStoreError, match=r"did not take a write within 0\.05 s"):
            await store.put(sample_row(claim_uid="late"))
        assert beats > 1  # the loop ran while the write waited
        assert [r.claim_uid for r in store.all()] == ["before"]  # reads never wait for the writer
    finally:
        beating.cancel()
        other.execute("ROLLBACK")
        other.close()
    await store.put(sample_row(claim_uid="next"))
    assert [r.claim_uid for r in store.all()] == ["before", "late", "next"]
    store.close()


async def test_closing_the_store_makes_the_writes_asked_so_far(tmp_path: Path) -> None:
    store = Store(tmp_path / "state", write_seconds=0.0)  # the caller never waits
    with pytest.raises(StateStoreError):
        await store.put(sample_row(claim_uid="asked"))
    store.close()
    reopened = Store(tmp_path / "state")
    assert [r.claim_uid for r in reopened.all()] == ["asked"]
    reopened.close()


async def test_a_transition_writes_the_state_columns_and_leaves_the_plan_as_put(store: Store) -> None:
    row = sample_row()
    await store.put(row)
    written_plan = store._reader.execute("SELECT plan FROM attachments").fetchone()[0]
    changed_plan = replace(row, plan=msgspec.structs.replace(row.plan, interface_name="other"))
    attaching = changed_plan.with_state(State.ATTACHING, sandbox_id="s1", netns="/run/netns/p1")
    await store.transition(attaching, durable=True)
    [stored] = store.all()
    assert (stored.state, stored.sandbox_id, stored.netns) == (State.ATTACHING, "s1", "/run/netns/p1")
    assert store._reader.execute("SELECT plan FROM attachments").fetchone()[0] == written_plan
    await store.delete(stored)
    await store.transition(stored.with_state(State.ATTACHED), durable=False)  # never brings a row back
    assert store.all() == []


async def test_only_the_writes_that_precede_what_outlives_a_reboot_are_fsyncd(store: Store) -> None:
    """FULL for prepared rows and `attaching`; NORMAL (the kernel keeps it: only a power cut loses it) for
    what follows an ADD, a rollback, a DEL and deletions. Read on the writer's own connection."""

    def level() -> int:
        return int(store._db.execute("PRAGMA synchronous").fetchone()[0])  # 2 FULL, 1 NORMAL

    row = sample_row()
    seen = []
    await store.put(row)
    seen.append(level())
    await store.transition(row.with_state(State.ATTACHING), durable=True)
    seen.append(level())
    await store.transition(row.with_state(State.ATTACHED), durable=False)
    seen.append(level())
    await store.delete(row)
    seen.append(level())
    await store.put(row)
    seen.append(level())
    assert seen == [2, 2, 1, 1, 2]


async def test_a_row_without_a_check_finding_is_stored_as_the_agent_before_the_check_read_it(
    store: Store,
) -> None:
    """A rolled-back upgrade: the previous agent's Outcome forbids unknown keys, so `check` is written only
    when a CHECK found something (fields at their defaults are left out: the previous agent has the same
    defaults)."""
    interface = Interface(name="net1", mac="02:00:00:00:00:01", mtu=1500, addresses=("10.9.0.2/24",))
    attached = sample_row().with_state(
        State.ATTACHED, sandbox_id="s1", outcome=Outcome(cni_args="a", interface=interface)
    )
    await store.put(attached)

    def stored() -> dict[str, Any]:
        with sqlite3.connect(store.path) as db:
            [(result,)] = db.execute("SELECT result FROM attachments").fetchall()
        return dict(json.loads(result))

    assert stored() == {"cni_args": "a", "interface": json.loads(msgspec.json.encode(interface))}
    told = attached.with_state(State.ATTACHED, outcome=attached.outcome.with_check("x"))
    await store.transition(told, durable=False)
    assert stored()["check"] == "x"
    assert store.get(attached.key) == told


async def test_what_the_store_keeps_of_a_rows_plan_goes_with_the_row(store: Store) -> None:
    """A node's pods come and go by the thousand: a plan read once is kept for the next reads of its row
    (each row's is read at every hook and status write), never after the row is deleted. A cache by plan
    text kept every row's that ever was, 8 KiB each (33 MiB at 4,096)."""

    async def a_round(number: int) -> None:
        rows = [
            sample_row(
                claim_uid=f"claim-{number}-{i:03}",
                pod_uid=f"pod-{number}-{i}",
                bandwidth_bps=10**6 + 1000 * number + i,
            )
            for i in range(200)
        ]  # each row's plan its own; in the store's order
        await store.put(*rows)
        assert store.all() == rows
        assert [store.get(row.key) for row in rows] == rows
        await store.delete(*rows[:100])
        assert store.all() == rows[100:]
        with store._reader:  # the rest as by a delete that raised after the write was made
            store._reader.execute("DELETE FROM attachments")
        assert store.all() == []

    await a_round(0)
    await a_round(1)
    gc.collect()  # what only a cycle still holds is gone too
    alive = [  # a model is tracked by gc; these rows' plans only (other tests' may still be about)
        o
        for o in gc.get_objects()
        if isinstance(o, AttachPlan) and 10**6 <= (o.bandwidth_bps or 0) < 10**6 + 2000
    ]
    assert alive == [], f"{len(alive)} plans kept after their rows went"


async def test_netclaim_state_reads_a_running_agents_rows_without_changing_or_blocking_them(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    attached = sample_row(share_id="share-1").with_state(
        State.ATTACHED, sandbox_id="sandbox-123456789abcdef", netns="/run/netns/a", outcome=ATTACHED_OUTCOME
    )
    failed = replace(sample_row(), claim_uid="claim-2", claim_name="other", error="CNI ADD: no master")
    await store.put(attached, failed)
    before = store.path.read_bytes()
    directory = str(store.path.parent)
    assert cli.main(["state", "--state-dir", directory, "-o", "json"]) == 0
    found = {entry["claim"]: entry for entry in json.loads(capsys.readouterr().out)}
    mine = found[f"{attached.claim_namespace}/{attached.claim_name}"]
    assert (mine["state"], mine["interface"], mine["ips"], mine["mac"]) == (
        "attached",
        "net1",
        ["10.90.0.10/24"],
        "02:00:0a:5a:00:0a",
    )
    assert found[f"{failed.claim_namespace}/other"]["error"] == "CNI ADD: no master"
    assert cli.main(["state", "--state-dir", directory]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["CLAIM", "DEVICE", "POD", "UID"] and len(table) == 3
    assert any("sandbox-12345" in line and "10.90.0.10/24" in line for line in table)
    assert store.path.read_bytes() == before  # read-only: nothing written
    await store.delete(failed)  # the agent writes on while a reader is open
    reader = StoredRows.read_only(store.path.parent)
    await store.delete(attached)
    assert reader.all() == []
    reader.close()


def test_netclaim_state_says_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["state", "--state-dir", str(tmp_path)]) == 2
    assert "no state database (is this the agent's --state-dir?)" in capsys.readouterr().err
    (tmp_path / "netclaim.db").write_text("not sqlite at all, and long enough to be refused as such" * 20)
    assert cli.main(["state", "--state-dir", str(tmp_path)]) == 2
    assert "not a netclaim state database" in capsys.readouterr().err
    assert not (tmp_path / "netclaim.db-wal").exists()
