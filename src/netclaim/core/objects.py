"""The Kubernetes objects as netclaim reads them: frozen dataclasses built from the API's JSON, no I/O.

The adapter (netclaim.adapters.kube) fetches the JSON and hands out these types; the planner, IPAM, the
status writer, the controller and the tools read them without knowing how they were fetched, and none of
them walks a pod's JSON by hand: Pod is the one reading of it. The kinds that carry free JSON anyone may
write (ResourceClaims: opaque configs and device status of every driver; IPPools; IPAllocations) are read
without recursion (read_json), whatever their depth, and a list's items each on its own when one of them
needs the slow parser (read_list); a free value nested deeper than netclaim reads (MAX_DEPTH) is left
out before anything recursive touches it, and the object says so (Claim.problems).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import ijson.backends.python  # type: ignore[import-untyped]  # no type information shipped

from netclaim.core.config.strict import MAX_DEPTH, too_deep
from netclaim.core.names import DRIVER_DOMAIN, NETWORK, POD_CLAIM_NAME, is_dns_label

CONDITION_MESSAGE_BYTES = 32768  # metav1.Condition.message
IPPOOL_API_VERSION = f"{DRIVER_DOMAIN}/v1alpha1"  # IPPools' and IPAllocations'
POOL_LABEL = f"{DRIVER_DOMAIN}/pool"
CLAIM_UID_LABEL = f"{DRIVER_DOMAIN}/claim-uid"
# On an IPAllocation the controller is freeing: when it found the address released (RFC 3339). The address is
# quarantined until every rule and Service that named it has followed (netclaim.core.ipam.pools).
RELEASED_AT = f"{DRIVER_DOMAIN}/released-at"
# the ConfigMaps that are parameters of admission policy netclaim-pool-namespaces (deploy/admission.yaml)
PARAMS_LABEL = f"{DRIVER_DOMAIN}/admission-params"
POOL_NAMESPACES = "pool-namespaces"
# What yajl's C parser raises: JSONError for what is not JSON (an integer past int64 included, which JSON
# allows), UnicodeDecodeError (a ValueError) for a surrogate escaped out of its pair, which JSON allows too.
_C_PARSER_FAILURES = (ijson.JSONError, ValueError)
# What the standard library's parser raises for what it leaves to ijson's: a document nested deeper than the
# interpreter's recursion limit, one that is not JSON (or an integer of more digits than Python makes an int
# of: ValueError), the constants JSON does not have (NaN, Infinity: refused by _not_json).
_STDLIB_FAILURES = (RecursionError, ValueError)


def read_json(data: bytes | str) -> Any:
    """A JSON document, whatever its depth: read by the standard library's parser (_stdlib), and what that
    leaves (nested past the recursion limit) built without recursion, ijson's events into its
    ObjectBuilder: no depth the API server stores can break reading it. Check how deep a part is
    (too_deep, iterative) before anything recursive touches it. ValueError when `data` is not JSON.

    ijson's events come from yajl's C parser, making its numbers itself (use_float): what it cannot read
    (an integer past int64, a surrogate escaped out of its pair) is read again by ijson's pure-Python
    parser, several times slower. Not by the C parser with numbers handed over as text, which reads any
    integer: given one of more digits than Python makes an int of (sys.get_int_max_str_digits()), ijson
    3.6 raises SystemError and corrupts memory, and the process crashes soon after (a segmentation
    fault)."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return _stdlib(raw)
    except _STDLIB_FAILURES:
        pass
    try:
        return _built(ijson.basic_parse(raw, use_float=True))
    except _C_PARSER_FAILURES:
        pass
    try:
        return _built(ijson.backends.python.basic_parse(raw, use_float=True))
    except (ijson.JSONError, ValueError) as err:
        raise ValueError(f"not JSON: {str(err).splitlines()[0]}") from None


def resource_version_of(data: bytes) -> str | None:
    """The object's metadata.resourceVersion, read from the start of the document only (the API writes
    metadata first): nothing after it is parsed, however deep. None when it is not there or not text."""
    try:
        found = next(ijson.items(data, "metadata.resourceVersion"), None)
    except _C_PARSER_FAILURES:
        return None
    return found if isinstance(found, str) else None


