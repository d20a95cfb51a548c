"""What the Kubernetes adapter reads of the API's JSON, through the real lightkube and httpx clients on a
transport that answers as the API server does: no depth the API server stores breaks a read, and one
object that cannot be read never fails a list."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, cast

import httpx2 as httpx
import ijson.backends.python  # type: ignore[import-untyped]  # no type information shipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.adapters.kube import connection
from netclaim.adapters.kube.addresses import KubeAddresses
from netclaim.adapters.kube.claims import PATCH_NOT_APPLIED, KubeClaims
from netclaim.adapters.kube.connection import POLICIES, KubeConnection
from netclaim.adapters.kube.reader import KubeClusterReader
from netclaim.adapters.kube.watched import network_policies
from netclaim.core import objects
from netclaim.core.objects import Claim, IPAllocation, item_spans, read_json, read_list
from netclaim.errors import (
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
    ConflictError,
    GoneError,
    NotServedError,
)
from netclaim.runtime.metrics import REGISTRY
from tests.unit.fakes import KUBECONFIG, FakeApiServer, api_status

API_DEPTH = 5000  # 10 KiB of `[[[[…]]]]`: as deep as the API server stores an opaque config
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
ALLOCATIONS = "/apis/netclaim.dev/v1alpha1/ipallocations"
POOLS = "/apis/netclaim.dev/v1alpha1/ippools"


def _nested(depth: int) -> str:
    """JSON text of a list `depth` levels deep, as a tenant can put in an opaque config."""
    return "[" * depth + "]" * depth


GPU_ENTRY = (
    f'{{"driver": "gpu.example.com", "pool": "node-1", "device": "gpu0", "data": {_nested(API_DEPTH)}}}'
)


def _claim(
    name: str, parameters: str = '{"apiVersion": "netclaim.dev/v1alpha1"}', devices: str = GPU_ENTRY
) -> str:
    """A claim as the API server sends it, its opaque config's parameters and its status.devices entries
    as given (JSON text): another driver's entry nested as deep as the API allows unless told."""
    return f"""{{
        "metadata": {{"namespace": "team-a", "name": "{name}", "uid": "uid-{name}", "resourceVersion": "7",
                      "ownerReferences": [{{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu",
                                           "controller": true}}]}},
        "spec": {{"devices": {{"requests": [
            {{"name": "net", "exactly": {{"deviceClassName": "netclaim"}}}}
        ]}}}},
        "status": {{
            "allocation": {{"devices": {{
                "results": [{{"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": "d"}}],
                "config": [{{"source": "FromClaim", "opaque": {{"driver": "netclaim.dev",
                                                                "parameters": {parameters}}}}}]
            }}}},
            "reservedFor": [{{"resource": "pods", "name": "p", "uid": "pu"}}],
            "devices": [{devices}]
        }}
    }}"""


def _allocation(name: str, address: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "3"},
        "spec": {
            "pool": "lan",
            "address": address,
            "claim": {"namespace": "team-a", "name": "c", "uid": "claim-uid"},
            "node": "node-1",
        },
    }


def _listing(*items: str) -> str:
    return '{"kind": "List", "metadata": {"resourceVersion": "9"}, "items": [' + ",".join(items) + "]}"


@pytest.fixture
async def server() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture
async def kube(server: FakeApiServer) -> AsyncIterator[KubeConnection]:
    opened = KubeConnection(
        KUBECONFIG, "netclaim.dev-controller", transport=httpx.MockTransport(server.handle)
    )
    yield opened
    await opened.close()


@pytest.fixture
def claims(kube: KubeConnection) -> KubeClaims:
    return KubeClaims(kube)


@pytest.fixture
def addresses(kube: KubeConnection) -> KubeAddresses:
    return KubeAddresses(kube)


def _unreadable(kind: str) -> float:
    return REGISTRY.get_sample_value("netclaim_unreadable_objects_total", {"kind": kind}) or 0.0


async def _events(server: FakeApiServer, count: int) -> list[dict[str, Any]]:
    """The Events the API server got, once `count` have come (they are sent off the list's path), and a
    moment more for any that should not come."""
    for _ in range(500):
        if len(server.events) >= count:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    return server.events


def test_json_nested_far_deeper_than_pythons_recursion_limit_is_read() -> None:
    assert read_json(_nested(50_000))  # built without recursion; stdlib json stops near 1,000
    with pytest.raises(ValueError, match="not JSON"):
        read_json('{"a": ')


