"""What the node's publisher writes through the one slice writer, and how it recognises that nothing needs
writing (the IP pools' side of the same writer: test_ipam_pools)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from netclaim.agent.publish.publisher import SlicePublisher
from netclaim.core.devices.catalog import Capacity, Device
from netclaim.core.devices.slices import ApiDevice, chunk, dropped_fields, normalized_device
from netclaim.core.objects import Slice
from netclaim.errors import ApiUnavailableError
from netclaim.runtime import metrics
from tests.unit.fakes import FakeKubeApi


def _device(name: str) -> Device:
    return Device(
        name=name,
        if_name=name,
        shared=True,
        attributes={"netclaim.dev/ifName": name},
        capacity={"netclaim.dev/bandwidth": Capacity(10 * 2**30, default=2**30, minimum=2**20, step=2**20)},
    )


def test_devices_are_sorted_and_cut_into_slices_of_64() -> None:
    devices = [_device(f"nic{i:04d}").to_api() for i in reversed(range(300))]
    slices = chunk(devices)
    assert [len(s) for s in slices] == [64, 64, 64, 64, 44]
    assert slices[0][0]["name"] == "nic0000" and slices[-1][-1]["name"] == "nic0299"
    assert chunk([]) == [[]]  # an empty pool is still published: "this node has none"


def test_only_devices_of_one_capacity_share_a_slice() -> None:
    # Kubernetes 1.34's scheduler checks a share against the slice's first device (kubernetes#133705):
    # a 25G NIC after a 1G one must not share its slice.
    one_gig = {"netclaim.dev/bandwidth": Capacity(10**9)}
    nics = [
        replace(_device("enp7s0"), shared=False, capacity=one_gig),
        _device("enp94s0"),
        replace(_device("eth9"), shared=False, capacity=one_gig),
        _device("ipn0"),
    ]
    slices = chunk([nic.to_api() for nic in reversed(nics)])
    assert [[d["name"] for d in s] for s in slices] == [["enp7s0", "eth9"], ["enp94s0", "ipn0"]]
    for devices in slices:
        assert len({str(d["capacity"]) for d in devices}) == 1


def test_server_spelling_of_quantities_compares_equal() -> None:
    written = _device("nic0").to_api()
    read_back = {
        "name": "nic0",
        "attributes": {"netclaim.dev/ifName": {"string": "nic0", "int": None}},
        "capacity": {
            "netclaim.dev/bandwidth": {
                "value": "10240Mi",
                "requestPolicy": {"default": "1024Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
            }
        },
        "allowMultipleAllocations": True,
    }
    assert normalized_device(written) == normalized_device(read_back)
    read_back["capacity"]["netclaim.dev/bandwidth"]["value"] = "10G"  # type: ignore[index]
    assert normalized_device(written) != normalized_device(read_back)


# --- SlicePublisher against an in-memory API server ---------------------------------------------------

NODE, DRIVER = "node-a", "netclaim.dev"


def _pool(api: FakeKubeApi, node: str = NODE) -> dict[str, dict[str, Any]]:
    """The stored slices of `node`'s pool of this driver, by name."""
    return {
        name: body
        for name, body in api.slices.items()
        if body["spec"]["nodeName"] == node and body["spec"]["driver"] == DRIVER
    }


def _generations(api: FakeKubeApi) -> set[int]:
    return {body["spec"]["pool"]["generation"] for body in _pool(api).values()}


async def _published(devices: list[Device]) -> tuple[FakeKubeApi, SlicePublisher]:
    api = FakeKubeApi(node_uids={NODE: "0b1c-node-uid"})
    publisher = SlicePublisher(api, NODE, DRIVER)
    await publisher.publish(devices)
    api.calls.clear()
    return api, publisher


