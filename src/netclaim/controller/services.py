"""EndpointSlices of the Services over a netclaim network (docs/services.md), made by the controller from
the claims' status.

A Service over a network is headless (`clusterIP: None`), has no `spec.selector`, carries the label
`netclaim.dev/network: <network>` and chooses its pods with the annotation `netclaim.dev/selector` (a label
selector as kubectl takes it, read as the API server reads one: netclaim.core.policy.spec.parse_selector).
Without a selector the EndpointSlice controller leaves the Service to us (with one, it would add every
pod's primary address beside ours), and kube-proxy ignores headless Services; CoreDNS serves any slice
labelled with the Service's name.

Each selected pod is an endpoint with its address on that network: the `networkData` of our status entry whose
`data` names the network (the NIC's `netclaim.dev/network`, written by the agent), of a claim the pod is
using, when the controller may publish it (netclaim.core.ipam.published: a pool address only through the
claim's own IPAllocation, a tenant range's only if no other namespace reports it). `ready` follows the
entry's `Ready` condition and the pod's, as the EndpointSlice controller does for a pod's primary address; a
pod being deleted is `terminating`. Slices per address family of at most MAX_ENDPOINTS endpoints, owned by
the Service (deleting it deletes them), labelled managed-by `netclaim.dev`: the EndpointSlice controller
never touches them. As the EndpointSlice controller does, an endpoint keeps its slot: it stays in the slice
that holds it, a new one goes where there is room, so one pod coming or going writes one slice, however
many the Service has.

A Service gets no endpoints (its slices are deleted, a Warning Event says why) when it is not headless, has
a selector, or its annotation is missing or refused by the API server: a Service over a network never lists
a pod's primary address, nor a pod it did not select.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netclaim.core.events import EventReason
from netclaim.core.ipam.published import Contested, PublishedAddresses
from netclaim.core.kubeapi import NetworkServicesApi
from netclaim.core.names import DRIVER_DOMAIN, NETWORK, SLICE_MANAGED_BY, SLICE_SERVICE_NAME
from netclaim.core.objects import Claim, Pod
from netclaim.core.policy.spec import parse_selector
from netclaim.errors import NetclaimError, per_object
from netclaim.runtime import metrics
from netclaim.runtime.trigger import KeyBackoff

log = logging.getLogger(__name__)
SELECTOR = f"{DRIVER_DOMAIN}/selector"
HEADLESS = "service.kubernetes.io/headless"
OUR_LABELS = (SLICE_SERVICE_NAME, SLICE_MANAGED_BY, HEADLESS, NETWORK)  # what a slice of ours is labelled
MAX_ENDPOINTS = 100  # per slice, as the EndpointSlice controller's default
MAX_SLICES = 1_000  # per family of a Service: a slot numbered past it is never kept
FAMILIES = {4: "IPv4", 6: "IPv6"}


@dataclass(frozen=True)
class NetworkService:
    """A Service labelled with a netclaim network, as the controller reads it."""

    namespace: str
    name: str
    uid: str
    network: str
    selector: str  # the annotation: "" when missing
    ports: tuple[dict[str, Any], ...]  # the slices' ports
    publish_not_ready: bool
    refusal: str = ""  # why it gets no endpoints at all
    warning: str = ""  # what of it is left out (a port)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> NetworkService:
        """From the Service's JSON (typed by the API server)."""
        meta, spec = data.get("metadata") or {}, data.get("spec") or {}
        ports, port_problems = _slice_ports(spec.get("ports") or [])
        problems: list[str] = []
        selector = str((meta.get("annotations") or {}).get(SELECTOR) or "")
        if spec.get("selector"):
            problems.append(
                f"spec.selector is set, so Kubernetes lists its pods' primary addresses too: move it into "
                f"the annotation {SELECTOR} (as a label selector, like app=db)"
            )
        if spec.get("clusterIP") != "None":
            problems.append(
                "not headless: only `clusterIP: None` Services are served over a netclaim network (a "
                "cluster IP would be proxied over the primary network)"
            )
        if not selector:
            problems.append(f"annotation {SELECTOR} is missing: it says which pods serve it (like app=db)")
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            network=str((meta.get("labels") or {}).get(NETWORK) or ""),
            selector=selector,
            ports=tuple(ports),
            publish_not_ready=bool(spec.get("publishNotReadyAddresses")),
            refusal="; ".join(problems),
            warning="; ".join(port_problems),
        )