def test_an_integer_past_int64_is_read() -> None:
    """JSON has no integer limit and anyone may write one into a claim's opaque config or a status (seen:
    an IPv6 pool's size, 2**64 - 1, in the IPPool's status): the C parser stops at int64, the slow one
    reads it (in a list, that item alone: see below)."""
    assert read_json('{"items": [{"size": 18446744073709551615, "rate": 1.5}, [2, -0.25e1]]}') == {
        "items": [{"size": 2**64 - 1, "rate": 1.5}, [2, -2.5]]
    }


def test_no_integer_crashes_the_reader() -> None:
    """Handed numbers as text (which reads any integer at C speed), ijson's C parser corrupts memory on
    an integer of more digits than Python makes an int of: the process crashed within 50 such reads (a
    segmentation fault). read_json never hands it one; a crash would end this child, not the test run."""
    probe = (
        "import gc\n"
        "from netclaim.core.objects import read_json, read_list\n"
        "n = b'7' * 5000\n"
        "for i in range(300):\n"
        '    read_list(b\'{"items": [{"a": 1}, {"n": \' + n + b\'}, {"b": [2.5]}]}\')\n'
        "    try:\n"
        "        read_json(b'{\"n\": ' + n + b'}')\n"
        "    except ValueError:\n"
        "        pass\n"
        "    gc.collect()\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]


def test_what_only_the_slow_parser_reads_is_read() -> None:
    """A surrogate escaped out of its pair is JSON the C parser cannot decode (it raised UnicodeDecodeError,
    which failed any list holding one)."""
    assert read_json(b'{"a": "\\udc00\\ud800x", "b": [1]}') == {"a": "\udc00\ud800x", "b": [1]}


# A JSON value as an API object may hold one: strings rich in what shapes JSON text (quotes, backslashes,
# brackets) and in what only the slow parser reads (surrogates out of their pairs).
_TEXT = st.text(alphabet=st.sampled_from('ab"\\[]{},: \n\u00e9\U0001f600\ud800\udc00'), max_size=12)
_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)
_ITEMS = st.lists(
    st.dictionaries(_TEXT, _VALUE, max_size=4) | st.lists(_VALUE, max_size=3) | _TEXT, max_size=5
)


# JSON values with integers past int64 (which yajl's C parser cannot read)
_DOCUMENT = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_DOCUMENT)
def test_both_parsers_read_a_document_alike(value: Any) -> None:
    """The standard library's parser reads what it can, ijson's the rest: the same document either way."""
    data = json.dumps(value).encode()
    assert read_json(data) == objects._built(ijson.backends.python.basic_parse(data, use_float=True))


@pytest.mark.parametrize("data", [b'{"a": NaN}', b"[Infinity]", b'{"a": 1} x', b'{"a": "\xff"}'])
def test_what_is_not_json_is_refused_by_every_parser(data: bytes) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        read_json(data)