async def test_first_publish_writes_every_slice_owned_by_the_node() -> None:
    api = FakeKubeApi(node_uids={NODE: "0b1c-node-uid"})
    publisher = SlicePublisher(api, NODE, DRIVER)
    devices = [_device(f"nic{i:03d}") for i in range(66)]
    assert await publisher.publish(devices) == 2
    assert api.calls == ["list_slices", "node_uid", "apply_slice", "apply_slice", "set_node_condition"]
    assert sorted(api.slices) == [f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-1"]
    for index, name in enumerate(sorted(api.slices)):
        body = api.slices[name]
        assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "0b1c-node-uid", "controller": True}
        ]
        spec = body["spec"]
        assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert [d["name"] for d in spec["devices"]] == [d["name"] for d in _api(devices)[index * 64 :][:64]]
    assert metrics.REGISTRY.get_sample_value("netclaim_published_devices") == 66


async def test_unchanged_devices_make_no_write() -> None:
    devices = [_device(f"nic{i:03d}") for i in range(66)]
    api, publisher = await _published(devices)
    assert await publisher.publish(list(reversed(devices))) == 0
    assert api.calls == ["list_slices"]
    assert _generations(api) == {1}


async def test_server_spelled_quantities_read_back_make_no_write() -> None:
    api, publisher = await _published([_device("nic0")])
    [stored] = api.slices.values()
    bandwidth = stored["spec"]["devices"][0]["capacity"]["netclaim.dev/bandwidth"]
    assert bandwidth["requestPolicy"]["default"] == "1Gi"
    bandwidth["value"] = "10240Mi"
    bandwidth["requestPolicy"]["default"] = "1024Mi"
    assert await publisher.publish([_device("nic0")]) == 0
    assert api.calls == ["list_slices"]


async def test_any_change_bumps_the_generation_of_every_slice() -> None:
    devices = [_device(f"nic{i:03d}") for i in range(66)]
    api, publisher = await _published(devices)
    changed = [*devices[:-1], replace(devices[-1], attributes={"netclaim.dev/ifName": "renamed"})]
    assert await publisher.publish(changed) == 2  # the first slice is unchanged, yet rewritten
    # the Node's UID is asked on every write: a Node registered again has a new one
    assert api.calls == ["list_slices", "node_uid", "apply_slice", "apply_slice"]
    assert _generations(api) == {2}
    last = api.slices[f"{NODE}-{DRIVER}-1"]["spec"]["devices"][-1]
    assert last["attributes"] == {"netclaim.dev/ifName": {"string": "renamed"}}


async def test_shrinking_deletes_the_stale_slice() -> None:
    api, publisher = await _published([_device(f"nic{i:03d}") for i in range(66)])
    assert await publisher.publish([_device("nic000")]) == 2
    assert api.calls == ["list_slices", "node_uid", "apply_slice", "delete_slice"]
    assert list(_pool(api)) == [f"{NODE}-{DRIVER}-0"]
    assert api.slices[f"{NODE}-{DRIVER}-0"]["spec"]["pool"] == {
        "name": NODE,
        "generation": 2,
        "resourceSliceCount": 1,
    }


async def test_a_node_without_devices_publishes_one_empty_slice() -> None:
    api, publisher = await _published([_device("nic0")])
    assert await publisher.publish([]) == 1
    [body] = api.slices.values()
    assert body["spec"]["devices"] == [] and body["spec"]["pool"]["resourceSliceCount"] == 1


@pytest.mark.parametrize(
    ("what", "path", "value"),
    [
        ("mixed generations", ("pool", "generation"), 7),
        ("another pool", ("pool", "name"), "node-b"),
        ("a wrong slice count", ("pool", "resourceSliceCount"), 3),
    ],
)
async def test_an_inconsistent_pool_is_rewritten_with_a_higher_generation(
    what: str, path: tuple[str, str], value: object
) -> None:
    devices = [_device(f"nic{i:03d}") for i in range(66)]
    api, publisher = await _published(devices)
    api.slices[f"{NODE}-{DRIVER}-1"]["spec"][path[0]][path[1]] = value
    assert await publisher.publish(devices) == 2, what
    expected = 8 if what == "mixed generations" else 2  # above the highest generation seen
    assert _generations(api) == {expected}
    assert {b["spec"]["pool"]["name"] for b in _pool(api).values()} == {NODE}
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in _pool(api).values()} == {2}


