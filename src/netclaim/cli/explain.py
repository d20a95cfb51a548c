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
from typing import Any

from netclaim.cli.fit import (
    RequestVerdict,
    consumed_capacity,
    judge_request,
    node_problems,
    node_selector_matches,
    published_devices,
    show_quantity,
)
from netclaim.core.devices.catalog import BANDWIDTH
from netclaim.core.names import DRIVER_DOMAIN, NETWORK, SLICE_SERVICE_NAME
from netclaim.core.objects import Pod, PodClaim
from netclaim.core.policy.rules import PolicyObject
from netclaim.core.quantity import parse_quantity

DISABLED_LABEL = f"{DRIVER_DOMAIN}/agent"
SELECTOR_ORIGINS = ("DeviceClass ", "the request's selector")  # reasons that unselect a device
ATTRIBUTE_IN_CLAUSE = re.compile(r'device\.attributes\["([^"]+)"\]\.(\w+)')


@dataclass(frozen=True)
class Snapshot:
    """What the API holds, as its JSON (pods as netclaim reads them): all that explain reads."""

    pods: list[Pod]
    claims: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    device_classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    agent_pods: list[Pod] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # what the reader's RBAC did not let it list
    endpoint_slices: list[dict[str, Any]] = field(default_factory=list)  # of network Services (ours)
    network_policies: list[dict[str, Any]] = field(default_factory=list)  # MultiNetworkPolicies


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


def _claim_specs(pod: Pod, snapshot: Snapshot) -> Iterator[tuple[str, dict[str, Any] | None, dict[str, Any]]]:
    """(name shown, the claim object or None while it is not created yet, its spec) of each pod claim."""
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in snapshot.claims}
    templates = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in snapshot.templates}
    for ref in pod.claims:
        claim = claims.get((pod.namespace, ref.claim))
        if claim is not None:
            yield f"claim {ref.claim}", claim, claim.get("spec") or {}
            continue
        template = templates.get((pod.namespace, ref.template))
        if template is not None:
            yield (
                f"claim {ref.name} (template {ref.template})",
                None,
                (template.get("spec") or {}).get("spec") or {},
            )
        else:
            yield f"claim {ref.name}", None, {}


def _asks_bandwidth(claim: dict[str, Any], request_name: str) -> bool:
    """Whether the claim's request (or firstAvailable subrequest, "name/sub") names a bandwidth."""
    name, _, sub = request_name.partition("/")
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if request.get("name") != name:
            continue
        chosen = (
            next((s for s in request.get("firstAvailable") or [] if s.get("name") == sub), {})
            if sub
            else request.get("exactly") or {}
        )
        return BANDWIDTH in ((chosen.get("capacity") or {}).get("requests") or {})
    return False


def _bandwidth_taken(claim: dict[str, Any], result: dict[str, Any]) -> str:
    """ ", bandwidth 5Gi" as the scheduler consumed it for this result; said loudly when it is the NIC's
    default because the claim asked for none: that is also the cap the agent puts on the interface."""
    consumed = (result.get("consumedCapacity") or {}).get(BANDWIDTH)
    if consumed is None:
        return ""
    taken = show_quantity(parse_quantity(str(consumed)))
    if _asks_bandwidth(claim, str(result.get("request", ""))):
        return f", bandwidth {taken}"
    return f", bandwidth {taken} (the NIC's default: the claim asks for none, and is capped at it)"


def _fix_for(verdict: RequestVerdict, nodes_open: list[dict[str, Any]]) -> list[str]:
    """The smallest change that would let this request fit, when one can be named."""
    if verdict.problems:
        return [
            f"create DeviceClass {verdict.device_class!r} "
            f"or name an existing one in request {verdict.request}"
        ]
    selected = [v for v in verdict.devices if not any(r.startswith(SELECTOR_ORIGINS) for r in v.reasons)]
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
    reachable = [v for v in selected if any(v.device.reaches(node) for node in nodes_open)]
    if not reachable:
        where = sorted({v.device.node or "the nodes its slice selects" for v in selected})
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