def _stdlib(raw: bytes) -> Any:
    """The standard library's C parser first: it builds the document 4 times faster than ijson's events are
    built in Python (a ResourceClaim of 7.6 kB: 0.09 ms against 0.40; the controller reads every claim's
    every change). It recurses, so what is nested past the recursion limit is left to ijson's parsers; so
    is everything else it refuses, and what it accepts that is not JSON."""
    return json.loads(raw, parse_constant=_not_json)


def _not_json(constant: str) -> Any:
    raise ValueError(f"not JSON: {constant}")


def _built(events: Iterator[tuple[str, Any]]) -> Any:
    builder = ijson.ObjectBuilder()
    for event, value in events:
        builder.event(event, value)
    return builder.value


@dataclass(frozen=True)
class ListItems:
    """The items of an API list, each as the API has it."""

    items: list[Any]
    unread: list[str]  # why each item no parser here reads was not read (it is not in `items`)
    version: str | None = None  # the list's resourceVersion: a watch from it misses no change after it
    following: str = ""  # of one page of a list: the continue token of the next page, "" for the last


def read_list(data: bytes) -> ListItems:
    """The items of an API list (`{"items": [...]}`), read as read_json reads a document. A C parser
    reads the list whole; when neither can (read_json), the items are found (item_spans) and each is read on
    its own, so that the pure-Python parser reads only the item that needs it (one tenant's integer past
    int64 costs that claim, not the cluster's list), and an item neither reads fails no other. ValueError
    when `data` is not JSON, or not a list of items."""
    try:
        document = _stdlib(data)
    except _STDLIB_FAILURES:
        try:
            document = _built(ijson.basic_parse(data, use_float=True))
        except _C_PARSER_FAILURES as err:
            try:
                spans = item_spans(data)
            except ValueError:
                raise ValueError(f"not JSON: {str(err).splitlines()[0]}") from None
            meta = _metadata_before_items(data)
            version, following = meta.get("resourceVersion"), meta.get("continue")
            found = ListItems(
                [],
                [],
                version if isinstance(version, str) else None,
                following if isinstance(following, str) else "",
            )
            for start, end in spans:
                try:
                    found.items.append(read_json(data[start:end]))
                except ValueError as problem:
                    found.unread.append(str(problem))
            return found
    items = document.get("items") if isinstance(document, dict) else ()
    if isinstance(items, list | None):
        meta = document.get("metadata") or {}
        version, following = meta.get("resourceVersion"), meta.get("continue")
        return ListItems(
            items or [],
            [],
            version if isinstance(version, str) else None,
            following if isinstance(following, str) else "",
        )
    raise ValueError("not a list of items")  # the API server's answer: a ValueError as any it cannot read


def _metadata_before_items(data: bytes) -> dict[str, Any]:
    """A list's metadata as the API server writes it, before its items ({} when it cannot be read there):
    for a list only the item-by-item reading reads, its version and continue token."""
    at = data.find(b'"items"')
    if at < 0:
        return {}
    try:
        head = _stdlib(data[:at].rstrip().rstrip(b",") + b"}")
    except _STDLIB_FAILURES:
        return {}
    meta = head.get("metadata") if isinstance(head, dict) else None
    return meta if isinstance(meta, dict) else {}


# A JSON string (escapes included: a quote after an odd number of backslashes is text), else one of the
# characters that shape a value; a quote that begins no string is a string cut off.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|["\[\]{}]', re.DOTALL)
_QUOTE, _OPEN_ARRAY, _OPENING = ord('"'), ord("["), b"[{"


