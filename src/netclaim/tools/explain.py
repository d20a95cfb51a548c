"""`netclaim explain`: why a pod's claims do or do not fit, per node and per device, in words.

The scheduler says "0/3 nodes are available: 3 cannot allocate all claims" and stops there. This module
redoes its reasoning from what anyone with read access sees (pods, claims, DeviceClasses, ResourceSlices,
nodes, IP pools) and says, for every request, which devices pass the DeviceClass's and the request's CEL
selectors (naming the clause that fails), how much capacity each has left against what is asked, and
what keeps the node out (taints, node selector, affinity). A claim that is allocated but not working is
explained from its status (prepare and attach errors, a missing agent). It ends with the smallest change
that would make the pod fit, when there is one.

Each request is judged alone, as if the pod's other requests took nothing: what the scheduler does when
two requests compete for one device is not redone here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from types import ModuleType
from typing import Any

from netclaim.names import DRIVER_DOMAIN
from netclaim.publish.devices import BANDWIDTH
from netclaim.quantity import parse_quantity, readable_quantity

DISABLED_LABEL = f"{DRIVER_DOMAIN}/agent"
ATTRIBUTE_IN_CLAUSE = re.compile(r'device\.attributes\["([^"]+)"\]\.(\w+)')


@dataclass(frozen=True)
class Snapshot:
    """What the API holds, as its JSON: all that explain reads."""

    pods: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    device_classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    agent_pods: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class PublishedDevice:
    driver: str
    pool: str
    name: str
    node: str  # "" for a device every node reaches (an IP pool)
    attributes: dict[str, dict[str, Any]]  # domain -> name -> value
    capacity: dict[str, Decimal]  # qualified name -> total
    defaults: dict[str, Decimal]  # qualified name -> what a request naming none consumes
    shared: bool

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


@dataclass
class RequestVerdict:
    claim: str
    request: str
    device_class: str
    asks: dict[str, Decimal]  # capacity -> amount (defaults filled from the devices)
    count: int
    problems: list[str] = field(default_factory=list)  # request-wide (a missing DeviceClass)
    devices: list[DeviceVerdict] = field(default_factory=list)

    def fitting(self, node: str) -> list[DeviceVerdict]:
        return [v for v in self.devices if not v.reasons and v.device.node in ("", node)]


@dataclass
class Explanation:
    pod: str
    state: str  # Running, Pending, ...
    node: str
    lines: list[str] = field(default_factory=list)  # the explanation, in order
    fixes: list[str] = field(default_factory=list)
    fits_on: list[str] = field(default_factory=list)
    summary: str = ""  # one line: the first problem or fix, else what works

    def as_data(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "state": self.state,
            "node": self.node,
            "explanation": self.lines,
            "fixes": self.fixes,
            "fitsOn": self.fits_on,
            "summary": self.summary,
        }


def _cel() -> ModuleType:
    import cel  # imported when a selector is evaluated; see netclaim.publish.policy

    return cel


def _attribute_value(value: dict[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def published_devices(slices: list[dict[str, Any]]) -> list[PublishedDevice]:
    devices = []
    for item in slices:
        spec = item.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        node = str(spec.get("nodeName") or "")
        for device in spec.get("devices") or []:
            attributes: dict[str, dict[str, Any]] = {}
            for name, value in (device.get("attributes") or {}).items():
                domain, _, short = name.rpartition("/")
                attributes.setdefault(domain or driver, {})[short] = _attribute_value(value)
            capacity, defaults = {}, {}
            for name, value in (device.get("capacity") or {}).items():
                qualified = name if "/" in name else f"{driver}/{name}"
                capacity[qualified] = parse_quantity(value["value"])
                default = (value.get("requestPolicy") or {}).get("default")
                if default is not None:
                    defaults[qualified] = parse_quantity(default)
            devices.append(
                PublishedDevice(
                    driver=driver,
                    pool=pool,
                    name=str(device["name"]),
                    node=node,
                    attributes=attributes,
                    capacity=capacity,
                    defaults=defaults,
                    shared=bool(device.get("allowMultipleAllocations")),
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
    """(True/False, "") or (None, why it cannot be evaluated here) for one device."""
    cel = _cel()
    capacity: dict[str, dict[str, int]] = {}
    for name, value in device.capacity.items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain, {})[short] = int(value)
    context = {
        "device": {
            "driver": device.driver,
            "attributes": device.attributes,
            "capacity": capacity,
            "allowMultipleAllocations": device.shared,
        }
    }
    try:
        result = cel.compile(expression).execute(cel.Context(context))
    except KeyError as err:
        return False, f"the device has no attribute {err}"
    except (ValueError, RuntimeError, TypeError) as err:
        return None, f"cannot be evaluated here ({str(err).splitlines()[0]})"
    if not isinstance(result, bool):
        return None, f"does not evaluate to a bool ({type(result).__name__})"
    return result, ""


def failing_clause(expression: str, device: PublishedDevice) -> str | None:
    """None when the expression selects the device, else the first clause that does not, in words."""
    result, why = evaluate(expression, device)
    if result is True:
        return None
    parts = clauses(expression)
    if len(parts) > 1:
        for part in parts:
            part_result, part_why = evaluate(part, device)
            if part_result is not True:
                return f"`{part}` is false{f' ({part_why})' if part_why else ''}"
    return f"`{expression}` is {'false' if result is False else 'unknown'}{f' ({why})' if why else ''}"


def consumed_capacity(
    claims: list[dict[str, Any]], skip: set[str]
) -> tuple[dict[tuple[str, str, str], dict[str, Decimal]], dict[tuple[str, str, str], str]]:
    """(capacity consumed per shared device, the claim holding each device) of every allocated claim but
    those in `skip` (the pod's own)."""
    consumed: dict[tuple[str, str, str], dict[str, Decimal]] = {}
    holders: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        if meta.get("uid") in skip:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            holders.setdefault(key, f"{meta.get('namespace')}/{meta.get('name')}")
            for name, value in (result.get("consumedCapacity") or {}).items():
                qualified = name if "/" in name else f"{key[0]}/{name}"
                used = consumed.setdefault(key, {})
                used[qualified] = used.get(qualified, Decimal(0)) + parse_quantity(value)
    return consumed, holders


def show_quantity(value: Decimal) -> str:
    """Counts (attachments, addresses) as numbers; bandwidth in its shortest exact unit (10G, 5Gi)."""
    return str(int(value)) if value < 1_000_000 else readable_quantity(int(value))


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
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
    return True  # Gt/Lt: not judged here


def node_problems(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Why the pod cannot go to this node whatever its claims, in short."""
    spec, meta = pod.get("spec") or {}, node.get("metadata") or {}
    labels = meta.get("labels") or {}
    problems = []
    if (node.get("spec") or {}).get("unschedulable"):
        problems.append("the node is cordoned (unschedulable)")
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, spec.get("tolerations") or []
        ):
            problems.append(
                f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} is not tolerated"
            )
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            problems.append(
                f"the pod's nodeSelector {key}={value} excludes it ({key}={labels.get(key, '(unset)')})"
            )
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if required and not any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions") or []) for term in required
    ):
        problems.append("the pod's required node affinity excludes it")
    return problems


def _claim_specs(
    pod: dict[str, Any], snapshot: Snapshot
) -> Iterator[tuple[str, dict[str, Any] | None, dict[str, Any]]]:
    """(name shown, the claim object or None while it is not created yet, its spec) of each pod claim."""
    namespace = pod["metadata"]["namespace"]
    generated = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in snapshot.claims}
    templates = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in snapshot.templates}
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        claim = claims.get((namespace, name)) if name else None
        if claim is not None:
            yield f"claim {name}", claim, claim.get("spec") or {}
            continue
        template = templates.get((namespace, ref.get("resourceClaimTemplateName")))
        if template is not None:
            yield (
                f"claim {ref['name']} (template {ref['resourceClaimTemplateName']})",
                None,
                (template.get("spec") or {}).get("spec") or {},
            )
        else:
            yield f"claim {ref['name']}", None, {}


def judge_request(
    claim: str,
    request: dict[str, Any],
    classes: dict[str, dict[str, Any]],
    devices: list[PublishedDevice],
    consumed: dict[tuple[str, str, str], dict[str, Decimal]],
    holders: dict[tuple[str, str, str], str],
) -> RequestVerdict:
    exactly = request.get("exactly") or request
    class_name = str(exactly.get("deviceClassName", ""))
    asked = {
        (name if "/" in name else f"{DRIVER_DOMAIN}/{name}"): parse_quantity(value)
        for name, value in ((exactly.get("capacity") or {}).get("requests") or {}).items()
    }
    verdict = RequestVerdict(
        claim, str(request.get("name", "")), class_name, asked, int(exactly.get("count") or 1)
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
    own_selectors = [s["cel"]["expression"] for s in exactly.get("selectors") or [] if "cel" in s]
    for device in devices:
        judged = DeviceVerdict(device)
        for origin, expressions in (
            ("DeviceClass " + class_name, class_selectors),
            ("the request's selector", own_selectors),
        ):
            for expression in expressions:
                failing = failing_clause(expression, device)
                if failing is not None:
                    judged.reasons.append(f"{origin}: {failing}")
        if judged.reasons:
            verdict.devices.append(judged)
            continue
        used = consumed.get(device.key, {})
        holder = holders.get(device.key)
        if not device.shared:
            if holder is not None:
                judged.reasons.append(f"taken whole by {holder}")
        else:
            for name, total in device.capacity.items():
                want = asked.get(name, device.defaults.get(name))
                if want is None:
                    continue
                free = total - used.get(name, Decimal(0))
                judged.free[name] = free
                if want > free:
                    judged.short.add(name)
                    short, of = name.rpartition("/")[2], show_quantity(total)
                    judged.reasons.append(
                        f"{short}: {show_quantity(free)} free of {of}, asks {show_quantity(want)}"
                    )
        verdict.devices.append(judged)
    return verdict


def _fix_for(verdict: RequestVerdict, nodes_open: set[str]) -> list[str]:
    """The smallest change that would let this request fit, when one can be named."""
    if verdict.problems:
        return [
            f"create DeviceClass {verdict.device_class!r} "
            f"or name an existing one in request {verdict.request}"
        ]
    selected = [
        v
        for v in verdict.devices
        if not any(r.startswith(("DeviceClass", "the request's")) for r in v.reasons)
    ]
    if not selected:
        fixes = []
        failing = {r for v in verdict.devices for r in v.reasons}
        for reason in sorted(failing):
            for domain, attribute in ATTRIBUTE_IN_CLAUSE.findall(reason):
                values = sorted(
                    {
                        str(v.device.attributes.get(domain, {}).get(attribute))
                        for v in verdict.devices
                        if attribute in v.device.attributes.get(domain, {})
                    }
                )
                fixes.append(
                    f"no device passes {reason.split(': ', 1)[1]}; "
                    f"published {attribute} values: {', '.join(values) or 'none'}"
                )
        return fixes or [f"no published device passes the selectors of request {verdict.request}"]
    reachable = [v for v in selected if v.device.node in ("",) or v.device.node in nodes_open]
    if not reachable:
        where = sorted({v.device.node for v in selected})
        return [
            f"the devices request {verdict.request} selects are on {', '.join(where)}, which the pod may "
            "not use: change its node selection or tolerations"
        ]
    fixes = []
    short_of = sorted({name for v in reachable for name in v.short})
    for name in short_of:
        short = name.rpartition("/")[2]
        best = max((v for v in reachable if name in v.free), key=lambda v: v.free[name])
        if name in verdict.asks and best.free[name] > 0:
            room = show_quantity(best.free[name])
            fixes.append(f"{best.device.label} has {room} {short} free: ask ≤ {room}")
        else:
            listing = ", ".join(
                f"{v.device.label}: {show_quantity(v.free[name])}" for v in reachable if name in v.free
            )
            fixes.append(
                f"no device has the {short} asked for free ({listing}): "
                "wait for a claim to end, or add capacity"
            )
    for v in reachable:
        for reason in v.reasons:
            if reason.startswith("taken whole by"):
                fixes.append(f"{v.device.label} is {reason}: wait for it, or use a shared DeviceClass")
    return fixes


def explain_pod(pod: dict[str, Any], snapshot: Snapshot) -> Explanation:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    node_name = str(spec.get("nodeName") or "")
    status = pod.get("status") or {}
    state = str(status.get("phase", "Pending"))
    explanation = Explanation(f"{meta['namespace']}/{meta['name']}", state, node_name)
    say = explanation.lines.append
    claims = list(_claim_specs(pod, snapshot))
    if not claims:
        say("the pod asks for no DRA claims")
        explanation.summary = explanation.lines[0]
        return explanation
    if node_name:
        _explain_scheduled(pod, claims, snapshot, explanation)
        return explanation
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            say(f"scheduler: {condition.get('message', '')}")
    classes = {c["metadata"]["name"]: c for c in snapshot.device_classes}
    devices = published_devices(snapshot.slices)
    own = {c["metadata"].get("uid") for _, c, _ in claims if c is not None}
    consumed, holders = consumed_capacity(snapshot.claims, own)
    nodes_open = set()
    for node in snapshot.nodes:
        problems = node_problems(pod, node)
        if problems:
            say(f"node {node['metadata']['name']}: " + "; ".join(problems))
        else:
            nodes_open.add(node["metadata"]["name"])
    verdicts = []
    for shown, claim, claim_spec in claims:
        if claim is not None and (claim.get("status") or {}).get("allocation"):
            say(f"{shown}: allocated")
            continue
        requests = (claim_spec.get("devices") or {}).get("requests") or []
        if not requests:
            say(f"{shown}: not found, and no template makes it")
        for request in requests:
            verdicts.append(judge_request(shown, request, classes, devices, consumed, holders))
    for verdict in verdicts:
        _say_request(verdict, explanation)
    explanation.fits_on = sorted(
        node
        for node in nodes_open
        if all(len(v.fitting(node)) >= v.count for v in verdicts) and not any(v.problems for v in verdicts)
    )
    if explanation.fits_on:
        say(f"fits on: {', '.join(explanation.fits_on)} (the scheduler may not have retried yet)")
        explanation.summary = explanation.lines[-1]
        return explanation
    for verdict in verdicts:
        if not any(len(verdict.fitting(node)) >= verdict.count for node in nodes_open) or verdict.problems:
            explanation.fixes += _fix_for(verdict, nodes_open)
    explanation.summary = explanation.fixes[0] if explanation.fixes else explanation.lines[-1]
    return explanation


def _say_request(verdict: RequestVerdict, explanation: Explanation) -> None:
    say = explanation.lines.append
    asks = (
        ", ".join(f"{show_quantity(v)} of {k}" for k, v in verdict.asks.items())
        or "no capacity (each device's default)"
    )
    say(
        f"{verdict.claim}, request {verdict.request} (DeviceClass {verdict.device_class}, "
        f"{verdict.count} device(s), asks {asks}):"
    )
    for problem in verdict.problems:
        say(f"  {problem}")
    if not verdict.problems and not verdict.devices:
        say("  no devices are published")
    for judged in verdict.devices:
        if judged.reasons:
            say(f"  {judged.device.label}: does not fit: " + "; ".join(judged.reasons))
        else:
            free = ", ".join(
                f"{show_quantity(v)} {k.rpartition('/')[2]} free" for k, v in judged.free.items()
            )
            say(f"  {judged.device.label}: fits{f' ({free})' if free else ''}")
    for name in verdict.asks.keys() | {n for d in verdict.devices for n in d.device.defaults}:
        if name not in verdict.asks and any(name in d.device.defaults for d in verdict.devices):
            defaults = sorted(
                {show_quantity(d.device.defaults[name]) for d in verdict.devices if name in d.device.defaults}
            )
            short = name.rpartition("/")[2]
            takes = "consumes, and is capped at," if name == BANDWIDTH else "takes"
            say(f"  asks no {short}: {takes} the device's default {' / '.join(defaults)}")


def _explain_scheduled(
    pod: dict[str, Any],
    claims: list[tuple[str, dict[str, Any] | None, dict[str, Any]]],
    snapshot: Snapshot,
    explanation: Explanation,
) -> None:
    say = explanation.lines.append
    node = explanation.node
    say(f"scheduled on {node}")
    waiting = False
    problems: list[str] = []
    ready = 0
    for shown, claim, _ in claims:
        if claim is None:
            say(f"{shown}: not created yet")
            waiting = True
            continue
        status = claim.get("status") or {}
        results = [
            r
            for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            if r.get("driver") == DRIVER_DOMAIN
        ]
        entries = {
            (e.get("pool"), e.get("device")): e
            for e in status.get("devices") or []
            if e.get("driver") == DRIVER_DOMAIN
        }
        for result in results:
            entry = entries.get((result.get("pool"), result.get("device")))
            where = f"{shown}, request {result.get('request')}: {result.get('device')}"
            if entry is None:
                problems.append(f"{where}: allocated; the agent has not reported on it")
                say(problems[-1])
                waiting = True
                continue
            for condition in entry.get("conditions") or []:
                if condition.get("type") != "Ready":
                    continue
                data = entry.get("networkData") or {}
                if condition.get("status") == "True":
                    ready += 1
                    say(
                        f"{where}: ready, {data.get('interfaceName', '')} "
                        f"{', '.join(data.get('ips') or [])}".rstrip()
                    )
                else:
                    problems.append(f"{where}: {condition.get('reason')}: {condition.get('message')}")
                    say(problems[-1])
                    if condition.get("reason") == "PrepareFailed":
                        explanation.fixes.append(
                            f"fix the config of {shown} as the message says; the pod is retried"
                        )
                    elif condition.get("reason") == "WaitingForPodSandbox":
                        waiting = True
    if waiting:
        agents = [
            p
            for p in snapshot.agent_pods
            if (p.get("spec") or {}).get("nodeName") == node
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]
        node_object = next((n for n in snapshot.nodes if n["metadata"]["name"] == node), {})
        labels = (node_object.get("metadata") or {}).get("labels") or {}
        if not agents:
            problems.insert(0, f"no netclaim agent is Ready on {node}")
            why = (
                f" (the node is labelled {DISABLED_LABEL}={labels[DISABLED_LABEL]})"
                if labels.get(DISABLED_LABEL) == "disabled"
                else ""
            )
            say(f"no netclaim agent is Ready on {node}{why}: the pod waits for it (fail closed)")
            explanation.fixes.append(
                f"start the agent on {node}"
                + (f": kubectl label node {node} {DISABLED_LABEL}-" if why else "")
            )
    explanation.summary = problems[0] if problems else f"{ready} device(s) ready"


def table(snapshot: Snapshot) -> list[dict[str, Any]]:
    """One row per pod with claims: its state and the first line that says why."""
    rows = []
    for pod in snapshot.pods:
        if not (pod.get("spec") or {}).get("resourceClaims"):
            continue
        found = explain_pod(pod, snapshot)
        rows.append({"pod": found.pod, "state": found.state, "node": found.node or "-", "why": found.summary})
    return rows


def explain_claim(namespace: str, name: str, snapshot: Snapshot) -> list[Explanation]:
    """The pods that use the claim, explained; a claim no pod uses yet is explained as a pod would see it
    that could go to any node."""
    users = [
        p
        for p in snapshot.pods
        if p["metadata"]["namespace"] == namespace
        and any(
            ref.get("resourceClaimName") == name
            for ref in [
                *((p.get("spec") or {}).get("resourceClaims") or []),
                *((p.get("status") or {}).get("resourceClaimStatuses") or []),
            ]
        )
    ]
    if users:
        return [explain_pod(p, snapshot) for p in users]
    standalone = {
        "metadata": {"namespace": namespace, "name": f"(no pod uses claim {name})"},
        "spec": {"resourceClaims": [{"name": name, "resourceClaimName": name}]},
        "status": {"phase": "-"},
    }
    return [explain_pod(standalone, snapshot)]