async def test_a_slice_deleted_by_someone_else_is_written_again() -> None:
    devices = [_device(f"nic{i:03d}") for i in range(66)]
    api, publisher = await _published(devices)
    del api.slices[f"{NODE}-{DRIVER}-1"]
    assert await publisher.publish(devices) == 2
    assert len(_pool(api)) == 2 and _generations(api) == {2}


def _api(devices: list[Device]) -> list[ApiDevice]:
    return sorted((d.to_api() for d in devices), key=lambda d: str(d["name"]))


def _slice(index: int, generation: int, count: int, pool: str, devices: list[ApiDevice]) -> Slice:
    name = f"{NODE}-{DRIVER}-{index}" if index >= 0 else f"{NODE}-other-0"
    return Slice(name, pool, generation, count, tuple(devices))


A, B = _api([_device("a")]), _api([_device("b")])


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        pytest.param([_slice(0, 3, 1, NODE, A)], True, id="current"),
        pytest.param([], False, id="no slice"),
        pytest.param([_slice(0, 3, 1, NODE, B)], False, id="other devices"),
        pytest.param([_slice(0, 3, 1, "node-b", A)], False, id="other pool"),
        pytest.param([_slice(0, 3, 2, NODE, A)], False, id="wrong count"),
        pytest.param([_slice(0, 3, 1, NODE, A), _slice(1, 3, 1, NODE, [])], False, id="extra slice"),
        pytest.param([_slice(-1, 3, 1, NODE, A)], False, id="other name"),
    ],
)
def test_up_to_date(current: list[Slice], expected: bool) -> None:
    publisher = SlicePublisher(FakeKubeApi(), NODE, DRIVER)
    assert publisher.slices.up_to_date(current, [A]) is expected


def test_mixed_generations_are_never_current_even_with_the_right_devices() -> None:
    publisher = SlicePublisher(FakeKubeApi(), NODE, DRIVER)
    desired = chunk(_api([_device(f"nic{i:03d}") for i in range(66)]))
    current = [_slice(i, 1 + i, 2, NODE, part) for i, part in enumerate(desired)]
    assert not publisher.slices.up_to_date(current, desired)
    current[1] = replace(current[1], generation=1)
    assert publisher.slices.up_to_date(current, desired)


async def test_remove_all_deletes_only_this_pool() -> None:
    api, publisher = await _published([_device(f"nic{i:03d}") for i in range(66)])
    await SlicePublisher(api, "node-b", DRIVER).publish([_device("nic0")])
    await SlicePublisher(api, NODE, "other.example.com").publish([_device("nic0")])
    await publisher.remove_all()
    assert _pool(api) == {}
    assert sorted(api.slices) == [f"{NODE}-other.example.com-0", f"node-b-{DRIVER}-0"]


async def test_a_failed_write_is_an_error_and_the_next_publish_completes() -> None:
    api, publisher = await _published([_device("nic0")])
    api.fail_next.append(ApiUnavailableError("ResourceSlice: 503 unavailable"))
    api.calls.clear()
    with pytest.raises(ApiUnavailableError):
        await publisher.publish([_device("nic1")])
    assert await publisher.publish([_device("nic1")]) == 1
    [body] = api.slices.values()
    assert [d["name"] for d in body["spec"]["devices"]] == ["nic1"]
    assert body["spec"]["pool"]["generation"] == 2