def _slice_ports(ports: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The Service's ports as a slice lists them: the target port, which a headless Service's clients
    reach directly. A named target port is left out (it names a container port of each pod)."""
    made, problems = [], []
    for index, port in enumerate(ports):
        target = port.get("targetPort", port.get("port"))
        if not isinstance(target, int):
            problems.append(f"spec.ports[{index}].targetPort {target!r}: only port numbers are served")
            continue
        entry: dict[str, Any] = {"port": target, "protocol": str(port.get("protocol") or "TCP")}
        for key in ("name", "appProtocol"):
            if port.get(key):
                entry[key] = port[key]
        made.append(entry)
    return made, problems


@dataclass(frozen=True)
class Endpoint:
    pod: Pod
    address: str
    ready: bool
    serving: bool


def endpoints(
    service: NetworkService, pods: Iterable[Pod], claims: dict[str, Claim], published: PublishedAddresses
) -> list[Endpoint]:
    """One endpoint per selected pod and address family: its first publishable address on the Service's
    network, from a claim the pod uses that is reserved for it (a claim a pod names but does not hold
    lends nothing)."""
    found = []
    for pod in pods:
        if not pod.node:
            continue
        seen: set[int] = set()
        for name in pod.claim_names():
            claim = claims.get(name)
            if claim is None or not any(ref.uid == pod.uid for ref in claim.reserved_for):
                continue
            for address in published.of(claim).get(service.network, ()):
                version = ipaddress.ip_address(address).version
                if version in seen:
                    continue
                seen.add(version)
                serving = pod.ready or service.publish_not_ready
                found.append(Endpoint(pod, address, ready=serving and not pod.deleting, serving=serving))
    return found


@dataclass(frozen=True)
class HeldSlice:
    """One of our EndpointSlices as the informer keeps it: where it is, which Service's, its family, its
    endpoints' slots in order, and a digest of every field we write (what `same_slice` compares)."""

    namespace: str
    name: str
    service: str
    address_type: str
    slotted: tuple[tuple[str, str], ...]  # (pod UID, address) of each endpoint, in its order
    fingerprint: str

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> HeldSlice:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        written = (
            sorted((k, labels[k]) for k in OUR_LABELS if k in labels),
            [(o.get("uid"), o.get("controller")) for o in meta.get("ownerReferences") or []],
            body.get("addressType"),
            _endpoints_key(body.get("endpoints") or []),
            sorted(map(_port_key, body.get("ports") or [])),
        )
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            service=str(labels.get(SLICE_SERVICE_NAME) or ""),
            address_type=str(body.get("addressType") or ""),
            slotted=tuple(_slotted(body)),
            fingerprint=hashlib.sha256(json.dumps(written, default=str).encode()).hexdigest(),
        )


def slice_name(service: str, version: int, index: int) -> str:
    return f"{service}-netclaim-ipv{version}" + (f"-{index}" if index else "")


def desired_slices(
    service: NetworkService,
    found: list[Endpoint],
    manager: str,
    current: Mapping[str, HeldSlice] | None = None,
) -> dict[str, dict[str, Any]]:
    """The Service's slices by name, per family: each endpoint in the slice of `current` (the Service's
    slices as the API has them, by name) that holds it already; the others, sorted by pod, where there is
    room, in the lowest-numbered slices first, then in new ones. A slice left empty is not wanted."""
    current = current or {}
    slices = {}
    for version, family in FAMILIES.items():
        wanted = {
            (e.pod.uid, e.address): e for e in found if ipaddress.ip_address(e.address).version == version
        }
        slots: dict[int, list[Endpoint]] = {}
        for index, held in sorted(_slots(current, service.name, version).items()):
            if held.address_type != family:
                continue
            kept = [wanted.pop(key) for key in held.slotted if key in wanted]
            slots[index] = kept[:MAX_ENDPOINTS]
            for extra in kept[MAX_ENDPOINTS:]:
                wanted[(extra.pod.uid, extra.address)] = extra
        newcomers = sorted(wanted.values(), key=lambda e: (e.pod.name, e.address))
        index = 0
        while newcomers:
            slot = slots.setdefault(index, [])
            room = MAX_ENDPOINTS - len(slot)
            slot += newcomers[:room]
            newcomers = newcomers[room:]
            index += 1
        for index, slot in sorted(slots.items()):
            if slot:
                name = slice_name(service.name, version, index)
                slices[name] = _slice_body(service, name, family, slot, manager)
    return slices


def _slots(current: Mapping[str, HeldSlice], service: str, version: int) -> dict[int, HeldSlice]:
    """The slices of `current` named as ours of that family are, by index (a name of another form, or a
    number past what any Service needs, is not a slot: not wanted, so deleted)."""
    first = slice_name(service, version, 0)
    found = {}
    for name, body in current.items():
        number = name.removeprefix(first + "-") if name != first else "0"
        if number.isdigit() and str(int(number)) == number and int(number) < MAX_SLICES:
            found[int(number)] = body
    return found


