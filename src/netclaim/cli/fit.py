"""What `netclaim explain` redoes of the scheduler's reasoning: the devices the cluster's ResourceSlices
offer, which of them a request's CEL selectors pass (naming the clause that fails), what capacity each has
left as KEP-5075 counts it, and whether a node's taints and the pod's node selection let the pod there.
Pure: it judges the objects it is given (netclaim.cli.explain reads them and says it in words)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from netclaim.core.devices import selectors
from netclaim.core.devices.catalog import LINK_DOWN
from netclaim.core.objects import Pod, Slice
from netclaim.core.quantity import parse_quantity, readable_quantity


@dataclass(frozen=True)
class PublishedDevice:
    driver: str
    pool: str
    name: str
    node: str  # "" for a device other nodes reach too (all nodes, or those `node_selector` selects)
    attributes: dict[str, dict[str, Any]]  # domain -> name -> value
    capacity: dict[str, Decimal]  # the name as published -> total
    policies: dict[str, dict[str, Any]]  # the name as published -> its requestPolicy
    shared: bool
    node_selector: dict[str, Any] | None = None  # a NodeSelector; None with node "": every node
    taints: tuple[dict[str, Any], ...] = ()

    @property
    def defaults(self) -> dict[str, Decimal]:
        """What a request naming the capacity does not consume: the policy's default."""
        return {n: parse_quantity(p["default"]) for n, p in self.policies.items() if p.get("default")}

    def reaches(self, node: dict[str, Any]) -> bool:
        if self.node:
            return bool(self.node == node["metadata"]["name"])
        return self.node_selector is None or node_selector_matches(self.node_selector, node)

    @property
    def label(self) -> str:
        if_name = self.attributes.get(self.driver, {}).get("ifName")
        pool = self.attributes.get(self.driver, {}).get("pool")
        shown = if_name or (f"IPPool {pool}" if pool else self.name)
        return f"{shown} on {self.node}" if self.node else str(shown)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name


@dataclass
class DeviceVerdict:
    device: PublishedDevice
    reasons: list[str] = field(default_factory=list)  # empty: it fits
    free: dict[str, Decimal] = field(default_factory=dict)  # of the capacities the request consumes
    short: set[str] = field(default_factory=set)  # the capacities with less free than asked
    unjudged: list[str] = field(default_factory=list)  # selectors CEL here cannot evaluate


@dataclass
class RequestVerdict:
    claim: str
    request: str
    device_class: str
    asks: dict[str, Decimal]  # capacity -> amount (defaults filled from the devices)
    count: int
    problems: list[str] = field(default_factory=list)  # request-wide (a missing DeviceClass)
    devices: list[DeviceVerdict] = field(default_factory=list)

    def fitting(self, node: dict[str, Any]) -> list[DeviceVerdict]:
        return [v for v in self.devices if not v.reasons and v.device.reaches(node)]