async def test_the_slices_are_written_together_and_one_failing_fails_the_publish() -> None:
    """All of a generation's slices are applied at once; the failure of one still raises (the loop
    retries), and the next publish writes a whole new generation."""
    api = FakeKubeApi(node_uids={NODE: "0b1c-node-uid"})
    publisher = SlicePublisher(api, NODE, DRIVER)
    written = api.apply_slice
    in_flight: list[int] = []
    most = [0]

    async def apply(body: dict[str, Any]) -> list[dict[str, Any]]:
        in_flight.append(1)
        most[0] = max(most[0], len(in_flight))
        await asyncio.sleep(0)
        in_flight.pop()
        if body["metadata"]["name"].endswith("-1"):
            raise ApiUnavailableError("ResourceSlice: 503 unavailable")
        return await written(body)

    api.apply_slice = apply  # type: ignore[method-assign]
    devices = [_device(f"nic{i:03d}") for i in range(150)]  # 3 slices
    with pytest.raises(ApiUnavailableError):
        await publisher.publish(devices)
    assert most[0] == 3
    assert sorted(api.slices) == [f"{NODE}-{DRIVER}-0", f"{NODE}-{DRIVER}-2"]
    api.apply_slice = written  # type: ignore[method-assign]
    assert await publisher.publish(devices) == 3
    assert {b["spec"]["pool"]["generation"] for b in api.slices.values()} == {2}


async def test_slices_written_after_the_node_registered_again_are_owned_by_the_new_node() -> None:
    api, publisher = await _published([_device("nic0")])
    api.node_uids[NODE] = "new-node-uid"  # the Node was deleted, and the garbage collector took its slices
    api.slices.clear()
    assert await publisher.publish([_device("nic0")]) == 1
    [stored] = api.slices.values()
    assert [owner["uid"] for owner in stored["metadata"]["ownerReferences"]] == ["new-node-uid"]