def item_spans(data: bytes) -> list[tuple[int, int]]:
    """Where each item of an API list lies in `data` (start, end): the values of the top-level object's
    "items" array (its last, as a parser reads duplicate keys) that are objects, arrays or strings, found
    from strings and brackets alone; nothing in between is read. ValueError when `data` is not an object
    that ends where it should (cut off, or more after it) or holds no "items" array: a list cut short
    must not read as a shorter list."""
    if not data.lstrip().startswith(b"{"):
        raise ValueError("not a JSON object")
    spans: list[tuple[int, int]] = []
    depth, key, start, within, found, end = 0, b"", 0, False, False, -1
    for match in _TOKEN.finditer(data):
        first = data[match.start()]
        if first == _QUOTE:
            if match.end() - match.start() == 1:
                raise ValueError("a string that does not end")
            if depth == 1:  # a key or a value of the top-level object: the last before an array is its key
                key = match.group()
            elif within and depth == 2:
                spans.append(match.span())
            continue
        if first in _OPENING:
            if within and depth == 2:
                start = match.start()
            elif depth == 1 and first == _OPEN_ARRAY and key == b'"items"':
                spans, within, found = [], True, True
            depth += 1
            continue
        depth -= 1
        if within and depth == 2:
            spans.append((start, match.end()))
        elif within and depth == 1:
            within = False
        elif depth == 0:
            end = match.end()
            break
    if end < 0 or data[end:].strip():
        raise ValueError("not one JSON object")
    if not found:
        raise ValueError("no list of items")
    return spans


def as_object(value: Any) -> dict[str, Any]:
    """A JSON object read from the API ({} for a missing one); TypeError for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"an object was expected, not {type(value).__name__}")
    return value


def as_text(value: Any) -> str:
    """A JSON string read from the API; TypeError for anything else (never str() of what a tenant wrote)."""
    if not isinstance(value, str):
        raise TypeError(f"a string was expected, not {type(value).__name__}")
    return value


def cut(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, as the API counts (a character cut in two is dropped)."""
    return text.encode()[:limit].decode(errors="ignore")


def condition(
    status: str, reason: str, message: str, since: str | None = None, kind: str = "Ready"
) -> dict[str, str]:
    """A condition (of type `kind`) as the API takes it, the message cut to its limit (claims' and
    IPPools'); `since` is its lastTransitionTime (a claim's conditions need one)."""
    found = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": cut(message, CONDITION_MESSAGE_BYTES),
    }
    return {**found, "lastTransitionTime": since} if since is not None else found


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One entry of a claim's `status.allocation.devices.results`."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str
    consumed_capacity: dict[str, str]
    # the device's binding conditions the scheduler copied into the result (KEP-5007): it binds the pod only
    # once the claim's status says each is True (netclaim.core.ipam.reservation)
    binding_conditions: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceConfig:
    """One entry of `status.allocation.devices.config` with an opaque config."""

    source: str  # FromClass (the admin's DeviceClass) or FromClaim (the user's claim)
    requests: tuple[str, ...]
    driver: str
    parameters: object  # None when unreadable
    unreadable: str = ""  # why `parameters` were not read: nested deeper than MAX_DEPTH

    @classmethod
    def from_api(cls, index: int, entry: dict[str, Any]) -> DeviceConfig:
        opaque = as_object(entry.get("opaque"))
        parameters, unreadable = opaque.get("parameters"), ""
        if too_deep(parameters) is not None:
            location = f"status.allocation.devices.config[{index}].opaque.parameters"
            parameters, unreadable = None, f"{location}: nested deeper than {MAX_DEPTH} levels"
        return cls(
            source=as_text(entry.get("source", "")),
            requests=tuple(as_text(r) for r in entry.get("requests") or ()),
            driver=as_text(opaque.get("driver", "")),
            parameters=parameters,
            unreadable=unreadable,
        )


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """A pod a claim is reserved for (status.reservedFor: the API's ResourceClaimConsumerReference)."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request (or subrequest) of a claim's spec: its DeviceClass and CEL selectors."""

    name: str
    device_class: str
    selectors: tuple[str, ...]


def _request_specs(spec: dict[str, Any]) -> tuple[RequestSpec, ...]:
    found = []
    for request in as_object(spec.get("devices")).get("requests") or []:
        name = as_text(request.get("name", ""))
        options = [(name, as_object(request["exactly"]))] if request.get("exactly") else []
        options += [
            (f"{name}/{as_text(sub.get('name', ''))}", as_object(sub))
            for sub in request.get("firstAvailable") or []
        ]
        for full_name, option in options:
            selectors = tuple(
                as_text(as_object(s.get("cel")).get("expression", "")) for s in option.get("selectors") or []
            )
            found.append(RequestSpec(full_name, as_text(option.get("deviceClassName", "")), selectors))
    return tuple(found)