def _attribute_value(value: dict[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def published_devices(slices: list[dict[str, Any]]) -> list[PublishedDevice]:
    """Every device of the slices of each pool's newest generation (older ones are being replaced)."""
    read = [Slice.from_api(item) for item in slices]
    newest: dict[tuple[str, str], int] = {}
    for one in read:
        newest[(one.driver, one.pool)] = max(newest.get((one.driver, one.pool), 0), one.generation)
    devices = []
    for one in (s for s in read if s.generation >= newest[(s.driver, s.pool)]):
        for device in one.devices:
            attributes: dict[str, dict[str, Any]] = {}
            for name, value in (device.get("attributes") or {}).items():
                domain, _, short = name.rpartition("/")
                attributes.setdefault(domain or one.driver, {})[short] = _attribute_value(value)
            capacity = {
                str(name): parse_quantity(value["value"])
                for name, value in (device.get("capacity") or {}).items()
            }
            policies = {
                str(name): dict(value["requestPolicy"])
                for name, value in (device.get("capacity") or {}).items()
                if value.get("requestPolicy")
            }
            if one.per_device_node_selection:  # each device says where it is
                node = str(device.get("nodeName") or "")
                selector = None if device.get("allNodes") else device.get("nodeSelector")
            else:
                node, selector = one.node, one.node_selector
            devices.append(
                PublishedDevice(
                    driver=one.driver,
                    pool=one.pool,
                    name=str(device["name"]),
                    node=node,
                    attributes=attributes,
                    capacity=capacity,
                    policies=policies,
                    shared=bool(device.get("allowMultipleAllocations")),
                    node_selector=selector,
                    taints=tuple(dict(t) for t in device.get("taints") or []),
                )
            )
    return devices


def clauses(expression: str) -> list[str]:
    """The top-level `&&` operands of a CEL expression (outside parentheses, brackets and strings)."""
    parts, depth, quote, start, index = [], 0, "", 0, 0
    while index < len(expression):
        char = expression[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif expression.startswith("&&", index) and depth == 0:
            parts.append(expression[start:index].strip())
            start = index + 2
            index += 1
        index += 1
    parts.append(expression[start:].strip())
    return [p for p in parts if p]


def evaluate(expression: str, device: PublishedDevice) -> tuple[bool | None, str]:
    """(True/False, why not) or (None, why it cannot be evaluated here) for one device."""
    verdict = selectors.evaluate(expression, device.driver, device.attributes, device.capacity, device.shared)
    if verdict.selected is None:
        return None, f"cannot be evaluated here ({verdict.why})"
    return verdict.selected, verdict.why


def failing_clause(expression: str, device: PublishedDevice) -> str | None:
    """None when the expression selects the device, else the first clause that does not, in words."""
    result, why = evaluate(expression, device)
    if result is True:
        return None
    parts = clauses(expression)
    if len(parts) > 1:
        for part in parts:
            part_result, part_why = evaluate(part, device)
            if part_result is False:
                return f"`{part}` is false{f' ({part_why})' if part_why else ''}"
    return f"`{expression}` is {'false' if result is False else 'unknown'}{f' ({why})' if why else ''}"


def consumed_capacity(
    claims: list[dict[str, Any]],
) -> tuple[dict[tuple[str, str, str], dict[str, Decimal]], dict[tuple[str, str, str], str]]:
    """(capacity consumed per device, by the names the scheduler recorded; the claim holding each device)
    of every allocated claim. An adminAccess allocation (monitoring) takes nothing from anyone."""
    consumed: dict[tuple[str, str, str], dict[str, Decimal]] = {}
    holders: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            holders.setdefault(key, f"{meta.get('namespace')}/{meta.get('name')}")
            for name, value in (result.get("consumedCapacity") or {}).items():
                used = consumed.setdefault(key, {})
                used[str(name)] = used.get(str(name), Decimal(0)) + parse_quantity(value)
    return consumed, holders


def consumption(asked: Decimal | None, total: Decimal, policy: dict[str, Any] | None) -> Decimal:
    """What one allocation consumes of a capacity, as the scheduler computes it (KEP-5075): an ask
    rounded up to the policy's range (min, then steps from min) or to its next valid value; no ask:
    the policy's default, else all of it."""
    if asked is None:
        return parse_quantity(policy["default"]) if policy and policy.get("default") else total
    if not policy:
        return asked
    valid_range = policy.get("validRange") or {}
    if valid_range.get("min") is not None:
        low = parse_quantity(valid_range["min"])
        if asked < low:
            return low
        if valid_range.get("step") is None:
            return asked
        step = parse_quantity(valid_range["step"])
        steps = -(-(asked - low) // step)  # ceiling
        return low + steps * step
    for value in (parse_quantity(v) for v in policy.get("validValues") or []):
        if asked <= value:
            return value
    return asked


def _over_policy(consumed: Decimal, policy: dict[str, Any] | None) -> str:
    """Why the consumption breaks the policy ("" when it does not)."""
    if not policy:
        return ""
    valid_range = policy.get("validRange") or {}
    if valid_range.get("max") is not None and consumed > parse_quantity(valid_range["max"]):
        return f"at most {show_quantity(parse_quantity(valid_range['max']))} per allocation"
    values = [parse_quantity(v) for v in policy.get("validValues") or []]
    if values and consumed not in values:
        return f"one of {', '.join(show_quantity(v) for v in values)} per allocation"
    return ""


def show_quantity(value: Decimal) -> str:
    """Counts (attachments, addresses) as numbers; bandwidth in its shortest exact unit (10G, 5Gi)."""
    return str(int(value)) if value < 1_000_000 else readable_quantity(int(value))


def _taint_reason(taint: dict[str, Any]) -> str:
    since = f" since {taint['timeAdded']}" if taint.get("timeAdded") else ""
    why = ": its link is down" if taint.get("key") == LINK_DOWN else ""
    named = f"{taint.get('key')} ({taint.get('effect')})"
    return f"tainted {named}{since}{why}, and the request does not tolerate it"


def _tolerated(taint: dict[str, Any], tolerations: tuple[dict[str, Any], ...]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            return True
        if toleration.get("key") != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = (
        expression.get("key", ""),
        expression.get("operator"),
        expression.get("values") or [],
    )
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        try:
            have, limit = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def node_selector_matches(selector: dict[str, Any], node: dict[str, Any]) -> bool:
    """A NodeSelector (its terms ORed; each term's expressions and fields ANDed) against a node."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": str(node["metadata"]["name"])}
    terms = selector.get("nodeSelectorTerms") or []
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_expression_holds(e, labels) for e in term.get("matchExpressions") or [])
        and all(_expression_holds(e, fields) for e in term.get("matchFields") or [])
        for term in terms
    )


def node_problems(pod: Pod, node: dict[str, Any]) -> list[str]:
    """Why the pod cannot go to this node whatever its claims, in short."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    problems = []
    if (node.get("spec") or {}).get("unschedulable"):
        problems.append("the node is cordoned (unschedulable)")
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, pod.tolerations):
            problems.append(
                f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} is not tolerated"
            )
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            problems.append(
                f"the pod's nodeSelector {key}={value} excludes it ({key}={labels.get(key, '(unset)')})"
            )
    if pod.required_affinity and not node_selector_matches(pod.required_affinity, node):
        problems.append("the pod's required node affinity excludes it")
    return problems


def judge_request(
    claim: str,
    request: dict[str, Any],
    classes: dict[str, dict[str, Any]],
    devices: list[PublishedDevice],
    consumed: dict[tuple[str, str, str], dict[str, Decimal]],
    holders: dict[tuple[str, str, str], str],
) -> RequestVerdict:
    """One request (or one firstAvailable subrequest) against every published device."""
    class_name = str(request.get("deviceClassName", ""))
    asked = {
        str(name): parse_quantity(value)
        for name, value in ((request.get("capacity") or {}).get("requests") or {}).items()
    }
    verdict = RequestVerdict(
        claim, str(request.get("name", "")), class_name, asked, int(request.get("count") or 1)
    )
    device_class = classes.get(class_name)
    if device_class is None:
        verdict.problems.append(
            f"DeviceClass {class_name!r} does not exist (there are: {', '.join(sorted(classes)) or 'none'})"
        )
        return verdict
    class_selectors = [
        s["cel"]["expression"] for s in (device_class.get("spec") or {}).get("selectors") or [] if "cel" in s
    ]
    own_selectors = [s["cel"]["expression"] for s in request.get("selectors") or [] if "cel" in s]
    for device in devices:
        judged = DeviceVerdict(device)
        for origin, expressions in (
            ("DeviceClass " + class_name, class_selectors),
            ("the request's selector", own_selectors),
        ):
            for expression in expressions:
                result, why = evaluate(expression, device)
                if result is None:  # the scheduler may well select it: do not count it out
                    judged.unjudged.append(f"{origin}: `{expression}` {why}")
                elif result is False:
                    judged.reasons.append(f"{origin}: {failing_clause(expression, device)}")
        tolerations = tuple(dict(t) for t in request.get("tolerations") or [])
        for taint in device.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
                judged.reasons.append(_taint_reason(taint))
        if judged.reasons:
            verdict.devices.append(judged)
            continue
        _judge_capacity(judged, asked, consumed.get(device.key, {}), holders.get(device.key))
        verdict.devices.append(judged)
    return verdict


def _judge_capacity(
    judged: DeviceVerdict, asked: dict[str, Decimal], used: dict[str, Decimal], holder: str | None
) -> None:
    device = judged.device
    missing = sorted(set(asked) - set(device.capacity))
    if missing:  # the scheduler matches capacity names exactly
        published = ", ".join(sorted(device.capacity)) or "none"
        judged.reasons.append(f"has no capacity {', '.join(missing)} (it publishes: {published})")
        return
    if not device.shared:
        if holder is not None:
            judged.reasons.append(f"taken whole by {holder}")
        for name, want in asked.items():
            if want > device.capacity[name]:
                short = name.rpartition("/")[2]
                judged.reasons.append(
                    f"{short}: has {show_quantity(device.capacity[name])}, asks {show_quantity(want)}"
                )
        return
    for name, total in device.capacity.items():
        policy = device.policies.get(name)
        want = consumption(asked.get(name), total, policy)
        short = name.rpartition("/")[2]
        breaks = _over_policy(want, policy)
        if breaks:
            judged.reasons.append(f"{short}: asks {show_quantity(want)}, the device allows {breaks}")
            continue
        free = total - used.get(name, Decimal(0))
        judged.free[name] = free
        if want > free:
            judged.short.add(name)
            rounded = (
                f" ({show_quantity(asked[name])} rounded up)" if name in asked and asked[name] != want else ""
            )
            free_of = f"{show_quantity(free)} free of {show_quantity(total)}"
            judged.reasons.append(f"{short}: {free_of}, asks {show_quantity(want)}{rounded}")