async def test_another_writers_slice_in_the_nodes_pool_decides_nothing_and_stays() -> None:
    """The node's pool has the IP pools' rules now (one writer): only its own slices, named after it and
    owned by the Node, count for what is current and for the generation; another's is never deleted."""
    api, publisher = await _published([_device("nic0")])
    foreign = {
        "metadata": {"name": f"{NODE}-someone-0", "ownerReferences": [{"uid": "another-owner"}]},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 2**40, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    await api.apply_slice(foreign)
    api.calls.clear()
    assert await publisher.publish([_device("nic0")]) == 0
    assert await publisher.publish([_device("nic1")]) == 1
    assert api.slices[f"{NODE}-{DRIVER}-0"]["spec"]["pool"]["generation"] == 2
    assert f"{NODE}-someone-0" in api.slices


# --- an API server with a feature gate off ----------------------------------------------------------------


async def test_fields_the_api_server_drops_are_said_once_and_never_rewritten_in_a_loop(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DRAConsumableCapacity off: the server keeps the device without allowMultipleAllocations and the
    capacity's requestPolicy. Compared as written, every pass (each of our own writes is a watch event)
    would write a new generation: about one a second. The writer compares without what was dropped."""
    api = FakeKubeApi(
        node_uids={NODE: "0b1c-node-uid"},
        drops=frozenset({"allowMultipleAllocations", "capacity.requestPolicy"}),
    )
    publisher = SlicePublisher(api, NODE, DRIVER)
    devices = [_device("nic0"), _device("nic1")]
    assert await publisher.publish(devices) == 1
    stored = next(iter(_pool(api).values()))["spec"]["devices"][0]
    assert (
        "allowMultipleAllocations" not in stored
        and "requestPolicy" not in stored["capacity"]["netclaim.dev/bandwidth"]
    )
    for _ in range(5):  # the watch's events of our own write, the periodic resync
        assert await publisher.slices.write([d.to_api() for d in devices]) == 0
    assert _generations(api) == {1}
    warnings = [r for r in caplog.records if "the API server drops" in r.getMessage()]
    assert len(warnings) == 1
    assert "allowMultipleAllocations, capacity.requestPolicy" in warnings[0].getMessage()
    assert "feature gate DRAConsumableCapacity is off" in warnings[0].getMessage()
    [(node, uid, reason, message)] = api.node_events
    assert (node, uid, reason) == (NODE, "0b1c-node-uid", "NetclaimFieldsDropped")
    assert message == warnings[0].getMessage()
    [(node, said)] = api.node_conditions  # the Node's condition, as node-problem-detector's
    assert node == NODE
    assert {k: said[k] for k in ("type", "status", "reason")} == {
        "type": "NetclaimSliceFieldsDropped",
        "status": "True",
        "reason": "GateOff",
    }
    assert said["message"] == message
    for field, value in (("allowMultipleAllocations", 1), ("capacity.requestPolicy", 1), ("taints", 0)):
        assert (
            metrics.REGISTRY.get_sample_value(
                "netclaim_dropped_slice_fields", {"pool": "node", "field": field}
            )
            == value
        )
    # a real change is still written (one new generation), and nothing is said again
    assert await publisher.publish([_device("nic0")]) == 1
    assert _generations(api) == {2} and len(api.node_events) == 1 and len(api.node_conditions) == 1
    # after DROPPED_RECHECK_SECONDS the slices are written in full once: a gate turned on is used
    api.drops = frozenset()
    clock = [0.0]
    monkeypatch.setattr("netclaim.core.devices.slices.time.monotonic", lambda: clock[0] + 10**6)
    assert await publisher.slices.write([_device("nic0").to_api()]) == 1
    assert next(iter(_pool(api).values()))["spec"]["devices"][0]["allowMultipleAllocations"] is True
    assert (
        metrics.REGISTRY.get_sample_value(
            "netclaim_dropped_slice_fields", {"pool": "node", "field": "allowMultipleAllocations"}
        )
        == 0
    )
    assert await publisher.slices.write([_device("nic0").to_api()]) == 0
    # the gate is on now: the condition says so, with no new Event
    assert [(c["status"], c["reason"]) for _, c in api.node_conditions] == [
        ("True", "GateOff"),
        ("False", "AllFieldsKept"),
    ]
    assert len(api.node_events) == 1


async def test_a_node_whose_fields_are_all_kept_says_so_once() -> None:
    """An agent's first write sets the condition False (one that an earlier agent set True when the gate
    was off is cleared); later writes that keep everything set nothing."""
    api = FakeKubeApi(node_uids={NODE: "0b1c-node-uid"})
    publisher = SlicePublisher(api, NODE, DRIVER)
    assert await publisher.publish([_device("nic0")]) == 1
    assert await publisher.publish([_device("nic1")]) == 1
    [(node, said)] = api.node_conditions
    assert (node, said["type"], said["status"], said["reason"]) == (
        NODE,
        "NetclaimSliceFieldsDropped",
        "False",
        "AllFieldsKept",
    )
    assert api.node_events == []


async def test_a_condition_that_could_not_be_set_is_set_after_the_next_write() -> None:
    api = FakeKubeApi(node_uids={NODE: "0b1c-node-uid"})
    failing = api.set_node_condition

    async def unavailable(node: str, condition: dict[str, str]) -> None:
        raise ApiUnavailableError("the API server is away")

    api.set_node_condition = unavailable  # type: ignore[method-assign]
    publisher = SlicePublisher(api, NODE, DRIVER)
    assert await publisher.publish([_device("nic0")]) == 1  # the slices are written all the same
    api.set_node_condition = failing  # type: ignore[method-assign]
    assert await publisher.publish([_device("nic1")]) == 1
    assert [c["status"] for _, c in api.node_conditions] == ["False"]


def test_dropped_fields_are_found_per_gate() -> None:
    written = _device("nic0").to_api()
    written["taints"] = [{"key": "netclaim.dev/link-down", "effect": "NoSchedule"}]
    assert dropped_fields([written], [written]) == frozenset()
    kept_taintless = {k: v for k, v in written.items() if k != "taints"}
    assert dropped_fields([written], [kept_taintless]) == {"taints"}
    assert dropped_fields([written], []) == {"allowMultipleAllocations", "taints", "capacity.requestPolicy"}
    assert normalized_device(written, frozenset({"taints"})) == normalized_device(
        kept_taintless, frozenset({"taints"})
    )
