"""EndpointSlices of Services over a netclaim network: which pods and addresses, the slices' shape, and a
pass that one bad Service never stops (netclaim.controller.services)."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from netclaim.controller import services as services_module
from netclaim.controller.services import (
    MAX_ENDPOINTS,
    EndpointsReconciler,
    HeldSlice,
    NetworkService,
    desired_slices,
    endpoints,
    same_slice,
)
from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.objects import Claim, ConsumerRef, IPAllocation, Pod, PodClaim, PodCondition
from netclaim.errors import ApiRejectedError, ApiUnavailableError, NetclaimError
from netclaim.runtime.trigger import KeyBackoff
from tests.unit.fakes import SAMPLE_DRIVER, sample_claim

READY = [{"type": "Ready", "status": "True", "reason": "InterfaceAttached"}]


def _published(claims: dict[str, Claim] | list[Claim], *allocations: IPAllocation) -> PublishedAddresses:
    found = list(claims.values()) if isinstance(claims, dict) else claims
    return PublishedAddresses.of_claims(found, allocations, (), SAMPLE_DRIVER)


def _publishing(api: FakeServices) -> Callable[[], Awaitable[PublishedAddresses]]:
    async def now() -> PublishedAddresses:
        return _published(api.claims)

    return now


def _service(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "namespace": "team-a",
            "name": "db",
            "uid": "svc-uid",
            "labels": {"netclaim.dev/network": "lan1"},
            "annotations": {"netclaim.dev/selector": "app=db"},
        },
        "spec": {
            "clusterIP": "None",
            "ports": [{"name": "pg", "port": 5432, "targetPort": 5432, "protocol": "TCP"}],
        },
    }
    for path, value in changes.items():
        where = body
        *parents, last = path.split("__")
        for parent in parents:
            where = where.setdefault(parent, {})
        where[last] = value
    return body


def _entry(ips: list[str], network: str = "lan1", interface: str = "net1", **extra: Any) -> dict[str, Any]:
    return {
        "driver": SAMPLE_DRIVER,
        "pool": "node-1",
        "device": "enp1s0",
        "conditions": READY,
        "networkData": {"interfaceName": interface, "ips": ips},
        "data": {"cniVersion": "1.0.0", "netclaim.dev/network": network},
        **extra,
    }


def _pod(name: str, *, ready: bool = True, node: str = "node-1", deleting: bool = False) -> Pod:
    return Pod(
        namespace="team-a",
        name=name,
        uid=f"{name}-uid",
        node=node,
        claims=(PodClaim(name="net", claim=f"{name}-net"),),
        conditions=(PodCondition("Ready", "True" if ready else "False", "", ""),),
        deleting=deleting,
    )


def _claim(pod: str, *entries: dict[str, Any]) -> Claim:
    return sample_claim(
        (),
        (),
        name=f"{pod}-net",
        uid=f"{pod}-claim-uid",
        reserved_for=(ConsumerRef(pod, f"{pod}-uid"),),
        devices_status=entries,
    )


def test_a_service_over_a_network_is_headless_without_a_selector_and_names_its_pods_in_an_annotation() -> (
    None
):
    served = NetworkService.from_api(_service())
    assert (served.network, served.selector, served.refusal, served.warning) == ("lan1", "app=db", "", "")
    assert served.ports == ({"name": "pg", "port": 5432, "protocol": "TCP"},)
    problems = {
        "selector": NetworkService.from_api(_service(spec__selector={"app": "db"})).refusal,
        "cluster IP": NetworkService.from_api(_service(spec__clusterIP="10.96.0.9")).refusal,
        "annotation": NetworkService.from_api(_service(metadata__annotations={})).refusal,
    }
    assert "spec.selector is set" in problems["selector"] and "netclaim.dev/selector" in problems["selector"]
    assert problems["cluster IP"].startswith("not headless")
    assert "annotation netclaim.dev/selector is missing" in problems["annotation"]


def test_a_named_target_port_is_left_out_and_said() -> None:
    ports = [{"name": "a", "port": 80, "targetPort": "http"}, {"name": "b", "port": 81, "protocol": "UDP"}]
    served = NetworkService.from_api(_service(spec__ports=ports))
    assert served.ports == ({"name": "b", "port": 81, "protocol": "UDP"},)
    assert served.warning == "spec.ports[0].targetPort 'http': only port numbers are served"
    assert served.refusal == ""
    both = NetworkService.from_api(_service(spec__ports=ports, spec__selector={"app": "db"}))
    assert both.refusal.startswith("spec.selector is set") and both.warning


def test_a_claims_addresses_on_a_network_are_ours_ready_and_routable() -> None:
    claim = _claim(
        "a",
        _entry(["10.1.0.5/24", "fe80::1/64", "fd01::5/64"], interface="net2"),
        _entry(["10.1.0.4/24"], interface="net1"),
        _entry(["10.2.0.4/24"], network="lan2"),
        _entry(["10.1.0.9/24"], conditions=[{"type": "Ready", "status": "False"}]),
        {**_entry(["10.1.0.8/24"]), "driver": "gpu.example.com"},
        {**_entry(["10.1.0.7/24"]), "data": {"cniVersion": "1.0.0"}},  # written before networks were
    )
    assert claim.network_addresses(SAMPLE_DRIVER) == {
        "lan1": ("10.1.0.4", "10.1.0.5", "fd01::5"),
        "lan2": ("10.2.0.4",),
    }
    kept = claim.compact(SAMPLE_DRIVER)  # what the controller keeps in memory reads the same
    assert kept.network_addresses(SAMPLE_DRIVER) == claim.network_addresses(SAMPLE_DRIVER)
    assert kept.devices_status == () and kept.configs == () and kept.reserved_for == claim.reserved_for
    assert kept.network_addresses("gpu.example.com") == {}  # only the driver's addresses are kept


def test_each_selected_pod_is_one_endpoint_per_family_ready_as_the_pod_and_its_interface() -> None:
    service = NetworkService.from_api(_service())
    pods = [
        _pod("a"),
        _pod("b", ready=False),
        _pod("c", deleting=True),
        _pod("pending", node=""),
        _pod("borrower"),  # names a claim reserved for another pod
    ]
    claims = {
        "a-net": _claim("a", _entry(["10.1.0.4/24", "10.1.0.40/24", "fd01::4/64"])),
        "b-net": _claim("b", _entry(["10.1.0.5/24"])),
        "c-net": _claim("c", _entry(["10.1.0.6/24"])),
        "pending-net": _claim("pending", _entry(["10.1.0.7/24"])),
        "borrower-net": replace(_claim("a", _entry(["10.1.0.8/24"])), name="borrower-net"),
    }
    found = {
        (e.pod.name, e.address): (e.ready, e.serving)
        for e in endpoints(service, pods, claims, _published(claims))
    }
    assert found == {
        ("a", "10.1.0.4"): (True, True),
        ("a", "fd01::4"): (True, True),
        ("b", "10.1.0.5"): (False, False),
        ("c", "10.1.0.6"): (False, True),  # terminating: serving, no longer ready
    }
    publish = replace(service, publish_not_ready=True)
    assert all(e.serving for e in endpoints(publish, pods[:2], claims, _published(claims)))


def test_slices_are_one_per_family_and_hundred_endpoints_owned_by_the_service() -> None:
    service = NetworkService.from_api(_service())
    pods = [_pod(f"p{i:03}") for i in range(MAX_ENDPOINTS + 1)]
    claims = {
        f"{p.name}-net": _claim(p.name, _entry([f"10.1.{i // 200}.{i % 200 + 1}/16"]))
        for i, p in enumerate(pods)
    }
    claims["p000-net"] = _claim("p000", _entry(["10.1.9.9/16", "fd01::9/64"]))
    slices = desired_slices(service, endpoints(service, pods, claims, _published(claims)), SAMPLE_DRIVER)
    assert {name: len(body["endpoints"]) for name, body in slices.items()} == {
        "db-netclaim-ipv4": MAX_ENDPOINTS,
        "db-netclaim-ipv4-1": 1,
        "db-netclaim-ipv6": 1,
    }
    body = slices["db-netclaim-ipv6"]
    assert body["addressType"] == "IPv6"
    assert body["metadata"]["labels"] == {
        "kubernetes.io/service-name": "db",
        "endpointslice.kubernetes.io/managed-by": SAMPLE_DRIVER,
        "service.kubernetes.io/headless": "",
        "netclaim.dev/network": "lan1",
    }
    assert body["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    assert body["endpoints"] == [
        {
            "addresses": ["fd01::9"],
            "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": "node-1",
            "targetRef": {"kind": "Pod", "namespace": "team-a", "name": "p000", "uid": "p000-uid"},
        }
    ]
    assert body["ports"] == [{"name": "pg", "port": 5432, "protocol": "TCP"}]
    as_stored = copy.deepcopy(body)
    as_stored["metadata"]["labels"]["added-by-someone"] = "x"
    as_stored["endpoints"][0]["conditions"]["ready"] = False
    assert same_slice(HeldSlice.from_api(body), body)
    assert not same_slice(HeldSlice.from_api(as_stored), body)


def test_an_endpoint_keeps_its_slot_so_one_pod_coming_or_going_writes_one_slice() -> None:
    """Before, slices were cut from the pods sorted by name: a pod joining a Service of 500 endpoints
    moved every endpoint after it, and rewrote about half of its slices."""
    service = NetworkService.from_api(_service())

    def slices_of(names: list[str], bodies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        held = {name: HeldSlice.from_api(body) for name, body in bodies.items()}
        pods = [_pod(name) for name in names]
        claims = {  # each pod's address from its own name, whoever else comes
            f"{p.name}-net": _claim(
                p.name, _entry([f"10.1.{int(p.name[1:]) // 200}.{int(p.name[1:]) % 200 + 1}/16"])
            )
            for p in pods
        }
        found = endpoints(service, pods, claims, _published(claims))
        return desired_slices(service, found, SAMPLE_DRIVER, held)

    names = [f"p{i:03}" for i in range(0, 1000, 2)]  # 500 pods: five full slices
    before = slices_of(names, {})
    assert [len(b["endpoints"]) for b in before.values()] == [MAX_ENDPOINTS] * 5
    joined = slices_of(sorted([*names, "p001"]), before)  # sorts first among them
    changed = [
        name
        for name in joined
        if name not in before or not same_slice(HeldSlice.from_api(before[name]), joined[name])
    ]
    assert changed == ["db-netclaim-ipv4-5"] and len(joined["db-netclaim-ipv4-5"]["endpoints"]) == 1
    left = slices_of([n for n in sorted([*names, "p001"]) if n != "p500"], joined)  # p500: third slice
    changed = [
        name
        for name in joined
        if name not in left or not same_slice(HeldSlice.from_api(joined[name]), left[name])
    ]
    assert changed == ["db-netclaim-ipv4-2"]
    again = slices_of(sorted([*names, "p001", "p999"]), left)  # the hole is filled before a new slice
    assert len(again["db-netclaim-ipv4-2"]["endpoints"]) == MAX_ENDPOINTS and len(again) == 6
    forged = {**left, "db-netclaim-ipv4-9x": left["db-netclaim-ipv4"]}  # a slot no name of ours takes
    assert "db-netclaim-ipv4-9x" not in slices_of(names, forged)


@dataclass
class FakeServices:
    """The controller's NetworkServicesApi in memory, with the pods and claims its informers would keep."""

    services: list[dict[str, Any]] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # pod name → labels
    claims: list[Claim] = field(default_factory=list)
    slices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    fail_apply: dict[str, NetclaimError] = field(default_factory=dict)  # slice name → raised once

    def services_of(self, namespace: str) -> list[NetworkService]:
        return [
            NetworkService.from_api(copy.deepcopy(s))
            for s in self.services
            if s["metadata"]["namespace"] == namespace
        ]

    def slices_of(self, namespace: str) -> list[HeldSlice]:
        return [HeldSlice.from_api(body) for (ns, _), body in sorted(self.slices.items()) if ns == namespace]

    def served(self) -> set[str]:
        return {s["metadata"]["namespace"] for s in self.services} | {ns for ns, _ in self.slices}

    def pods_of(self, namespace: str) -> list[Pod]:
        return [replace(p, labels=self.labels.get(p.name, {})) for p in self.pods if p.namespace == namespace]

    async def all_claims(self) -> list[Claim]:
        return list(self.claims)

    async def apply_endpoint_slice(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if name in self.fail_apply:
            raise self.fail_apply.pop(name)
        self.writes.append(f"apply {name}")
        self.slices[(body["metadata"]["namespace"], name)] = copy.deepcopy(body)

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        self.writes.append(f"delete {name}")
        self.slices.pop((namespace, name), None)

    async def create_service_event(
        self, namespace: str, service: str, service_uid: str, reason: str, message: str
    ) -> None:
        self.events.append((service, message))


def _one_backend() -> FakeServices:
    """Service db over lan1 and its one backend, pod a at 10.1.0.1."""
    return FakeServices(
        services=[_service()],
        pods=[_pod("a")],
        labels={"a": {"app": "db"}},
        claims=[_claim("a", _entry(["10.1.0.1/24"]))],
    )


CLOCK = [0.0]  # the backoffs' clock: a test moves it past a backoff


def _reconciler(api: FakeServices) -> EndpointsReconciler:
    return EndpointsReconciler(
        api,
        api.pods_of,
        api.all_claims,
        SAMPLE_DRIVER,
        _publishing(api),
        api.services_of,
        api.slices_of,
        api.served,
        backoff=KeyBackoff(clock=lambda: CLOCK[0]),
    )


def _past_backoff(seconds: float = KeyBackoff.MOST) -> None:
    CLOCK[0] += seconds


async def _everywhere(reconciler: EndpointsReconciler) -> None:
    """A pass told that anything may have changed, in every namespace."""
    reconciler.touch()
    await reconciler.once()


def _addresses(api: FakeServices, name: str) -> list[tuple[str, bool]]:
    body = api.slices[("team-a", name)]
    return [(e["addresses"][0], e["conditions"]["ready"]) for e in body["endpoints"]]


async def test_a_pass_writes_what_changed_and_deletes_what_no_service_wants() -> None:
    api = FakeServices(
        services=[_service()],
        pods=[_pod("a"), _pod("b"), _pod("other")],
        labels={"a": {"app": "db"}, "b": {"app": "db"}, "other": {"app": "web"}},
        claims=[_claim(p, _entry([f"10.1.0.{i}/24"])) for i, p in enumerate(("a", "b", "other"), 1)],
    )
    api.slices[("team-a", "stale-netclaim-ipv4")] = {
        "metadata": {"namespace": "team-a", "name": "stale-netclaim-ipv4"}
    }
    reconciler = _reconciler(api)
    await _everywhere(reconciler)
    assert reconciler.namespaces == {"team-a"}
    assert _addresses(api, "db-netclaim-ipv4") == [("10.1.0.1", True), ("10.1.0.2", True)]
    assert sorted(api.writes) == ["apply db-netclaim-ipv4", "delete stale-netclaim-ipv4"]

    api.writes.clear()
    await _everywhere(reconciler)
    assert api.writes == []  # nothing changed, nothing written
    api.pods = [_pod("a"), _pod("b", ready=False)]
    await _everywhere(reconciler)
    assert _addresses(api, "db-netclaim-ipv4") == [("10.1.0.1", True), ("10.1.0.2", False)]
    api.pods = []
    await _everywhere(reconciler)
    assert api.slices == {}  # no endpoints: no slice


async def test_a_service_served_wrongly_loses_its_slices_and_is_told_once() -> None:
    api = _one_backend()
    reconciler = _reconciler(api)
    await _everywhere(reconciler)
    assert list(api.slices) == [("team-a", "db-netclaim-ipv4")]
    api.services = [_service(spec__selector={"app": "db"})]
    await _everywhere(reconciler)
    await _everywhere(reconciler)
    assert api.slices == {}
    assert len(api.events) == 1 and "spec.selector is set" in api.events[0][1]
    api.services = [_service(metadata__annotations={"netclaim.dev/selector": "app in (db"})]
    await _everywhere(reconciler)
    assert api.slices == {} and "annotation netclaim.dev/selector: selector 'app in (db'" in api.events[-1][1]


async def test_one_services_failed_write_stops_neither_the_others_nor_the_next_pass() -> None:
    other = _service(metadata__name="cache", metadata__uid="cache-uid")
    api = FakeServices(
        services=[_service(), other],
        pods=[_pod("a")],
        labels={"a": {"app": "db"}},
        claims=[_claim("a", _entry(["10.1.0.1/24"]))],
        fail_apply={"db-netclaim-ipv4": ApiRejectedError("admission said no")},
    )
    reconciler = _reconciler(api)
    await _everywhere(reconciler)
    assert list(api.slices) == [("team-a", "cache-netclaim-ipv4")]
    _past_backoff()
    await _everywhere(reconciler)
    assert sorted(api.slices) == [("team-a", "cache-netclaim-ipv4"), ("team-a", "db-netclaim-ipv4")]
    api.fail_apply["cache-netclaim-ipv4"] = ApiUnavailableError("503")
    api.pods = [_pod("a", ready=False)]
    with pytest.raises(ApiUnavailableError):  # an API that cannot serve ends the pass: retried
        await _everywhere(reconciler)


async def test_a_service_that_breaks_the_pass_keeps_its_slices_and_stops_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One bad object never stops the loop: a bug about one Service (its endpoints cannot be computed)
    leaves that Service's slices as they were, and the others are still made."""
    other = _service(metadata__name="cache", metadata__uid="cache-uid")
    api = FakeServices(
        services=[_service(), other],
        pods=[_pod("a")],
        labels={"a": {"app": "db"}},
        claims=[_claim("a", _entry(["10.1.0.1/24"]))],
    )
    reconciler = _reconciler(api)
    await _everywhere(reconciler)
    before = copy.deepcopy(api.slices[("team-a", "db-netclaim-ipv4")])
    real = services_module.endpoints

    def failing(service: NetworkService, *args: Any) -> Any:
        if service.name == "db":
            raise RuntimeError("a bug met by one Service only")
        return real(service, *args)

    monkeypatch.setattr(services_module, "endpoints", failing)
    api.pods = [_pod("a", ready=False)]
    await _everywhere(reconciler)
    assert api.slices[("team-a", "db-netclaim-ipv4")] == before  # kept, not deleted
    assert _addresses(api, "cache-netclaim-ipv4") == [("10.1.0.1", False)]  # the other one followed


async def test_an_address_another_namespace_reports_too_is_no_endpoint_and_the_service_is_told() -> None:
    """A tenant's own IPAM can name another tenant's address (a tenant range is every namespace's): the
    controller publishes it for neither, so no Service lists another tenant's pod."""
    thief = replace(_claim("x", _entry(["10.1.0.1/24"])), namespace="team-b")
    api = FakeServices(
        services=[_service()],
        pods=[_pod("a"), _pod("b")],
        labels={"a": {"app": "db"}, "b": {"app": "db"}},
        claims=[_claim("a", _entry(["10.1.0.1/24"])), _claim("b", _entry(["10.1.0.2/24"])), thief],
    )
    reconciler = _reconciler(api)
    await _everywhere(reconciler)
    assert _addresses(api, "db-netclaim-ipv4") == [("10.1.0.2", True)]
    [(service, message)] = api.events
    assert service == "db" and "10.1.0.1 (team-a/a-net, team-b/x-net)" in message


async def test_a_pass_makes_only_the_namespaces_it_was_told_of_and_a_resync_all() -> None:
    """Work per namespace touched: a pod's change in team-b makes team-b's slices again and reads
    nothing of team-a's Services; a failed write makes its namespace again once its backoff is over,
    alone, or at once when something changes in it."""
    api = FakeServices(
        services=[_service(), _service(metadata__namespace="team-b", metadata__uid="b-uid")],
        pods=[_pod("a"), replace(_pod("b"), namespace="team-b")],
        labels={"a": {"app": "db"}, "b": {"app": "db"}},
        claims=[
            _claim("a", _entry(["10.1.0.1/24"])),
            replace(_claim("b", _entry(["10.1.0.2/24"])), namespace="team-b"),
        ],
    )
    reconciler = _reconciler(api)
    await reconciler.once()  # a term's first pass: every namespace
    assert sorted(api.writes) == ["apply db-netclaim-ipv4"] * 2
    read: list[str] = []
    services_of = api.services_of

    def counted(namespace: str) -> list[NetworkService]:
        read.append(namespace)
        return services_of(namespace)

    reconciler.services = counted
    api.writes.clear()
    api.pods = [_pod("a", ready=False), replace(_pod("b", ready=False), namespace="team-b")]
    reconciler.touch("team-b")
    api.fail_apply["db-netclaim-ipv4"] = ApiRejectedError("refused once")
    await reconciler.once()
    assert read == ["team-b"] and api.writes == []  # its write failed
    await reconciler.once()  # told of nothing since, and its backoff (0.5 s) not over: not yet
    assert read == ["team-b"] and reconciler.touched == {"team-b"}
    _past_backoff(KeyBackoff.BASE)
    await reconciler.once()  # the failed namespace alone, again
    assert read == ["team-b", "team-b"] and api.writes == ["apply db-netclaim-ipv4"]
    assert [ready for _, ready in _addresses(api, "db-netclaim-ipv4")] == [True]  # team-a: not made
    reconciler.last_everywhere -= reconciler.everything_seconds  # a resync is due
    await reconciler.once()
    assert set(read[2:]) == {"team-a", "team-b"}
    assert [ready for _, ready in _addresses(api, "db-netclaim-ipv4")] == [False]


async def test_an_address_another_namespace_starts_or_stops_reporting_remakes_every_namespace() -> None:
    """Whether an address is published depends on other namespaces' claims: a namespace without any
    Service reporting team-a's address takes it out of team-a's slices at the next pass, however told."""
    api = _one_backend()
    reconciler = _reconciler(api)
    await reconciler.once()
    assert _addresses(api, "db-netclaim-ipv4") == [("10.1.0.1", True)]
    thief = replace(_claim("x", _entry(["10.1.0.1/24"])), namespace="team-b")
    api.claims.append(thief)
    await reconciler.once()  # told of no namespace: team-b has no Service
    assert ("team-a", "db-netclaim-ipv4") not in api.slices
    api.claims.remove(thief)
    await reconciler.once()
    assert _addresses(api, "db-netclaim-ipv4") == [("10.1.0.1", True)]


async def test_a_namespace_backing_off_is_made_at_once_when_something_in_it_changes() -> None:
    """client-go's Add: a new change is worked on whatever the key's backoff; only retries wait."""
    api = _one_backend()
    api.fail_apply["db-netclaim-ipv4"] = ApiRejectedError("refused")
    reconciler = _reconciler(api)
    await reconciler.once()
    assert api.writes == [] and reconciler.retries == {"team-a"}
    api.fail_apply.pop("db-netclaim-ipv4", None)  # (the fake refuses once)
    reconciler.touch("team-a")
    await reconciler.once()
    assert api.writes == ["apply db-netclaim-ipv4"] and len(reconciler.backoff) == 0