def _slotted(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(pod UID, address) of each endpoint a slice holds, in its order."""
    return [
        (str((e.get("targetRef") or {}).get("uid") or ""), str((e.get("addresses") or [""])[0]))
        for e in body.get("endpoints") or []
        if isinstance(e, dict)
    ]


def _slice_body(
    service: NetworkService, name: str, family: str, found: list[Endpoint], manager: str
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": service.namespace,
            "labels": {
                SLICE_SERVICE_NAME: service.name,
                SLICE_MANAGED_BY: manager,
                HEADLESS: "",
                NETWORK: service.network,
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service.name,
                    "uid": service.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": family,
        "endpoints": [
            {
                "addresses": [e.address],
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.pod.deleting},
                "nodeName": e.pod.node,
                "targetRef": {
                    "kind": "Pod",
                    "namespace": e.pod.namespace,
                    "name": e.pod.name,
                    "uid": e.pod.uid,
                },
            }
            for e in found
        ],
        "ports": list(service.ports),
    }


def same_slice(current: HeldSlice, wanted: dict[str, Any]) -> bool:
    """Whether the slice as the API has it already says what `wanted` says (the fields we write)."""
    return current.fingerprint == HeldSlice.from_api(wanted).fingerprint


def _endpoints_key(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Every endpoint's fields we write, comparable whatever a slice written by hand holds."""
    return sorted(
        (
            tuple(str(a) for a in e.get("addresses") or ()),
            tuple(sorted((str(k), str(v)) for k, v in (e.get("conditions") or {}).items())),
            str(e.get("nodeName") or ""),
            str((e.get("targetRef") or {}).get("uid") or ""),
        )
        for e in found
        if isinstance(e, dict)
    )


def _port_key(port: dict[str, Any]) -> tuple[Any, ...]:
    return (port.get("name") or "", port.get("port"), port.get("protocol") or "TCP", port.get("appProtocol"))


@dataclass
class EndpointsReconciler:
    """A pass makes the slices of the network Services of each namespace it was told of (a pod, claim,
    Service or slice of ours changed there; every namespace after an address was given or freed, an
    IPPool changed, or the addresses more than one namespace reports changed, and every 10 minutes) what
    its pods' claims say: work per namespace touched, not per Service of the cluster.
    One Service never fails a pass: what fails about it is logged (and, when it is the Service's to fix,
    an Event on it) and its namespace made again after a backoff of its own (KeyBackoff: 0.5 s doubling
    to 5 min, the other namespaces going on meanwhile), or at once when something in it changes; only an
    API that cannot serve ends a pass early (then every namespace is made again)."""

    api: NetworkServicesApi
    pods: Callable[[str], list[Pod]]  # a namespace's scheduled pods, as the informer keeps them
    claims: Callable[[], Awaitable[list[Claim]]]  # every claim, as the IPAM pass has seen them
    driver: str
    published: Callable[[], Awaitable[PublishedAddresses]]  # what may be published, as of now
    services: Callable[[str], list[NetworkService]]  # a namespace's network Services, the informer's
    slices: Callable[[str], list[HeldSlice]]  # a namespace's slices of ours, the informer's
    served: Callable[[], set[str]]  # the namespaces with network Services or slices of ours
    # everything made and compared this often: a safety net, since the informers tell every change
    everything_seconds: float = 600.0
    # Service UID → the problem last reported (forgotten at a resync once the Service is gone)
    warned: dict[str, str] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)  # namespaces to make again
    backoff: KeyBackoff = field(default_factory=KeyBackoff)  # namespaces whose slices failed
    retries: set[str] = field(default_factory=set)  # touched only because their last attempt failed
    everywhere: bool = True  # every served namespace to make again
    last_everywhere: float = -math.inf
    contested: tuple[Contested, ...] = ()  # the addresses more than one namespace reported, at the last

    @property
    def namespaces(self) -> set[str]:
        """The namespaces with network Services or slices of ours: where a change concerns this pass."""
        return self.served()

    def touch(self, namespace: str | None = None) -> None:
        """Make the namespace's slices again at the next pass, even while it backs off from a failure
        (every namespace's: None, but those backing off once due)."""
        if namespace is None:
            self.everywhere = True
        else:
            self.touched.add(namespace)
            self.retries.discard(namespace)

    async def reconcile(self) -> None:
        await metrics.counted_pass(metrics.ENDPOINT_PASSES, self.once)

    async def once(self) -> None:
        served = self.served()
        if not served:
            return
        published = await self.published()
        started = time.monotonic()
        everywhere = (
            self.everywhere
            or started - self.last_everywhere >= self.everything_seconds
            # an address two namespaces report, or no longer do: whichever namespace's Services list it
            or published.contested != self.contested
        )
        chosen = served if everywhere else self.touched & served
        # a namespace to make only because it failed waits for its backoff; one changed since, not
        waiting = {namespace for namespace in chosen & self.retries if not self.backoff.due(namespace)}
        namespaces = chosen - waiting
        self.touched, self.retries, self.everywhere = set(waiting), set(waiting), False
        try:
            await self._make(sorted(namespaces), published)
            if everywhere:
                self.backoff.keep_only(served)
                alive = {s.uid for namespace in served for s in self.services(namespace)}
                self.warned = {uid: problem for uid, problem in self.warned.items() if uid in alive}
                self.last_everywhere, self.contested = started, published.contested
        except BaseException:
            self.touched |= namespaces  # the API failed: made again, whatever this pass had done
            self.everywhere = self.everywhere or everywhere
            raise

    async def _make(self, namespaces: list[str], published: PublishedAddresses) -> None:
        if not namespaces:
            return
        claims: dict[str, dict[str, Claim]] = {namespace: {} for namespace in namespaces}
        for claim in await self.claims():
            if claim.namespace in claims:
                claims[claim.namespace][claim.name] = claim
        for namespace in namespaces:
            if await self._make_namespace(namespace, claims, published):
                self.backoff.succeeded(namespace)
            else:
                self.touched.add(namespace)
                self.retries.add(namespace)
                self.backoff.failed(namespace)

    async def _make_namespace(
        self, namespace: str, claims: dict[str, dict[str, Claim]], published: PublishedAddresses
    ) -> bool:
        """Whether every slice of the namespace is as wanted (else it is made again after its backoff)."""
        made = True
        current = {held.name: held for held in self.slices(namespace)}
        wanted: dict[str, dict[str, Any]] = {}
        kept: set[str] = set()
        for service in self.services(namespace):
            held = {name: s for name, s in current.items() if s.service == service.name}
            try:
                wanted |= await self._slices_of(service, claims, published, held)
            except Exception as err:  # this Service's, whatever it is (a bug): it keeps its slices, the
                # next Service goes on, and its namespace is made again after its backoff; an API that
                # is down fails the writes that follow, which end the pass
                log.warning(
                    "Service's endpoints not computed; the next pass tries again",
                    extra={"service": f"{namespace}/{service.name}", "error": repr(err)},
                    exc_info=not isinstance(err, NetclaimError),
                )
                kept |= set(held)
                made = False
        for name, body in wanted.items():
            if name not in current or not same_slice(current[name], body):
                write = self.api.apply_endpoint_slice(body)
                made = await per_object(f"EndpointSlice {namespace}/{name}", write) and made
        for name in sorted(set(current) - set(wanted) - kept):
            delete = self.api.delete_endpoint_slice(namespace, name)
            made = await per_object(f"EndpointSlice {namespace}/{name}", delete) and made
        return made

    async def _slices_of(
        self,
        service: NetworkService,
        claims: dict[str, dict[str, Claim]],
        published: PublishedAddresses,
        held: Mapping[str, HeldSlice],
    ) -> dict[str, dict[str, Any]]:
        problem = service.refusal
        pods: list[Pod] = []
        if not problem:
            try:
                selects = parse_selector(service.selector)
            except ValueError as err:
                problem = f"annotation {SELECTOR}: {err}"
            else:
                pods = [pod for pod in self.pods(service.namespace) if selects.matches(pod.labels)]
        contested = (
            _contested(service, pods, claims.get(service.namespace, {}), published) if not problem else ""
        )
        told = "; ".join(p for p in (problem, service.warning, contested) if p)
        if told:
            await self._warn(service, told)
        if problem:
            return {}
        found = endpoints(service, pods, claims[service.namespace], published)
        return desired_slices(service, found, self.driver, held)

    async def _warn(self, service: NetworkService, problem: str) -> None:
        if self.warned.get(service.uid) == problem:
            return
        self.warned[service.uid] = problem
        log.warning(
            "Service over a netclaim network not served as asked",
            extra={"service": f"{service.namespace}/{service.name}", "problem": problem},
        )
        event = self.api.create_service_event(
            service.namespace, service.name, service.uid, EventReason.SERVICE_INVALID, problem
        )
        await per_object(f"event on Service {service.namespace}/{service.name}", event)


def _contested(
    service: NetworkService, pods: list[Pod], claims: dict[str, Claim], published: PublishedAddresses
) -> str:
    """What the Service's own pods report on its network that other namespaces' claims report too."""
    used = {f"{service.namespace}/{c}" for pod in pods for c in pod.claim_names() if c in claims}
    both = [c for c in published.contested if c.network == service.network and used & set(c.claims)]
    if not both:
        return ""
    shown = ", ".join(f"{c.address} ({', '.join(c.claims)})" for c in both[:5])
    return (
        f"addresses on network {service.network} that claims of other namespaces report too are published "
        f"for none of them: {shown}"
    )