def _claim_parts(data: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of a Claim past its identity, as the API has them; TypeError, KeyError or AttributeError
    for a part of another shape. An opaque config nested too deep is kept out of reach (DeviceConfig)."""
    status = as_object(data.get("status"))
    allocation = as_object(status.get("allocation")).get("devices")
    allocated = as_object(allocation)
    return {
        "allocated": allocation is not None,
        "results": tuple(
            AllocatedDevice(
                request=as_text(r["request"]),
                driver=as_text(r["driver"]),
                pool=as_text(r["pool"]),
                device=as_text(r["device"]),
                share_id=as_text(r.get("shareID") or ""),
                consumed_capacity={
                    as_text(k): as_text(v) for k, v in as_object(r.get("consumedCapacity")).items()
                },
                binding_conditions=tuple(as_text(c) for c in r.get("bindingConditions") or ()),
            )
            for r in allocated.get("results") or []
        ),
        "node": _selected_node(as_object(status.get("allocation")).get("nodeSelector")),
        "configs": tuple(
            DeviceConfig.from_api(index, c)
            for index, c in enumerate(allocated.get("config") or [])
            if c.get("opaque") is not None
        ),
        "reserved_for": tuple(
            ConsumerRef(as_text(r["name"]), as_text(r["uid"]))
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods"
        ),
        "devices_status": tuple(as_object(d) for d in status.get("devices") or ()),
        "owned_by_pod": any(
            o.get("kind") == "Pod" and o.get("controller") for o in meta.get("ownerReferences") or []
        ),
        "requests": _request_specs(as_object(data.get("spec"))),
        "pod_claim_name": _pod_claim_name(as_object(meta.get("annotations")).get(POD_CLAIM_NAME)),
    }


def _selected_node(selector: Any) -> str:
    """The node an allocation's nodeSelector names by `metadata.name` (a node's NIC in the claim), or ""."""
    for term in as_object(selector).get("nodeSelectorTerms") or ():
        for match in as_object(term).get("matchFields") or ():
            values: list[Any] = as_object(match).get("values") or []
            if match.get("key") == "metadata.name" and match.get("operator") == "In" and len(values) == 1:
                return as_text(values[0])
    return ""


def _pod_claim_name(value: Any) -> str:
    """The pod's name for a claim made from its template: a DNS label (pod.spec.resourceClaims[].name). Anyone
    who can write the claim can write the annotation: a value that is not one (`../..`, a NUL) is no name,
    never a part of a path inside the container."""
    return value if isinstance(value, str) and is_dns_label(value) else ""


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim as netclaim reads it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    allocated: bool
    results: tuple[AllocatedDevice, ...]
    configs: tuple[DeviceConfig, ...]
    reserved_for: tuple[ConsumerRef, ...]  # pods only
    # status.devices, every driver's, as the API has them: of other drivers' entries only `driver` is read
    devices_status: tuple[dict[str, Any], ...]
    owned_by_pod: bool = False  # generated from a ResourceClaimTemplate: it lives as long as its pod
    requests: tuple[RequestSpec, ...] = ()
    pod_claim_name: str = ""  # the pod's name for a claim made from its template (resourceClaims[].name)
    node: str = ""  # the node its allocation is bound to, when its nodeSelector names one
    unreadable: str = ""  # why the claim could be read only in part: then it has its identity only
    # a compact claim's addresses (network → addresses) as network_addresses(addresses_of) read them
    addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()
    addresses_of: str = ""  # the driver they are of: "" for a claim not compacted

    @classmethod
    def from_api(cls, data: Any) -> Claim:
        """The claim; ValueError when not even its identity (metadata) can be read."""
        try:
            meta = as_object(as_object(data).get("metadata"))
            namespace, name, uid, version = (
                as_text(meta.get(key, "")) for key in ("namespace", "name", "uid", "resourceVersion")
            )
        except TypeError as err:
            raise ValueError(f"metadata: {err}") from None
        claim = cls(namespace, name, uid, version, False, (), (), (), ())
        try:
            return replace(claim, **_claim_parts(data, meta))
        except (KeyError, TypeError, AttributeError) as err:
            return replace(claim, unreadable=f"cannot be read ({type(err).__name__}: {err})")

    def compact(self, driver: str) -> Claim:
        """What the controller keeps of the claim in memory (1.0 KiB a claim as tracemalloc counts it, from
        1.8 KiB before its addresses were read once and the names below interned; 421 MiB at 50,000 whole
        claims):
        its identity, allocation, requests and consumers, and of its status only its addresses on each
        network as network_addresses(driver) reads them, read once; no config (a tenant's CNI configs are
        most of a claim's size)."""
        addresses = tuple(
            (sys.intern(network), held) for network, held in self.network_addresses(driver).items()
        )
        # the names every claim repeats (driver, node pools, devices, requests, classes) held once: what a
        # watch decodes is a new string for each, about a third of a compact claim's size
        results = tuple(
            replace(
                r,
                request=sys.intern(r.request),
                driver=sys.intern(r.driver),
                pool=sys.intern(r.pool),
                device=sys.intern(r.device),
            )
            for r in self.results
        )
        requests = tuple(
            replace(r, name=sys.intern(r.name), device_class=sys.intern(r.device_class))
            for r in self.requests
        )
        return replace(
            self,
            namespace=sys.intern(self.namespace),
            configs=(),
            devices_status=self._binding_status(driver),
            results=results,
            requests=requests,
            addresses=addresses,
            addresses_of=sys.intern(driver),
        )

    def _binding_status(self, driver: str) -> tuple[dict[str, Any], ...]:
        """Of `driver`'s status entries, those of devices allocated with binding conditions, as far as the
        scheduler reads them: which device, and its conditions' types and statuses."""
        waited = {(r.pool, r.device, r.share_id) for r in self.results if r.binding_conditions}
        kept: list[dict[str, Any]] = []
        for entry in self.devices_status:
            key = (entry.get("pool"), entry.get("device"), entry.get("shareID") or "")
            if entry.get("driver") == driver and key in waited:
                conditions = [
                    {"type": c.get("type"), "status": c.get("status")}
                    for c in entry.get("conditions") or ()
                    if isinstance(c, dict)
                ]
                identity: dict[str, Any] = {
                    k: entry[k] for k in ("driver", "pool", "device", "shareID") if k in entry
                }
                kept.append({**identity, "conditions": conditions})
        return tuple(kept)

    def problems(self) -> list[str]:
        """What of the claim could not be read."""
        return [p for p in (self.unreadable, *(c.unreadable for c in self.configs)) if p]

    def network_addresses(self, driver: str) -> dict[str, tuple[str, ...]]:
        """Network → the addresses the claim's interfaces have on it, as `driver`'s status entries say
        (attached and Ready, the network named in `data`), in the order of their interfaces' names; never a
        link-local or loopback address. What Services and policies on a network resolve pods to."""
        if self.addresses_of:
            return dict(self.addresses) if driver == self.addresses_of else {}
        found: dict[str, list[tuple[str, str]]] = {}
        for entry in self.devices_status:
            data, shown = entry.get("data"), entry.get("networkData")
            if entry.get("driver") != driver or not isinstance(data, dict) or not isinstance(shown, dict):
                continue
            network = data.get(NETWORK)
            if not isinstance(network, str) or not _ready(entry.get("conditions")):
                continue
            for text in shown.get("ips") or []:
                address = _interface_address(str(text))
                if address:
                    found.setdefault(network, []).append((str(shown.get("interfaceName") or ""), address))
        return {net: tuple(a for _, a in sorted(pairs, key=lambda p: p[0])) for net, pairs in found.items()}


@functools.lru_cache(maxsize=1 << 17)
def _interface_address(text: str) -> str:
    """The address of an interface's `address/prefix` as text; "" for none, a link-local or a loopback one.
    Kept for the addresses seen last: the controller's passes read every claim's each time (10,000 claims:
    0.8 s a pass parsing them afresh)."""
    try:
        address = ipaddress.ip_interface(text).ip
    except ValueError:
        return ""
    return "" if address.is_link_local or address.is_loopback else str(address)


def _ready(conditions: Any) -> bool:
    return isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


@dataclass(frozen=True)
class Slice:
    """A ResourceSlice of a pool, as netclaim compares it."""

    name: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[dict[str, Any], ...]
    owner_uids: tuple[str, ...] = ()
    driver: str = ""
    node: str = ""  # spec.nodeName: its devices are that node's ("" with a selector, all nodes or per device)
    node_selector: dict[str, Any] | None = None  # spec.nodeSelector
    per_device_node_selection: bool = False  # each device says where it is, as the slice would

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Slice:
        spec, meta = as_object(data.get("spec")), as_object(data.get("metadata"))
        pool = as_object(spec.get("pool"))
        return cls(
            name=str(meta.get("name", "")),
            pool=str(pool.get("name", "")),
            generation=int(pool.get("generation") or 0),
            slice_count=int(pool.get("resourceSliceCount") or 1),
            devices=tuple(spec.get("devices") or ()),
            owner_uids=tuple(str(o["uid"]) for o in meta.get("ownerReferences") or ()),
            driver=str(spec.get("driver", "")),
            node=str(spec.get("nodeName") or ""),
            node_selector=as_object(spec.get("nodeSelector")) or None,
            per_device_node_selection=spec.get("perDeviceNodeSelection") is True,
        )


@dataclass(frozen=True)
class IPAllocation:
    """An IPAllocation object: one address of a pool, held by one claim (the object's name is the lock)."""

    name: str
    uid: str
    pool: str
    address: str  # with the prefix length of its range, e.g. 10.10.3.7/24
    claim_namespace: str
    claim_name: str
    claim_uid: str
    node: str
    released_at: str = ""  # annotation RELEASED_AT: the controller quarantines it (netclaim.core.ipam.pools)

    @functools.cached_property
    def interface(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        """The address parsed once: a pass over 5,000 of them parsed each three times, most of its CPU."""
        return ipaddress.ip_interface(self.address)

    @classmethod
    def from_api(cls, data: Any) -> IPAllocation:
        """The allocation; ValueError (TypeError) when a field is not what the kind says."""
        meta, spec = as_object(as_object(data).get("metadata")), as_object(data.get("spec"))
        claim = as_object(spec.get("claim"))
        address = as_text(spec.get("address", ""))
        if "/" not in address:
            raise ValueError(f"spec.address: {address!r} is not an address with its prefix length")
        ipaddress.ip_interface(address)  # ValueError: not an address
        return cls(
            name=as_text(meta.get("name", "")),
            uid=as_text(meta.get("uid", "")),
            pool=as_text(spec.get("pool", "")),
            address=address,
            claim_namespace=as_text(claim.get("namespace", "")),
            claim_name=as_text(claim.get("name", "")),
            claim_uid=as_text(claim.get("uid", "")),
            node=as_text(spec.get("node", "")),
            released_at=as_text(as_object(meta.get("annotations")).get(RELEASED_AT, "")),
        )

    def to_api(self) -> dict[str, Any]:
        return {
            "apiVersion": IPPOOL_API_VERSION,
            "kind": "IPAllocation",
            "metadata": {
                "name": self.name,
                "labels": {POOL_LABEL: self.pool, CLAIM_UID_LABEL: self.claim_uid},
            },
            "spec": {
                "pool": self.pool,
                "address": self.address,
                "claim": {"namespace": self.claim_namespace, "name": self.claim_name, "uid": self.claim_uid},
                "node": self.node,
            },
        }


def ippool_problem(data: Any) -> str:
    """Why an IPPool as the API has it cannot be read ("" when it can: its spec is then IPPool's to judge)."""
    meta = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return "it has no name"
    if too_deep(data) is not None:
        return f"nested deeper than {MAX_DEPTH} levels"
    return ""


@dataclass(frozen=True)
class NamespaceLabels:
    """A namespace as a policy's namespaceSelector reads it."""

    name: str
    labels: Mapping[str, str]

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> NamespaceLabels:
        meta = as_object(data.get("metadata"))
        labels = as_object(meta.get("labels"))
        return cls(str(meta.get("name") or ""), {str(k): str(v) for k, v in labels.items()})


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One of the pod's claims (an entry of spec.resourceClaims)."""

    name: str  # the pod's name for it
    # the ResourceClaim: resourceClaimName, or the one made from the template (status.resourceClaimStatuses);
    # "" while it is not made yet
    claim: str
    template: str = ""  # resourceClaimTemplateName


EXTENDED_RESOURCES = "extended-resources"  # the pod's name for the claim the scheduler made for them


def _extended_claim(status: dict[str, Any]) -> tuple[PodClaim, ...]:
    """The claim the scheduler made for the pod's extended resources backed by DRA (KEP-5004), listed
    like the others: Services, policies and the network-status annotation count its interfaces too."""
    made = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return (PodClaim(EXTENDED_RESOURCES, str(made)),) if made else ()


@dataclass(frozen=True, slots=True)
class PodCondition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Pod:
    """A Pod as netclaim reads it: who and where it is, its claims, and what keeps it off a node."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    node: str = ""  # spec.nodeName: "" until it is scheduled
    phase: str = ""  # status.phase
    claims: tuple[PodClaim, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    conditions: tuple[PodCondition, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    required_affinity: dict[str, Any] | None = None  # a NodeSelector: nodeAffinity's required terms
    deleting: bool = False  # metadata.deletionTimestamp is set: it is terminating
    labels: dict[str, str] = field(default_factory=dict)
    named_ports: dict[str, tuple[str, int]] = field(
        default_factory=dict
    )  # container port → (protocol, number)

    def compact(self) -> Pod:
        """What the controller keeps of a pod in memory: who and where it is, its claims, labels, named
        ports and readiness; not what only scheduling reads."""
        ready = tuple(
            PodCondition(sys.intern(c.type), sys.intern(c.status), sys.intern(c.reason), c.message)
            for c in self.conditions
            if c.type == "Ready"
        )
        # the strings most pods repeat (namespace, node, phase, label keys and values, claim names in the
        # pod) held once: a watch decodes a new one for each, half a compact pod
        return replace(
            self,
            namespace=sys.intern(self.namespace),
            node=sys.intern(self.node),
            phase=sys.intern(self.phase),
            claims=tuple(replace(c, name=sys.intern(c.name)) for c in self.claims),
            labels={sys.intern(k): sys.intern(v) for k, v in self.labels.items()},
            annotations={},
            conditions=ready,
            node_selector={},
            tolerations=(),
            required_affinity=None,
        )

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Pod:
        """The pod from its JSON, as the API serves it (typed by the API server: no shape to doubt)."""
        meta, spec, status = (data.get(key) or {} for key in ("metadata", "spec", "status"))
        made = {
            str(entry["name"]): str(entry["resourceClaimName"])
            for entry in status.get("resourceClaimStatuses") or []
            if entry.get("resourceClaimName")
        }
        affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            node=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or ""),
            claims=tuple(
                PodClaim(
                    name=str(ref["name"]),
                    claim=str(ref.get("resourceClaimName") or made.get(str(ref["name"]), "")),
                    template=str(ref.get("resourceClaimTemplateName") or ""),
                )
                for ref in spec.get("resourceClaims") or []
            )
            + _extended_claim(status),
            annotations={
                str(key): value
                for key, value in (meta.get("annotations") or {}).items()
                if isinstance(value, str)
            },
            conditions=tuple(
                PodCondition(
                    str(c.get("type", "")),
                    str(c.get("status", "")),
                    str(c.get("reason") or ""),
                    str(c.get("message") or ""),
                )
                for c in status.get("conditions") or []
            ),
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            tolerations=tuple(spec.get("tolerations") or ()),
            required_affinity=affinity.get("requiredDuringSchedulingIgnoredDuringExecution"),
            deleting=bool(meta.get("deletionTimestamp")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            named_ports={
                str(port["name"]): (str(port.get("protocol") or "TCP"), int(port["containerPort"]))
                for container in spec.get("containers") or []
                for port in container.get("ports") or []
                if port.get("name") and port.get("containerPort")
            },
        )

    def condition_of(self, kind: str) -> PodCondition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def unschedulable(self) -> bool:
        """The scheduler tried and found no place for it."""
        scheduled = self.condition_of("PodScheduled")
        return scheduled is not None and scheduled.reason == "Unschedulable"

    @property
    def ready(self) -> bool:
        ready = self.condition_of("Ready")
        return ready is not None and ready.status == "True"

    def claim_names(self) -> list[str]:
        """The ResourceClaims it uses (those made so far from its templates too), in its spec's order."""
        return list(dict.fromkeys(c.claim for c in self.claims if c.claim))