def explain_pod(pod: Pod, snapshot: Snapshot) -> Explanation:
    explanation = Explanation(f"{pod.namespace}/{pod.name}", pod.phase or "Pending", pod.node)
    say = explanation.lines.append
    claims = list(_claim_specs(pod, snapshot))
    if not claims:
        say("the pod asks for no DRA claims")
        explanation.summary = explanation.lines[0]
        return explanation
    if pod.node:
        _explain_scheduled(claims, snapshot, explanation)
        explanation.lines += policed_by(
            pod, [c for _, c, _ in claims if c is not None], snapshot.network_policies
        )
        explanation.lines += served_by(pod, snapshot.endpoint_slices)
        return explanation
    for what in snapshot.unreadable:
        say(f"could not read {what} (RBAC): what follows may be incomplete")
    scheduled = pod.condition_of("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        say(f"scheduler: {scheduled.message}")
    classes = {c["metadata"]["name"]: c for c in snapshot.device_classes}
    devices = published_devices(snapshot.slices)
    consumed, holders = consumed_capacity(snapshot.claims)
    nodes_open = []
    for node in snapshot.nodes:
        problems = node_problems(pod, node)
        for shown, claim, _ in claims:  # an allocated claim keeps the pod where its devices are
            selector = ((claim or {}).get("status") or {}).get("allocation", {}).get("nodeSelector")
            if selector and not node_selector_matches(selector, node):
                problems.append(f"{shown} is allocated to devices this node does not reach")
        if problems:
            say(f"node {node['metadata']['name']}: " + "; ".join(problems))
        else:
            nodes_open.append(node)
    groups: list[list[RequestVerdict]] = []  # each request: its alternatives (firstAvailable), any will do
    constraints: list[tuple[str, dict[str, Any], dict[str, list[RequestVerdict]]]] = []
    for shown, claim, claim_spec in claims:
        if claim is not None and (claim.get("status") or {}).get("allocation"):
            say(f"{shown}: allocated")
            continue
        requests = (claim_spec.get("devices") or {}).get("requests") or []
        if not requests:
            say(f"{shown}: not found, and no template makes it")
        by_name: dict[str, list[RequestVerdict]] = {}
        for request in requests:
            alternatives = [
                {**sub, "name": f"{request.get('name')}/{sub.get('name')}"}
                for sub in request.get("firstAvailable") or []
            ] or [{**(request.get("exactly") or {}), "name": request.get("name")}]
            by_name[str(request.get("name"))] = [
                judge_request(shown, alt, classes, devices, consumed, holders) for alt in alternatives
            ]
            groups.append(by_name[str(request.get("name"))])
        for constraint in (claim_spec.get("devices") or {}).get("constraints") or []:
            constraints.append((shown, constraint, by_name))
    for group in groups:
        for verdict in group:
            _say_request(verdict, explanation)

    def fits(group: list[RequestVerdict], node: dict[str, Any]) -> bool:
        return any(not v.problems and len(v.fitting(node)) >= v.count for v in group)

    # a node where each request fits alone but no devices that fit agree on a constraint's attribute
    broken: dict[str, list[str]] = {}
    for node in (n for n in nodes_open if all(fits(g, n) for g in groups)):
        for shown, constraint, by_name in constraints:
            problem = constraint_problem(constraint, by_name, node)
            if problem is not None:
                broken.setdefault(str(node["metadata"]["name"]), []).append(f"{shown}: {problem}")
    for name, problems in sorted(broken.items()):
        for problem in problems:
            say(f"node {name}: {problem}")
    explanation.fits_on = sorted(
        str(n["metadata"]["name"])
        for n in nodes_open
        if all(fits(g, n) for g in groups) and str(n["metadata"]["name"]) not in broken
    )
    if explanation.fits_on:
        say(f"fits on: {', '.join(explanation.fits_on)} (the scheduler may not have retried yet)")
        explanation.summary = explanation.lines[-1]
        return explanation
    for group in groups:
        if not any(fits(group, node) for node in nodes_open):
            for verdict in group:
                explanation.fixes += _fix_for(verdict, nodes_open)
    if not explanation.fixes and broken:
        explanation.fixes.append(
            "every request fits alone, but not together: "
            + "; ".join(f"on {name}, {problems[0]}" for name, problems in sorted(broken.items()))
        )
    explanation.summary = explanation.fixes[0] if explanation.fixes else explanation.lines[-1]
    return explanation


def constraint_problem(
    constraint: dict[str, Any], by_name: dict[str, list[RequestVerdict]], node: dict[str, Any]
) -> str | None:
    """Why no devices that fit on `node` satisfy the claim's constraint together, or None when some do (or
    the constraint is of a kind judged only by the scheduler). matchAttribute: one device per request
    with the same value of the attribute; distinctAttribute: as many different values as requests (what
    the scheduler needs at the least)."""
    names = [str(n) for n in constraint.get("requests") or by_name]
    attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
    if not attribute or any(n not in by_name for n in names):
        return None
    domain, _, short = str(attribute).rpartition("/")
    values: dict[str, set[Any]] = {}
    for name in names:
        fitting = [  # of the alternatives (firstAvailable) that can be chosen here
            d
            for verdict in by_name[name]
            if not verdict.problems and len(verdict.fitting(node)) >= verdict.count
            for d in verdict.fitting(node)
        ]
        values[name] = {
            d.device.attributes.get(domain, {}).get(short)
            for d in fitting
            if d.device.attributes.get(domain, {}).get(short) is not None
        }
    seen = "; ".join(f"{n}: {', '.join(sorted(map(str, v))) or 'none'}" for n, v in values.items())
    if "matchAttribute" in constraint:
        if set.intersection(*values.values()):
            return None
        return (
            f"constraint matchAttribute {attribute} of requests {', '.join(names)}: no devices that fit "
            f"share a value ({seen})"
        )
    if len(set.union(*values.values())) >= len(names) and all(values.values()):
        return None
    return (
        f"constraint distinctAttribute {attribute} of requests {', '.join(names)}: the devices that fit "
        f"do not have {len(names)} different values ({seen})"
    )


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
        for unjudged in judged.unjudged:
            say(f"    not judged here, {unjudged}")
    selected = [d for d in verdict.devices if not any(r.startswith(SELECTOR_ORIGINS) for r in d.reasons)]
    for name in sorted({n for d in selected for n in d.device.defaults} - set(verdict.asks)):
        defaults = sorted(
            {show_quantity(d.device.defaults[name]) for d in selected if name in d.device.defaults}
        )
        if defaults:
            short = name.rpartition("/")[2]
            takes = "consumes, and is capped at," if name == BANDWIDTH else "takes"
            say(f"  asks no {short}: {takes} the device's default {' / '.join(defaults)}")


def _explain_scheduled(
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
                    network = (entry.get("data") or {}).get(NETWORK)
                    say(
                        f"{where}: ready, {data.get('interfaceName', '')} "
                        f"{', '.join(data.get('ips') or [])}".rstrip()
                        + _bandwidth_taken(claim, result)
                        + (f", on network {network}" if network else "")
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
        agents = [p for p in snapshot.agent_pods if p.node == node and p.ready]
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


def policed_by(pod: Pod, claims: list[dict[str, Any]], network_policies: list[dict[str, Any]]) -> list[str]:
    """The MultiNetworkPolicies that select the pod on each interface netclaim attached (docs/services.md),
    one line per interface and policy; an interface of a network some policy of the namespace names but
    none selects the pod on is said to be open."""
    interfaces = sorted(
        {
            (
                str((e.get("networkData") or {}).get("interfaceName") or ""),
                str((e.get("data") or {})[NETWORK]),
            )
            for claim in claims
            for e in (claim.get("status") or {}).get("devices") or []
            if e.get("driver") == DRIVER_DOMAIN and isinstance((e.get("data") or {}).get(NETWORK), str)
        }
    )
    policies = [
        p
        for p in (PolicyObject.from_api(found) for found in network_policies)
        if p.namespace == pod.namespace and p.networks
    ]
    lines = []
    for interface, network in interfaces:
        where = f"{interface} (network {network})"
        naming = [p for p in policies if network in p.networks]
        selecting = [p for p in naming if p.spec is None or p.spec.pod_selector.matches(pod.labels)]
        for policy in selecting:
            name = f"{policy.namespace}/{policy.name}"
            if policy.spec is None:
                lines.append(
                    f"policy {name} cannot be read, so it isolates {where} both ways: {policy.problem}"
                )
                continue
            isolated = [
                f"{direction} isolated, {count} rule(s) allow"
                for direction, isolates, count in (
                    ("ingress", policy.spec.isolates_ingress, len(policy.spec.ingress)),
                    ("egress", policy.spec.isolates_egress, len(policy.spec.egress)),
                )
                if isolates
            ]
            lines.append(f"policy {name} selects it on {where}: {'; '.join(isolated)}")
        if naming and not selecting:
            lines.append(f"{where}: open, no MultiNetworkPolicy of the namespace selects the pod")
    return lines


def served_by(pod: Pod, endpoint_slices: list[dict[str, Any]]) -> list[str]:
    """The Services over a network whose endpoints the pod is (docs/services.md), one line per address."""
    lines = []
    for found in endpoint_slices:
        labels = (found.get("metadata") or {}).get("labels") or {}
        for endpoint in found.get("endpoints") or []:
            if (endpoint.get("targetRef") or {}).get("uid") != pod.uid:
                continue
            ready = "ready" if (endpoint.get("conditions") or {}).get("ready") else "not ready"
            lines.append(
                f"serves Service {labels.get(SLICE_SERVICE_NAME)} on network {labels.get(NETWORK)} at "
                f"{', '.join(endpoint.get('addresses') or [])} ({ready})"
            )
    return sorted(lines)


def table(snapshot: Snapshot) -> list[dict[str, Any]]:
    """One row per pod with claims: its state and the first line that says why."""
    rows = []
    for pod in snapshot.pods:
        if not pod.claims:
            continue
        found = explain_pod(pod, snapshot)
        rows.append({"pod": found.pod, "state": found.state, "node": found.node or "-", "why": found.summary})
    return rows


def explain_claim(namespace: str, name: str, snapshot: Snapshot) -> list[Explanation]:
    """The pods that use the claim, explained; a claim no pod uses yet is explained as a pod would see it
    that could go to any node."""
    users = [p for p in snapshot.pods if p.namespace == namespace and name in p.claim_names()]
    if users:
        return [explain_pod(p, snapshot) for p in users]
    standalone = Pod(namespace, f"(no pod uses claim {name})", phase="-", claims=(PodClaim(name, name),))
    return [explain_pod(standalone, snapshot)]