@settings(max_examples=300, deadline=None)
@given(_ITEMS, st.sampled_from([None, 0, 2]), st.booleans())
def test_the_items_of_a_list_are_found_whatever_they_hold(
    items: list[Any], indent: int | None, first: bool
) -> None:
    document = (
        {"items": items, "kind": "List"}
        if first
        else {"kind": "items", "metadata": {"items": []}, "items": items}
    )
    data = json.dumps(document, indent=indent).encode()
    expected = json.loads(data)["items"]  # as json reads them: a surrogate pair escaped is one character
    assert [json.loads(data[start:end]) for start, end in item_spans(data)] == expected
    for cut in {1, len(data) // 2, len(data) - 1}:  # a list cut short is not a shorter list
        with pytest.raises(ValueError):
            item_spans(data[:cut])


def test_a_list_the_fast_parser_cannot_read_whole_is_read_item_by_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the item that needs it goes to the slow parser (before: the whole list, for the whole cluster,
    at every pass); an item no parser reads fails no other, and is said."""
    slow = ijson.backends.python.basic_parse
    asked: list[bytes] = []

    def spied(data: bytes, **options: Any) -> Any:
        asked.append(data)
        return slow(data, **options)

    monkeypatch.setattr(ijson.backends.python, "basic_parse", spied)
    odd = b'{"name": "odd", "note": "\\udc00\\ud800"}'
    digits = b'{"name": "digits", "n": ' + b"7" * 5000 + b"}"  # past Python's int limit: no parser reads it
    data = b'{"kind": "List", "items": [{"name": "a"}, ' + odd + b", " + digits + b', {"name": "b"}]}'
    found = read_list(data)
    assert [i["name"] for i in found.items] == ["a", "odd", "b"]
    assert found.items[1]["note"] == "\udc00\ud800"
    [unread] = found.unread
    assert unread.startswith("not JSON")
    assert asked == [digits]  # the standard library's parser reads the odd one
    deep = b'{"name": "deep", "v": ' + _nested(5_000).encode() + b"}"  # only ijson's read it
    big = b'{"a": 18446744073709551616}'  # past int64: the standard library's parser reads it
    data = b'{"items": [{"a": 1}, ' + big + b", " + deep + b", " + digits + b"]}"
    found = read_list(data)
    assert [i.get("name") for i in found.items] == [None, None, "deep"]
    assert found.items[1] == {"a": 2**64} and len(found.unread) == 1
    assert asked == [digits, digits]  # deep is built by ijson's C parser, not its pure-Python one


@pytest.mark.parametrize(
    "data",
    [
        b'{"items": [{"a": 1}',
        b'{"items": [{"a": "\\udc00\\ud800"}, {"b": "cut',
        b"<html>",
        b"[]",
        b'{"items": 3}',
    ],
    ids=["cut", "cut-in-a-string", "html", "array", "no-list"],
)
def test_what_is_not_a_list_of_items_is_refused_whole(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"not JSON|not a list|no list"):
        read_list(data)


def _page(following: str, *items: str) -> str:
    meta = {"resourceVersion": "9"} | ({"continue": following} if following else {})
    return '{"kind": "List", "metadata": ' + json.dumps(meta) + ', "items": [' + ",".join(items) + "]}"


async def test_the_controllers_list_of_claims_is_read_page_by_page_each_claim_kept_compact(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    """A cluster's 50,000 claims were one answer, held whole with every claim decoded (hundreds of MiB that
    the process then kept); now 500 at a time, each page's claims compacted before the next is read."""
    server.pages[CLAIMS] = [
        _page("1", _claim("a"), _claim("b")),
        _page("2", _claim("deep", _nested(API_DEPTH))),
        _page("", _claim("c")),
    ]
    listed = await claims.listed_claims("netclaim.dev")
    assert ([c.name for c in listed.items], listed.version) == (["a", "b", "deep", "c"], "9")
    assert all(c.configs == () and c.devices_status == () and c.addresses_of for c in listed.items)
    sent = [r.url.params for r in server.requests if r.url.path == CLAIMS]
    assert [(p.get("limit"), p.get("continue")) for p in sent] == [("500", None), ("500", "1"), ("500", "2")]


def test_a_page_read_item_by_item_still_gives_its_version_and_continue_token() -> None:
    digits = b'{"name": "digits", "n": ' + b"7" * 5000 + b"}"  # past Python's int limit: no parser reads it
    meta = b'{"kind": "List", "metadata": {"resourceVersion": "9", "continue": "abc"}, '
    found = read_list(meta + b'"items": [{"name": "a"}, ' + digits + b"]}")
    assert (found.version, found.following, len(found.items), len(found.unread)) == ("9", "abc", 1, 1)
    assert (read_list(b'{"items": [' + digits + b"]}").version, found.following) == (None, "abc")


async def test_a_page_whose_metadata_cannot_be_read_fails_the_list_instead_of_cutting_it_short(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    server.pages[CLAIMS] = [_page("1", _claim("a")), '{"items": [' + _claim("b") + "]}"]
    with pytest.raises(ApiUnavailableError, match="metadata of a page"):
        await claims.listed_claims("netclaim.dev")


async def test_a_claim_nested_as_deep_as_the_api_allows_does_not_fail_the_controllers_list(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    """The deep claim is read as far as it can be (what the controller needs: its UID, its allocation)
    and reported; the others are read whole. Before, the whole list failed: no reconcile, for anyone."""
    deep = _claim("deep", _nested(API_DEPTH))
    no_identity = '{"metadata": {"name": {"a": 1}}}'
    server.answers[CLAIMS] = (200, _listing(_claim("good-1"), deep, no_identity, _claim("good-2")))
    before = _unreadable("ResourceClaim")
    listed = await claims.list_claims()
    assert [c.name for c in listed] == ["good-1", "deep", "good-2"]
    good, bad = listed[0], listed[1]
    assert good.problems() == [] and good.configs[0].parameters == {"apiVersion": "netclaim.dev/v1alpha1"}
    assert (bad.uid, bad.owned_by_pod, [r.device for r in bad.results]) == ("uid-deep", True, ["d"])
    [config] = bad.configs
    assert config.parameters is None
    assert bad.problems() == [
        "status.allocation.devices.config[0].opaque.parameters: nested deeper than 32 levels"
    ]
    assert _unreadable("ResourceClaim") == before + 2  # the deep one and the one without an identity
    [event] = await _events(server, 1)  # the one without a readable name has nothing to hang an Event on
    assert event["involvedObject"] == {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "name": "deep",
        "namespace": "team-a",
        "uid": "uid-deep",
    }
    assert (event["type"], event["reason"]) == ("Warning", "NetclaimUnreadable")
    assert "nested deeper than 32 levels" in event["message"]
    await claims.list_claims()  # the next pass: each version of an object is reported once
    assert len(await _events(server, 1)) == 1 and _unreadable("ResourceClaim") == before + 2


async def test_a_claim_whose_config_cannot_be_read_keeps_what_its_teardown_needs(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    server.answers["/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/deep"] = (
        200,
        _claim("deep", _nested(API_DEPTH)),
    )
    claim = await claims.get_claim("team-a", "deep")
    assert (claim.uid, claim.owned_by_pod, [p.uid for p in claim.reserved_for]) == ("uid-deep", True, ["pu"])
    assert claim.unreadable == ""  # its status is readable: netclaim may still write its own entries
    assert [d["driver"] for d in claim.devices_status] == ["gpu.example.com"]


async def test_a_claim_without_a_readable_identity_is_a_config_error_and_a_missing_one_gone(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/odd"
    server.answers[path] = (200, '{"metadata": {"uid": ["not", "a", "string"]}}')
    with pytest.raises(ConfigError, match="claim team-a/odd: cannot be read"):
        await claims.get_claim("team-a", "odd")
    with pytest.raises(GoneError):
        await claims.get_claim("team-a", "missing")
    server.answers[path] = (200, "<html>a proxy's page</html>")
    with pytest.raises(ApiUnavailableError, match="not JSON"):
        await claims.get_claim("team-a", "odd")


async def test_a_claim_of_another_shape_is_read_as_far_as_its_identity(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    odd = '{"metadata": {"namespace": "team-a", "name": "odd", "uid": "u"}, "status": {"reservedFor": 3}}'
    server.answers[CLAIMS] = (200, _listing(odd))
    [claim] = await claims.list_claims()
    assert (claim.uid, claim.results, claim.devices_status) == ("u", (), ())
    assert claim.unreadable.startswith("cannot be read (TypeError")


@pytest.mark.parametrize("step", ["read", "made"])
async def test_a_list_is_read_and_made_into_claims_off_the_event_loop(
    claims: KubeClaims, server: FakeApiServer, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A cluster's claim list is megabytes: read on the event loop, it held up every watch, /healthz and
    status write of the program (a second or more for 10 MB), and making its claims as long again."""
    server.answers[CLAIMS] = (200, _listing(*(_claim(f"c{i}") for i in range(10))))  # 100 KiB
    working, loop_ran = threading.Event(), threading.Event()

    def slowly(work: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def slow(data: Any) -> Any:
            working.set()
            assert loop_ran.wait(5.0), f"the event loop did not run while the list was {step}"
            return work(data)

        return slow

    async def meanwhile() -> None:
        await asyncio.to_thread(working.wait, 5.0)
        loop_ran.set()  # only if the event loop is free to run this

    if step == "read":
        monkeypatch.setattr(connection, "read_list", slowly(read_list))
    else:
        monkeypatch.setattr(Claim, "from_api", slowly(Claim.from_api))
    listed, _ = await asyncio.gather(claims.list_claims(), meanwhile())
    assert len(listed) == 10


async def test_an_item_no_parser_reads_fails_a_claim_list_and_is_left_out_of_others(
    claims: KubeClaims, addresses: KubeAddresses, server: FakeApiServer
) -> None:
    """A claim whose UID cannot be read: listed without it, the addresses it holds would be freed as a
    deleted claim's. An allocation: neither counted nor freed, as one of another shape."""
    unread = '{"metadata": {"name": "x"}, "n": ' + "7" * 5000 + "}"
    server.answers[CLAIMS] = (200, _listing(_claim("a"), unread))
    with pytest.raises(ConfigError, match="ResourceClaims: 1 cannot be read: not JSON"):
        await claims.list_claims()
    server.answers[ALLOCATIONS] = (200, _listing(json.dumps(_allocation("good", "10.10.3.7/24")), unread))
    before = _unreadable("IPAllocation")
    assert [a.name for a in await addresses.list_ip_allocations()] == ["good"]
    assert _unreadable("IPAllocation") == before + 1


async def test_ip_allocations_with_malformed_addresses_are_skipped_and_reported(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    """Before, `ipaddress.ip_interface` raised on them in the controller and in every agent taking an
    address from their pool."""
    items = [
        _allocation("good", "10.10.3.7/24"),
        _allocation("not-an-ip", "not-an-ip"),
        _allocation("no-prefix", "10.10.3.8"),
        _allocation("an-object", {"a": [1]}),  # type: ignore[arg-type]
    ]
    server.answers[ALLOCATIONS] = (200, json.dumps({"metadata": {"resourceVersion": "9"}, "items": items}))
    before = _unreadable("IPAllocation")
    assert [a.name for a in await addresses.list_ip_allocations(pool="lan")] == ["good"]
    assert _unreadable("IPAllocation") == before + 3
    assert [(e["involvedObject"]["name"], e["metadata"]["namespace"]) for e in await _events(server, 3)] == [
        ("not-an-ip", "default"),  # a cluster-scoped object's Events go where kubectl looks for them
        ("no-prefix", "default"),
        ("an-object", "default"),
    ]
    [listed] = [r for r in server.requests if r.url.path == ALLOCATIONS]
    assert listed.url.params["labelSelector"] == "netclaim.dev/pool=lan"
    server.answers[f"{ALLOCATIONS}/not-an-ip"] = (200, json.dumps(items[1]))
    with pytest.raises(ConfigError, match="IPAllocation not-an-ip: cannot be read"):
        await addresses.get_ip_allocation("not-an-ip")


async def test_reporting_an_unreadable_object_holds_up_no_pass(
    kube: KubeConnection, server: FakeApiServer
) -> None:
    """Before, each Warning Event was written inside the list's loop: a slow API server (or thousands of
    unreadable objects) held up the controller's pass behind them."""
    answer, sent = asyncio.Event(), asyncio.Event()

    async def slow_events(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            await answer.wait()
            sent.set()
        return server.handle(request)

    slow = KubeConnection(KUBECONFIG, "netclaim.dev-controller", transport=httpx.MockTransport(slow_events))
    items = [_allocation("good", "10.10.3.7/24"), _allocation("bad", "not-an-ip")]
    server.answers[ALLOCATIONS] = (200, json.dumps({"metadata": {"resourceVersion": "9"}, "items": items}))
    try:
        listed = await asyncio.wait_for(KubeAddresses(slow).list_ip_allocations(), 5.0)
        assert [a.name for a in listed] == ["good"]
        assert server.events == []  # not sent yet: the list did not wait for it
        answer.set()
        await asyncio.wait_for(sent.wait(), 5.0)
        assert [e["involvedObject"]["name"] for e in await _events(server, 1)] == ["bad"]
    finally:
        await slow.close()


async def test_any_number_of_unreadable_objects_is_reported_once(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    """Before, what was reported was forgotten all at once at 4,096 objects: past that many, every pass
    reported every one again (a log line, the metric, an Event each). Now a list remembers what it held
    unreadable at its last read, however many; an object fixed and broken again is reported again, and
    Events wait MAX_QUEUED_EVENTS at the most (the rest is logged)."""
    many = [_allocation(f"bad-{i}", "not-an-ip") for i in range(5000)]
    server.answers[ALLOCATIONS] = (200, json.dumps({"metadata": {"resourceVersion": "9"}, "items": many}))
    before = _unreadable("IPAllocation")
    await addresses.list_ip_allocations()
    assert _unreadable("IPAllocation") == before + 5000
    assert len(await _events(server, connection.MAX_QUEUED_EVENTS)) == connection.MAX_QUEUED_EVENTS
    await addresses.list_ip_allocations()  # the next pass
    assert _unreadable("IPAllocation") == before + 5000
    fixed = [_allocation("bad-0", "10.10.3.7/24"), *many[1:]]
    server.answers[ALLOCATIONS] = (200, json.dumps({"metadata": {"resourceVersion": "9"}, "items": fixed}))
    await addresses.list_ip_allocations()
    server.answers[ALLOCATIONS] = (200, json.dumps({"metadata": {"resourceVersion": "9"}, "items": many}))
    await addresses.list_ip_allocations()  # broken again
    assert _unreadable("IPAllocation") == before + 5001


async def test_the_cached_list_of_ip_pools_is_read_from_the_watch_cache(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    good = {"metadata": {"name": "lan"}, "spec": {"ranges": [{"subnet": "10.10.3.0/24"}]}}
    server.answers[POOLS] = (200, _listing(json.dumps(good)))
    assert await addresses.list_ippools(cached=True) == await addresses.list_ippools() == [good]
    cached, consistent = [r for r in server.requests if r.url.path == POOLS]
    assert dict(cached.url.params) == {"resourceVersion": "0"}
    assert "resourceVersion" not in consistent.url.params


async def test_a_claims_held_list_is_bounded_or_consistent(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    server.answers[ALLOCATIONS] = (
        200,
        json.dumps({"metadata": {"resourceVersion": "42"}, "items": [_allocation("a", "10.10.3.7/24")]}),
    )
    bounded = await addresses.held_ip_allocations("u-1", "17")
    consistent = await addresses.held_ip_allocations("u-1", None)
    assert bounded.version == consistent.version == "42" and [a.name for a in bounded.items] == ["a"]
    first, second = [dict(r.url.params) for r in server.requests if r.url.path == ALLOCATIONS]
    label = "netclaim.dev/claim-uid=u-1"
    assert first == {"labelSelector": label, "resourceVersion": "17", "resourceVersionMatch": "NotOlderThan"}
    assert second == {"labelSelector": label}


async def test_an_ip_pool_nested_too_deep_is_skipped_and_reported(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    good = {"metadata": {"name": "lan"}, "spec": {"ranges": [{"subnet": "10.10.3.0/24"}]}}
    deep = f'{{"metadata": {{"name": "deep", "uid": "u"}}, "spec": {{}}, "status": {_nested(API_DEPTH)}}}'
    nameless = '{"metadata": [1], "spec": {}}'
    server.answers[POOLS] = (200, _listing(json.dumps(good), deep, nameless))
    before = _unreadable("IPPool")
    assert await addresses.list_ippools() == [good]
    assert _unreadable("IPPool") == before + 2
    server.answers[f"{POOLS}/deep"] = (200, deep)
    with pytest.raises(ConfigError, match="IPPool deep: cannot be read: nested deeper than 32 levels"):
        await addresses.get_ippool("deep")


async def test_a_status_write_sends_only_our_entries_never_other_drivers(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    """Another driver's entry, however deep, is neither re-sent nor able to make our write fail."""
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"
    ours = {"driver": "netclaim.dev", "pool": "node-1", "device": "d"}
    devices = ",".join([json.dumps(ours), GPU_ENTRY, json.dumps({**ours, "device": "e"})])
    server.answers[path] = (200, _claim("c", devices=devices))
    server.answers[f"{path}/status"] = (200, _claim("c", _nested(API_DEPTH), devices))  # not read
    new = {**ours, "conditions": []}
    await claims.write_claim_devices(await claims.get_claim("team-a", "c"), "netclaim.dev", [new])
    [patch] = [r for r in server.requests if r.method == "PATCH"]
    assert (patch.url.path, patch.url.params["fieldManager"]) == (f"{path}/status", "netclaim.dev-controller")
    assert patch.headers["Content-Type"] == "application/json-patch+json"
    assert json.loads(patch.content) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "remove", "path": "/status/devices/2"},
        {"op": "remove", "path": "/status/devices/0"},
        {"op": "add", "path": "/status/devices/-", "value": new},
    ]


async def test_a_status_write_to_a_claim_without_entries_adds_them(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"
    server.answers[path] = server.answers[f"{path}/status"] = (200, _claim("c", devices=""))
    await claims.write_claim_devices(await claims.get_claim("team-a", "c"), "netclaim.dev", [{"device": "d"}])
    [patch] = [r for r in server.requests if r.method == "PATCH"]
    assert json.loads(patch.content)[1:] == [
        {"op": "add", "path": "/status/devices", "value": [{"device": "d"}]}
    ]


async def test_a_status_write_whose_patch_did_not_apply_is_a_conflict_and_an_invalid_one_is_rejected(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    """kube-apiserver answers a JSON Patch whose resourceVersion test failed with a bare 422 (no details),
    as tests/cluster/test_status_writes.py sees it; a validation error names its field in its causes."""
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"
    server.answers[path] = (200, _claim("c", devices=""))
    read = await claims.get_claim("team-a", "c")
    not_applied = {"kind": "Status", "status": "Failure", "message": PATCH_NOT_APPLIED, "reason": "Invalid"}
    server.answers[f"{path}/status"] = (422, json.dumps({**not_applied, "details": {}, "code": 422}))
    with pytest.raises(ConflictError, match="changed since it was read"):
        await claims.write_claim_devices(read, "netclaim.dev", [{"device": "d"}])
    cause = {"reason": "FieldValueTooLong", "field": "status.devices[0].networkData.interfaceName"}
    invalid = {**not_applied, "message": 'ResourceClaim.resource.k8s.io "c" is invalid'}
    server.answers[f"{path}/status"] = (422, json.dumps({**invalid, "details": {"causes": [cause]}}))
    with pytest.raises(ApiRejectedError, match="is invalid") as rejected:
        await claims.write_claim_devices(read, "netclaim.dev", [{"device": "d"}])
    assert not isinstance(rejected.value, ConflictError)


async def test_an_address_is_released_only_if_its_object_is_the_one_read(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    held = IPAllocation.from_api(_allocation("lan-10-10-3-7", "10.10.3.7/24"))
    server.answers[f"{ALLOCATIONS}/lan-10-10-3-7"] = (200, api_status(200, "deleted"))
    await addresses.delete_ip_allocation(held)
    [delete] = server.requests
    assert (delete.method, delete.url.path) == ("DELETE", f"{ALLOCATIONS}/lan-10-10-3-7")
    assert json.loads(delete.content) == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": "uid-lan-10-10-3-7"},
    }
    del server.answers[f"{ALLOCATIONS}/lan-10-10-3-7"]
    await addresses.delete_ip_allocation(held)  # gone already: fine


def _event(kind: str, version: str, obj: str = "") -> str:
    return (
        f'{{"type": "{kind}", "object": {obj or json.dumps({"metadata": {"resourceVersion": version}})}}}\n'
    )


async def test_a_watch_passes_over_objects_no_one_can_read_and_resumes_where_it_ended(
    claims: KubeClaims, server: FakeApiServer
) -> None:
    deep = f'{{"metadata": {{"resourceVersion": "12"}}, "spec": {_nested(API_DEPTH)}}}'
    server.streams = [_event("ADDED", "11") + _event("MODIFIED", "", deep), _event("DELETED", "13")]
    changes = cast(AsyncGenerator[tuple[str, Claim], None], claims.claim_changes())
    async with contextlib.aclosing(changes) as watch:
        events = [await anext(watch) for _ in range(3)]
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    seen = [claim for _, claim in events]
    assert [c.resource_version for c in seen] == ["11", "12", "13"]
    assert [bool(c.unreadable) for c in seen] == [False, True, False]  # a pass starts for it all the same
    first, resumed = server.requests
    assert first.url.path == CLAIMS and "resourceVersion" not in first.url.params
    assert resumed.url.params["resourceVersion"] == "12"  # the server ended the first stream


async def test_the_pods_informer_lists_in_pages_then_watches_from_the_list_keeping_compact_pods(
    kube: KubeConnection, server: FakeApiServer
) -> None:
    """Every pod of the cluster reaches the controller's informer once by a paged list, then by the watch
    from that list's version; what it keeps of each is what the passes read (no annotations)."""
    from netclaim.adapters.kube import watched

    def pod(name: str, version: str) -> str:
        return json.dumps(
            {
                "metadata": {
                    "namespace": "team-a",
                    "name": name,
                    "uid": f"{name}-uid",
                    "resourceVersion": version,
                    "labels": {"app": "db"},
                    "annotations": {"big": "x" * 1000},
                },
                "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
            }
        )

    server.answers["/api/v1/pods"] = (200, _listing(pod("a", "3")))
    server.streams = [_event("ADDED", "", pod("b", "10"))]
    source = watched.pods(kube)
    listed = await source.listed()
    assert [(p.name, p.labels, p.annotations) for p in listed.items] == [("a", {"app": "db"}, {})]
    async with contextlib.aclosing(cast(AsyncGenerator[Any, None], source.changes(listed.version))) as watch:
        kind, added = await anext(watch)
    assert (kind, added.name, added.annotations) == ("ADDED", "b", {})
    first, then = server.requests
    assert first.url.params["limit"] == "500" and first.url.params["fieldSelector"] == "spec.nodeName!="
    assert then.url.params["resourceVersion"] == "9" and then.url.params["fieldSelector"] == "spec.nodeName!="


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda s: s.streams.append(_event("ERROR", "", api_status(410, "too old resource version"))), "410"),
        (lambda s: s.streams.append("not json\n"), "not one"),
    ],
    ids=["error-event", "garbage"],
)
async def test_a_watch_that_the_server_ends_is_unavailable_and_started_afresh_by_its_caller(
    addresses: KubeAddresses, server: FakeApiServer, answer: Callable[[FakeApiServer], None], expected: str
) -> None:
    answer(server)
    with pytest.raises(ApiUnavailableError, match=expected):
        async for _ in addresses.ip_allocation_changes():
            pass


async def test_the_tools_read_a_cluster_holding_a_claim_nested_as_deep_as_the_api_allows(
    kube: KubeConnection, server: FakeApiServer
) -> None:
    """`netclaim explain` and `status` failed for everyone while one such claim existed."""
    empty = (200, '{"items": []}')
    for path in (
        "/api/v1/namespaces/team-a/pods",
        "/api/v1/pods",
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates",
        "/apis/resource.k8s.io/v1/deviceclasses",
        "/apis/resource.k8s.io/v1/resourceslices",
        "/api/v1/nodes",
        "/apis/discovery.k8s.io/v1/namespaces/team-a/endpointslices",
    ):
        server.answers[path] = empty
    server.answers[CLAIMS] = (403, api_status(403, "forbidden"))  # a tenant: its namespace's claims only
    namespaced = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
    server.answers[namespaced] = (200, _listing(_claim("deep", _nested(API_DEPTH)), _claim("good")))
    found, refused = await KubeClusterReader(kube).read_cluster("team-a")
    assert [c["metadata"]["name"] for c in found["claims"]] == ["deep", "good"]
    assert refused == ["ResourceClaim (*)"]


async def test_an_ipallocation_event_that_cannot_be_read_is_left_out_as_a_list_leaves_it_out(
    addresses: KubeAddresses, server: FakeApiServer
) -> None:
    """The controller's mirror keeps what the watch yields: a malformed address is neither counted nor
    freed."""
    spec = {"pool": "lan", "claim": {"namespace": "team-a", "uid": "u"}}
    bad = {"metadata": {"name": "lan-bad", "resourceVersion": "21"}, "spec": {**spec, "address": "nope"}}
    good = {
        "metadata": {"name": "lan-10-10-3-7", "resourceVersion": "22"},
        "spec": {**spec, "address": "10.10.3.7/24"},
    }
    server.streams = [_event("ADDED", "", json.dumps(bad)) + _event("ADDED", "", json.dumps(good))]
    changes = cast(
        AsyncGenerator[tuple[str, IPAllocation], None], addresses.ip_allocation_changes(since="20")
    )
    async with contextlib.aclosing(changes) as watch:
        kind, allocation = await anext(watch)
    assert (kind, allocation.name, allocation.address) == ("ADDED", "lan-10-10-3-7", "10.10.3.7/24")
    assert server.requests[0].url.params["resourceVersion"] == "20"


async def test_policies_never_served_are_none_and_once_served_a_404_keeps_what_is_held(
    kube: KubeConnection, server: FakeApiServer
) -> None:
    """No MultiNetworkPolicy CRD: no policies. Once the kind was served, a 404 (the CRD being replaced,
    an API server starting) fails the list instead of telling every policy gone, which would have opened
    every isolated pod."""
    from netclaim.adapters.kube import watched

    path = "/apis/k8s.cni.cncf.io/v1beta1/multi-networkpolicies"
    source = watched.network_policies(kube)
    server.answers[path] = (404, api_status(404, "the server could not find the requested resource"))
    assert (await source.listed()).items == []
    policy = {
        "metadata": {
            "namespace": "team-a",
            "name": "p",
            "resourceVersion": "4",
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": "netclaim.dev/lan3"},
        },
        "spec": {"podSelector": {}},
    }
    server.answers[path] = (200, _listing(json.dumps(policy)))
    [found] = (await source.listed()).items
    assert (found.name, found.networks, found.spec) == ("p", ("lan3",), '{"podSelector":{}}')
    server.answers[path] = (404, api_status(404, "the server could not find the requested resource"))
    with pytest.raises(NotServedError):
        await source.listed()


async def test_multinetworkpolicies_are_listed_fifty_at_a_time(
    kube: KubeConnection, server: FakeApiServer
) -> None:
    """A tenant's free JSON, up to 1.5 MB an object: a page of 500 could be 750 MB decoded at once."""
    path = POLICIES.path()
    policy = '{"metadata": {"namespace": "team-a", "name": "p", "uid": "u"}, "spec": {}}'
    server.pages[path] = [_page("1", policy), _page("", policy.replace('"p"', '"q"'))]
    listed = await network_policies(kube).listed()
    assert [p.name for p in listed.items] == ["p", "q"]
    assert {r.url.params.get("limit") for r in server.requests if r.url.path == path} == {"50"}
