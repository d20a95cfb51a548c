"""netclaim explain on API objects as the API server returns them: the reason and the fix, in words."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from netclaim.cli import main as cli
from netclaim.cli import report
from netclaim.cli.explain import Explanation, Snapshot, explain_pod, table
from netclaim.cli.fit import clauses, failing_clause, published_devices, show_quantity
from netclaim.core.objects import Pod

SHARED_CLASS = {
    "metadata": {"name": "netclaim-shared"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "netclaim.dev" && '
                    'device.attributes["netclaim.dev"].shared'
                }
            }
        ]
    },
}
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


def nic(
    name: str, if_name: str = "enp0s10", *, shared: bool = True, bandwidth: str = "10Gi"
) -> dict[str, Any]:
    capacity: dict[str, Any] = {"value": bandwidth}
    if shared:
        capacity["requestPolicy"] = {"default": "100Mi", "validRange": {"min": "1Mi"}}
    device: dict[str, Any] = {
        "name": name,
        "attributes": {"ifName": {"string": if_name}, "shared": {"bool": shared}},
        "capacity": {"netclaim.dev/bandwidth": capacity},
    }
    if shared:
        device["allowMultipleAllocations"] = True
    return device


def node_slice(node: str, *devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {"driver": "netclaim.dev", "nodeName": node, "pool": {"name": node}, "devices": list(devices)}
    }


def node(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": spec}


def allocated(name: str, node_name: str, device: str, bandwidth: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "nic", "driver": "netclaim.dev", "pool": node_name, "device": device}
    if bandwidth:
        result["consumedCapacity"] = {"netclaim.dev/bandwidth": bandwidth}
    return {
        "metadata": {"namespace": "demo", "name": name, "uid": f"uid-{name}"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def template(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "demo", "name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}}},
    }


def pending_pod(template_name: str, **spec: Any) -> Pod:
    return Pod.from_api(
        {
            "metadata": {"namespace": "demo", "name": "b-3"},
            "spec": {"resourceClaims": [{"name": "net", "resourceClaimTemplateName": template_name}], **spec},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "message": "0/2 nodes are available: 2 cannot allocate all claims.",
                    }
                ],
            },
        }
    )


def demo_snapshot(request: dict[str, Any], **extra: Any) -> Snapshot:
    """The talks' demo: Pod-A holds node-1's enp0s10 whole (10Gi), two B replicas share node-2's."""
    parts: dict[str, Any] = {
        "pods": [],
        "claims": [
            allocated("a", "node-1", "enp0s10", "10Gi"),
            allocated("b-1", "node-2", "enp0s10", "5Gi"),
            allocated("b-2", "node-2", "enp0s10", "5Gi"),
        ],
        "templates": [template("t", request)],
        "device_classes": [SHARED_CLASS],
        "slices": [
            node_slice("node-1", nic("enp0s10"), nic("enp0s11", "enp0s11")),
            node_slice("node-2", nic("enp0s10")),
        ],
        "nodes": [node("node-1"), node("node-2")],
    }
    parts.update(extra)
    return Snapshot(**parts)


FIVE_GIG = {
    "deviceClassName": "netclaim-shared",
    "selectors": [{"cel": {"expression": ON_ENP0S10}}],
    "capacity": {"requests": {"netclaim.dev/bandwidth": "5Gi"}},
}


def _text(pod: Pod, snapshot: Snapshot) -> str:
    found = explain_pod(pod, snapshot)
    return "\n".join(found.lines + ["FIX: " + f for f in found.fixes])


def test_the_demos_pending_replica_both_enp0s10_nics_are_full() -> None:
    found = explain_pod(pending_pod("t"), demo_snapshot(FIVE_GIG))
    text = "\n".join(found.lines)
    assert "enp0s10 on node-1: does not fit: bandwidth: 0 free of 10Gi, asks 5Gi" in text
    assert "enp0s10 on node-2: does not fit: bandwidth: 0 free of 10Gi, asks 5Gi" in text
    assert "enp0s11 on node-1: does not fit: the request's selector: " in text
    assert found.fixes == [
        "no device has the bandwidth asked for free (enp0s10 on node-1: 0, enp0s10 on node-2: 0): "
        "wait for a claim to end, or add capacity"
    ]
    assert found.fits_on == []


def test_a_smaller_ask_is_named_when_a_nic_has_some_left() -> None:
    snapshot = demo_snapshot(
        FIVE_GIG, claims=[allocated("a", "node-1", "enp0s10", "7Gi")], nodes=[node("node-1")]
    )
    snapshot = Snapshot(**{**snapshot.__dict__, "slices": [node_slice("node-1", nic("enp0s10"))]})
    found = explain_pod(pending_pod("t"), snapshot)
    assert found.fixes == ["enp0s10 on node-1 has 3Gi bandwidth free: ask ≤ 3Gi"]


def test_a_selector_matching_nothing_names_the_failing_clause_and_the_values_there_are() -> None:
    request = {
        **FIVE_GIG,
        "selectors": [
            {
                "cel": {
                    "expression": ON_ENP0S10.replace("enp0s10", "enp9")
                    + ' && device.attributes["netclaim.dev"].shared'
                }
            }
        ],
    }
    found = explain_pod(pending_pod("t"), demo_snapshot(request))
    clause = 'device.attributes["netclaim.dev"].ifName == "enp9"'
    assert all(
        f"the request's selector: `{clause}` is false" in line
        for line in found.lines
        if "does not fit" in line
    )
    assert found.fixes == [f"no device passes `{clause}` is false; published ifName values: enp0s10, enp0s11"]


def test_a_missing_device_class_is_named_with_the_ones_there_are() -> None:
    found = explain_pod(pending_pod("t"), demo_snapshot({**FIVE_GIG, "deviceClassName": "netclaim-fast"}))
    assert "DeviceClass 'netclaim-fast' does not exist (there are: netclaim-shared)" in "\n".join(found.lines)
    assert found.fixes == ["create DeviceClass 'netclaim-fast' or name an existing one in request nic"]


def test_a_node_selector_that_excludes_the_only_nic_with_room() -> None:
    snapshot = demo_snapshot(FIVE_GIG, claims=[allocated("a", "node-1", "enp0s10", "10Gi")])
    pod = pending_pod("t", nodeSelector={"kubernetes.io/hostname": "node-1"})
    text = _text(pod, snapshot)
    assert "node node-2: the pod's nodeSelector kubernetes.io/hostname=node-1 excludes it" in text
    assert "enp0s10 on node-2: fits (10Gi bandwidth free)" in text
    assert "FIX: no device has the bandwidth asked for free (enp0s10 on node-1: 0)" in text


def test_an_untolerated_taint_and_a_cordon_keep_a_node_out() -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    snapshot = demo_snapshot(
        FIVE_GIG, claims=[], nodes=[node("node-1", taints=[taint]), node("node-2", unschedulable=True)]
    )
    text = _text(pending_pod("t"), snapshot)
    assert "node node-1: taint dedicated=gpu:NoSchedule is not tolerated" in text
    assert "node node-2: the node is cordoned (unschedulable)" in text
    assert "which the pod may not use: change its node selection or tolerations" in text
    tolerated = pending_pod("t", tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert explain_pod(tolerated, snapshot).fits_on == ["node-1"]


def test_a_nic_whose_link_is_down_is_named_with_its_taint_unless_the_request_tolerates_it() -> None:
    down = {
        **nic("enp0s10"),
        "taints": [
            {"key": "netclaim.dev/link-down", "effect": "NoSchedule", "timeAdded": "2026-12-02T22:00:00Z"}
        ],
    }
    snapshot = demo_snapshot(FIVE_GIG, claims=[], nodes=[node("node-1")])
    snapshot = Snapshot(**{**snapshot.__dict__, "slices": [node_slice("node-1", down)]})
    text = _text(pending_pod("t"), snapshot)
    assert (
        "enp0s10 on node-1: does not fit: tainted netclaim.dev/link-down (NoSchedule) since "
        "2026-12-02T22:00:00Z: its link is down, and the request does not tolerate it"
    ) in text, text
    tolerant = {**FIVE_GIG, "tolerations": [{"key": "netclaim.dev/link-down", "operator": "Exists"}]}
    snapshot = Snapshot(**{**snapshot.__dict__, "templates": [template("t", tolerant)]})
    assert explain_pod(pending_pod("t"), snapshot).fits_on == ["node-1"]


def test_a_request_without_bandwidth_is_told_it_gets_the_default() -> None:
    request = {k: v for k, v in FIVE_GIG.items() if k != "capacity"}
    found = explain_pod(pending_pod("t"), demo_snapshot(request, claims=[]))
    assert "  asks no bandwidth: consumes, and is capped at, the device's default 100Mi" in found.lines
    assert found.fits_on == ["node-1", "node-2"]


def test_an_exclusive_nic_held_by_another_claim() -> None:
    request = {"deviceClassName": "netclaim-whole"}
    whole = {
        "metadata": {"name": "netclaim-whole"},
        "spec": {"selectors": [{"cel": {"expression": '!device.attributes["netclaim.dev"].shared'}}]},
    }
    snapshot = demo_snapshot(
        request,
        device_classes=[whole],
        slices=[node_slice("node-1", nic("enp0s12", "enp0s12", shared=False))],
        nodes=[node("node-1")],
        claims=[allocated("x", "node-1", "enp0s12", None)],
    )
    found = explain_pod(pending_pod("t"), snapshot)
    assert "  enp0s12 on node-1: does not fit: taken whole by demo/x" in found.lines
    assert found.fixes == [
        "enp0s12 on node-1 is taken whole by demo/x: wait for it, or use a shared DeviceClass"
    ]


def test_an_exhausted_ip_pool() -> None:
    pool_device = {
        "name": "tiny",
        "attributes": {"netclaim.dev/pool": {"string": "tiny"}},
        "capacity": {"netclaim.dev/addresses": {"value": "2", "requestPolicy": {"default": "1"}}},
        "allowMultipleAllocations": True,
    }
    pools = {
        "spec": {
            "driver": "netclaim.dev",
            "allNodes": True,
            "pool": {"name": "netclaim.dev/ip-pools"},
            "devices": [pool_device],
        }
    }
    address_class = {"metadata": {"name": "netclaim-address"}, "spec": {}}
    holders = []
    for name in ("p", "q"):
        claim = allocated(name, "node-1", "tiny", None)
        claim["status"]["allocation"]["devices"]["results"][0].update(
            pool="netclaim.dev/ip-pools", consumedCapacity={"netclaim.dev/addresses": "1"}
        )
        holders.append(claim)
    snapshot = demo_snapshot(
        {"deviceClassName": "netclaim-address"},
        device_classes=[address_class],
        slices=[pools],
        claims=holders,
    )
    found = explain_pod(pending_pod("t"), snapshot)
    assert "  IPPool tiny: does not fit: addresses: 0 free of 2, asks 1" in found.lines
    assert "  asks no addresses: takes the device's default 1" in found.lines
    assert found.fixes == [
        "no device has the addresses asked for free (IPPool tiny: 0): "
        "wait for a claim to end, or add capacity"
    ]


def _scheduled(claim_status: dict[str, Any]) -> tuple[Pod, dict[str, Any]]:
    pod = Pod.from_api(
        {
            "metadata": {"namespace": "demo", "name": "p"},
            "spec": {"nodeName": "node-1", "resourceClaims": [{"name": "net", "resourceClaimName": "c"}]},
            "status": {"phase": "Pending"},
        }
    )
    result = {"request": "nic", "driver": "netclaim.dev", "pool": "node-1", "device": "enp0s10"}
    claim = {
        "metadata": {"namespace": "demo", "name": "c", "uid": "uid-c"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [result]}}, **claim_status},
    }
    return pod, claim


def test_a_config_refused_at_prepare_is_reported_from_the_claims_status() -> None:
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "PrepareFailed",
        "message": "config.plugins[0].master: 'eth0' is not the allocated device's interface",
    }
    pod, claim = _scheduled(
        {
            "devices": [
                {"driver": "netclaim.dev", "pool": "node-1", "device": "enp0s10", "conditions": [condition]}
            ]
        }
    )
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim]))
    assert (
        "claim c, request nic: enp0s10: PrepareFailed: "
        "config.plugins[0].master: 'eth0' is not the allocated device's interface" in found.lines
    )
    assert found.fixes == ["fix the config of claim c as the message says; the pod is retried"]


def test_a_pod_that_fits_but_waits_for_an_agent_taken_off_its_node() -> None:
    pod, claim = _scheduled({})
    disabled = node("node-1")
    disabled["metadata"]["labels"]["netclaim.dev/agent"] = "disabled"
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim], nodes=[disabled]))
    assert "claim c, request nic: enp0s10: allocated; the agent has not reported on it" in found.lines
    assert (
        "no netclaim agent is Ready on node-1 (the node is labelled netclaim.dev/agent=disabled): "
        "the pod waits for it (fail closed)" in found.lines
    )
    assert found.fixes == ["start the agent on node-1: kubectl label node node-1 netclaim.dev/agent-"]
    ready_agent = Pod.from_api(
        {"spec": {"nodeName": "node-1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim], agent_pods=[ready_agent]))
    assert found.fixes == []


def _attached_entry() -> dict[str, Any]:
    """The claim's status entry of an interface the agent attached: net1 with 10.64.7.5/24 on enp0s10."""
    return {
        "driver": "netclaim.dev",
        "pool": "node-1",
        "device": "enp0s10",
        "conditions": [{"type": "Ready", "status": "True", "reason": "InterfaceAttached"}],
        "networkData": {"interfaceName": "net1", "ips": ["10.64.7.5/24"]},
    }


def test_a_pod_on_a_network_says_which_and_the_services_it_serves_there() -> None:
    entry = {**_attached_entry(), "data": {"netclaim.dev/network": "lan3"}}
    pod, claim = _scheduled({"devices": [entry]})
    pod = replace(pod, uid="uid-p")
    labels = {"kubernetes.io/service-name": "db", "netclaim.dev/network": "lan3"}

    def endpoint(uid: str, address: str, ready: bool) -> dict[str, Any]:
        return {"addresses": [address], "conditions": {"ready": ready}, "targetRef": {"uid": uid}}

    listed = [
        {
            "metadata": {"labels": labels},
            "endpoints": [endpoint("uid-p", "10.64.7.5", True), endpoint("x", "10.64.7.6", True)],
        },
        {"metadata": {"labels": labels}, "endpoints": [endpoint("uid-p", "fd00:647::5", False)]},
    ]
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim], endpoint_slices=listed))
    assert "claim c, request nic: enp0s10: ready, net1 10.64.7.5/24, on network lan3" in found.lines
    assert found.lines[-2:] == [
        "serves Service db on network lan3 at 10.64.7.5 (ready)",
        "serves Service db on network lan3 at fd00:647::5 (not ready)",
    ]


def test_a_pod_on_a_network_says_which_policies_select_it_on_which_interface() -> None:
    entry = {
        "driver": "netclaim.dev",
        "pool": "node-1",
        "device": "enp0s10",
        "conditions": [{"type": "Ready", "status": "True", "reason": "InterfaceAttached"}],
        "networkData": {"interfaceName": "net1", "ips": ["10.64.7.5/24"]},
        "data": {"netclaim.dev/network": "lan3"},
    }
    pod, claim = _scheduled({"devices": [entry]})
    pod = replace(pod, labels={"app": "db"})

    def policy(
        name: str, spec: Any, networks: str = "netclaim.dev/lan3", namespace: str = ""
    ) -> dict[str, Any]:
        annotations = {"k8s.v1.cni.cncf.io/policy-for": networks}
        meta = {"namespace": namespace or pod.namespace, "name": name, "annotations": annotations}
        return {"metadata": meta, "spec": spec}

    listed = [
        policy("deny", {"podSelector": {"matchLabels": {"app": "db"}}}),
        policy(
            "both",
            {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{}],
                "egress": [{}, {}],
            },
        ),
        policy("web-only", {"podSelector": {"matchLabels": {"app": "web"}}}),
        policy("multus", {"podSelector": {}}, networks="default/macvlan"),  # Multus's, not ours
        policy("elsewhere", {"podSelector": {}}, namespace="other"),
        policy("broken", {"podSelector": {"matchLabels": {"app": "db"}}, "ingres": []}),
    ]
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim], network_policies=listed))
    said = [line for line in found.lines if "policy" in line or "open" in line]
    assert said[:2] == [
        "policy demo/deny selects it on net1 (network lan3): ingress isolated, 0 rule(s) allow",
        "policy demo/both selects it on net1 (network lan3): ingress isolated, 1 rule(s) allow; "
        "egress isolated, 2 rule(s) allow",
    ]
    assert said[2].startswith(
        "policy demo/broken cannot be read, so it isolates net1 (network lan3) both ways"
    )
    assert "spec.ingres" in said[2] and len(said) == 3

    alone = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim], network_policies=listed[2:3]))
    assert "net1 (network lan3): open, no MultiNetworkPolicy of the namespace selects the pod" in alone.lines
    none = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim]))
    assert not [line for line in none.lines if "policy" in line.lower() or "open" in line]


def test_a_namespace_table_has_a_row_per_pod_with_claims() -> None:
    plain = Pod.from_api(
        {"metadata": {"namespace": "demo", "name": "plain"}, "spec": {}, "status": {"phase": "Running"}}
    )
    snapshot = demo_snapshot(FIVE_GIG, pods=[pending_pod("t"), plain])
    assert table(snapshot) == [
        {
            "pod": "demo/b-3",
            "state": "Pending",
            "node": "-",
            "why": "no device has the bandwidth asked for free (enp0s10 on node-1: 0, enp0s10 on node-2: 0): "
            "wait for a claim to end, or add capacity",
        }
    ]


@pytest.mark.parametrize(
    ("expression", "parts"),
    [
        ("a && b", ["a", "b"]),
        ('x == "a && b" && (c && d)', ['x == "a && b"', "(c && d)"]),
        ("f(a && b, [c && d]) && e", ["f(a && b, [c && d])", "e"]),
        ("a || b", ["a || b"]),
    ],
)
def test_clauses_split_only_at_the_top_level(expression: str, parts: list[str]) -> None:
    assert clauses(expression) == parts


def test_a_clause_on_an_attribute_the_device_lacks_says_so() -> None:
    [device] = published_devices([node_slice("node-1", nic("enp0s10"))])
    reason = failing_clause('device.attributes["netclaim.dev"].speed > 1000', device)
    assert reason is not None and "is false (the device has no attribute" in reason
    assert failing_clause(ON_ENP0S10, device) is None


def test_status_rows_follow_each_pod_to_its_interfaces_and_nic_rows_count_the_capacity() -> None:
    claim = allocated("a", "node-1", "enp0s10", "10Gi")
    claim["status"]["devices"] = [
        {
            "driver": "netclaim.dev",
            "pool": "node-1",
            "device": "enp0s10",
            "conditions": [{"type": "Ready", "status": "True", "reason": "InterfaceAttached"}],
            "networkData": {
                "interfaceName": "net1",
                "ips": ["10.10.1.2/24"],
                "hardwareAddress": "02:00:00:00:00:01",
            },
        }
    ]
    pod = Pod.from_api(
        {
            "metadata": {"namespace": "demo", "name": "pod-a"},
            "spec": {
                "nodeName": "node-1",
                "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "t"}],
            },
            "status": {
                "phase": "Running",
                "resourceClaimStatuses": [{"name": "net", "resourceClaimName": "a"}],
            },
        }
    )
    others = [allocated("b-1", "node-2", "enp0s10", "5Gi"), allocated("b-2", "node-2", "enp0s10", "5Gi")]
    snapshot = demo_snapshot(FIVE_GIG, pods=[pod, pending_pod("t")], claims=[claim, *others])
    assert report.status_rows(snapshot) == [
        {
            "pod": "pod-a",
            "phase": "Running",
            "node": "node-1",
            "claim": "a",
            "request": "nic",
            "device": "enp0s10",
            "bandwidth": "10Gi",
            "interface": "net1",
            "ips": "10.10.1.2/24",
            "mac": "02:00:00:00:00:01",
            "ready": "True",
        },
        {"pod": "b-3", "phase": "Pending", "node": "(Pending)", "claim": "-", "request": "-", "device": "-",
         "bandwidth": "-", "interface": "-", "ips": "-", "mac": "-", "ready": "not allocated"},
    ]  # fmt: skip
    nics = {(r["node"], r["ifName"]): r for r in report.nic_rows(snapshot)}
    assert nics[("node-1", "enp0s10")]["capacity"] == "bandwidth 10Gi/10Gi used, 0 free"
    assert nics[("node-2", "enp0s10")]["holders"] == "2"
    assert nics[("node-1", "enp0s11")]["capacity"] == "bandwidth 0/10Gi used, 10Gi free"


def test_a_10_gbe_nic_shows_as_10g_and_counts_as_numbers() -> None:
    assert show_quantity(Decimal(10**10)) == "10G"
    assert show_quantity(Decimal(5 * 2**30)) == "5Gi"
    assert show_quantity(Decimal(1024)) == "1024"  # 1,024 addresses, not 1Ki


def test_tables_are_coloured_only_when_asked() -> None:
    rows = [{"pod": "a", "state": "Pending"}, {"pod": "b", "state": "Running"}]
    assert report.render_table(rows) == "POD  STATE\na    Pending\nb    Running\n"
    coloured = report.render_table(rows, color=True).splitlines()
    assert coloured[1].startswith(report.RED) and coloured[2].startswith(report.GREEN)
    assert not report.use_color(io.StringIO())


def test_kubectl_netclaim_refuses_a_target_it_cannot_explain(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_snapshot", lambda args: demo_snapshot(FIVE_GIG, pods=[pending_pod("t")]))
    assert cli.kubectl_main(["explain", "deployment/x"]) == 2
    assert "'deployment/x': expected pod/NAME or claim/NAME" in capsys.readouterr().err
    assert cli.kubectl_main(["explain", "pod/b-3", "-n", "demo", "-o", "json"]) == 0
    [found] = json.loads(capsys.readouterr().out)
    assert found["pod"] == "demo/b-3" and found["fixes"]
    assert cli.kubectl_main(["explain", "claim/nope", "-n", "demo"]) == 2
    assert "claim demo/nope not found" in capsys.readouterr().err


# the scheduler's own arithmetic and rules (k8s.io/dynamic-resource-allocation, consumable_capacity.go)


def _one_nic(device: dict[str, Any], request: dict[str, Any], **extra: Any) -> Explanation:
    parts: dict[str, Any] = {
        "claims": [],
        "slices": [node_slice("node-1", device)],
        "nodes": [node("node-1")],
        **extra,
    }
    return explain_pod(pending_pod("t"), demo_snapshot(request, **parts))


def test_capacity_names_are_matched_exactly_as_the_scheduler_does() -> None:
    found = _one_nic(nic("enp0s10"), {**FIVE_GIG, "capacity": {"requests": {"bandwidth": "5Gi"}}})
    assert (
        "  enp0s10 on node-1: does not fit: has no capacity bandwidth (it publishes: netclaim.dev/bandwidth)"
        in found.lines
    )


def test_an_exclusive_nic_is_checked_against_what_is_asked() -> None:
    whole = {"metadata": {"name": "whole"}, "spec": {}}
    request = {"deviceClassName": "whole", "capacity": {"requests": {"netclaim.dev/bandwidth": "40G"}}}
    found = _one_nic(nic("enp7s0", "enp7s0", shared=False, bandwidth="10G"), request, device_classes=[whole])
    assert "  enp7s0 on node-1: does not fit: bandwidth: has 10G, asks 40G" in found.lines


def test_an_ask_is_rounded_up_to_the_policy_before_it_is_compared() -> None:
    device = nic("enp0s10")
    device["capacity"]["netclaim.dev/bandwidth"]["requestPolicy"] = {
        "default": "1Gi",
        "validRange": {"min": "1Gi", "step": "1Gi"},
    }
    holder = allocated("a", "node-1", "enp0s10", "9728Mi")  # 512Mi left
    found = _one_nic(
        device, {**FIVE_GIG, "capacity": {"requests": {"netclaim.dev/bandwidth": "500Mi"}}}, claims=[holder]
    )
    assert (
        "  enp0s10 on node-1: does not fit: bandwidth: 512Mi free of 10Gi, asks 1Gi (500Mi rounded up)"
        in found.lines
    )


def test_a_capacity_without_policy_or_ask_is_consumed_whole() -> None:
    device = nic("enp0s10")
    del device["capacity"]["netclaim.dev/bandwidth"]["requestPolicy"]
    holder = allocated("a", "node-1", "enp0s10", "1Gi")
    request = {k: v for k, v in FIVE_GIG.items() if k != "capacity"}
    found = _one_nic(device, request, claims=[holder])
    assert "  enp0s10 on node-1: does not fit: bandwidth: 9Gi free of 10Gi, asks 10Gi" in found.lines


def test_an_admin_access_allocation_takes_nothing() -> None:
    watcher = allocated("monitor", "node-1", "enp0s10", None)
    watcher["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    assert _one_nic(nic("enp0s10"), FIVE_GIG, claims=[watcher]).fits_on == ["node-1"]


def test_an_allocated_claim_keeps_the_pod_on_the_nodes_its_devices_are_on() -> None:
    pinned = allocated("a", "node-1", "enp0s10", "1Gi")
    pinned["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
        ]
    }
    held = {"name": "held", "resourceClaimName": "a"}
    pod = pending_pod("t", resourceClaims=[{"name": "net", "resourceClaimTemplateName": "t"}, held])
    snapshot = demo_snapshot(
        FIVE_GIG,
        claims=[pinned],
        slices=[node_slice("node-1", nic("enp0s10", bandwidth="5Gi")), node_slice("node-2", nic("enp0s10"))],
    )
    found = explain_pod(pod, snapshot)
    assert "node node-2: claim a is allocated to devices this node does not reach" in found.lines
    # its 1Gi on node-1's NIC counts too: 4Gi left of 5Gi, the request asks 5Gi
    assert "  enp0s10 on node-1: does not fit: bandwidth: 4Gi free of 5Gi, asks 5Gi" in found.lines
    assert found.fits_on == []


def test_first_available_fits_when_any_alternative_does() -> None:
    request = {
        "name": "nic",
        "firstAvailable": [
            {
                "name": "fast",
                "deviceClassName": "netclaim-shared",
                "selectors": [{"cel": {"expression": ON_ENP0S10}}],
                "capacity": {"requests": {"netclaim.dev/bandwidth": "5Gi"}},
            },
            {"name": "any", "deviceClassName": "netclaim-shared"},
        ],
    }
    snapshot = demo_snapshot({})
    snapshot.templates[0]["spec"]["spec"]["devices"]["requests"] = [request]
    found = explain_pod(pending_pod("t"), snapshot)
    assert any(line.startswith("claim net (template t), request nic/fast") for line in found.lines)
    assert found.fits_on == ["node-1"]  # node-1's enp0s11 serves the second alternative
    assert not any("DeviceClass ''" in line for line in found.lines)


def test_a_slice_for_some_nodes_reaches_only_them() -> None:
    racked = node_slice("node-1", nic("enp0s10"))
    del racked["spec"]["nodeName"]
    racked["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]
    }
    assert _one_nic(nic("x"), FIVE_GIG, slices=[racked], nodes=[node("node-1"), node("node-2")]).fits_on == []
    in_rack = node("node-2")
    in_rack["metadata"]["labels"]["rack"] = "r1"
    assert _one_nic(nic("x"), FIVE_GIG, slices=[racked], nodes=[node("node-1"), in_rack]).fits_on == [
        "node-2"
    ]


def test_a_selector_cel_here_cannot_evaluate_does_not_count_the_device_out() -> None:
    request = {
        **FIVE_GIG,
        "selectors": [
            {
                "cel": {
                    "expression": 'device.capacity["netclaim.dev"].bandwidth.compareTo(quantity("1G")) >= 0'
                }
            }
        ],
    }
    found = _one_nic(nic("enp0s10"), request)
    assert found.fits_on == ["node-1"]
    assert any(line.startswith("    not judged here, the request's selector:") for line in found.lines)


def test_slices_of_an_older_pool_generation_are_ignored() -> None:
    old = node_slice("node-1", nic("gone", "gone"))
    old["spec"]["pool"]["generation"] = 1
    new = node_slice("node-1", nic("enp0s10"))
    new["spec"]["pool"]["generation"] = 2
    assert [d.name for d in published_devices([old, new])] == ["enp0s10"]


def test_what_the_reader_may_not_list_is_said() -> None:
    snapshot = demo_snapshot(FIVE_GIG, unreadable=["Node (cluster)"])
    assert (
        "could not read Node (cluster) (RBAC): what follows may be incomplete"
        in explain_pod(pending_pod("t"), snapshot).lines
    )


GPU_CLASS = {
    "metadata": {"name": "gpu.example.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
}
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def _on_root(device: dict[str, Any], root: str) -> dict[str, Any]:
    return {**device, "attributes": {**device["attributes"], PCIE_ROOT: {"string": root}}}


def _gpus(node_name: str, *roots: str) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {PCIE_ROOT: {"string": r}}} for i, r in enumerate(roots)]
    spec = {
        "driver": "gpu.example.com",
        "nodeName": node_name,
        "pool": {"name": node_name},
        "devices": devices,
    }
    return {"spec": spec}


def test_a_pair_that_fits_alone_but_not_on_one_pcie_root_names_the_constraint() -> None:
    aligned = {
        "metadata": {"namespace": "demo", "name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
                        {"name": "nic", "exactly": {"deviceClassName": "netclaim-shared"}},
                    ],
                    "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}],
                }
            }
        },
    }
    snapshot = Snapshot(
        pods=[],
        claims=[],
        templates=[aligned],
        device_classes=[SHARED_CLASS, GPU_CLASS],
        slices=[
            node_slice("node-1", _on_root(nic("enp0s10"), "pci0000:d7")),
            _gpus("node-1", "pci0000:3a"),
            node_slice("node-2", _on_root(nic("enp0s10"), "pci0000:3a")),
            _gpus("node-2", "pci0000:3a"),
        ],
        nodes=[node("node-1"), node("node-2")],
    )
    found = explain_pod(pending_pod("t"), snapshot)
    assert (
        "node node-1: claim net (template t): constraint matchAttribute resource.kubernetes.io/pcieRoot of "
        "requests gpu, nic: no devices that fit share a value (gpu: pci0000:3a; nic: pci0000:d7)"
    ) in found.lines
    assert found.fits_on == ["node-2"]
    snapshot.slices[2:] = []  # node-2 gone: nothing fits, and the fix says why
    found = explain_pod(pending_pod("t"), snapshot)
    assert found.fits_on == []
    assert found.fixes == [
        "every request fits alone, but not together: on node-1, claim net (template t): constraint "
        "matchAttribute resource.kubernetes.io/pcieRoot of requests gpu, nic: no devices that fit share a "
        "value (gpu: pci0000:3a; nic: pci0000:d7)"
    ]


def test_two_nic_requests_that_must_be_on_different_pci_devices_name_the_distinct_constraint() -> None:
    two = {"deviceClassName": "netclaim-shared"}
    spread = {
        "metadata": {"namespace": "demo", "name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "a", "exactly": two}, {"name": "b", "exactly": two}],
                    "constraints": [{"distinctAttribute": "resource.kubernetes.io/pciBusID"}],
                }
            }
        },
    }
    on_bus = {"resource.kubernetes.io/pciBusID": {"string": "0000:5e:00.0"}}
    one_nic = {**nic("enp0s10"), "attributes": {**nic("enp0s10")["attributes"], **on_bus}}
    snapshot = Snapshot(
        pods=[],
        claims=[],
        templates=[spread],
        device_classes=[SHARED_CLASS],
        slices=[node_slice("node-1", one_nic)],
        nodes=[node("node-1")],
    )
    found = explain_pod(pending_pod("t"), snapshot)
    assert (
        "node node-1: claim net (template t): constraint distinctAttribute "
        "resource.kubernetes.io/pciBusID of requests a, b: the devices that fit do not have 2 different "
        "values (a: 0000:5e:00.0; b: 0000:5e:00.0)"
    ) in found.lines
    assert found.fits_on == []


def test_a_ready_pod_says_the_bandwidth_it_holds_and_loudly_when_it_is_the_nics_default() -> None:
    pod, claim = _scheduled({"devices": [_attached_entry()]})
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {
        "netclaim.dev/bandwidth": "100Mi"
    }
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim]))
    assert (
        "claim c, request nic: enp0s10: ready, net1 10.64.7.5/24, bandwidth 100Mi "
        "(the NIC's default: the claim asks for none, and is capped at it)" in found.lines
    ), found.lines
    claim["spec"] = {
        "devices": {
            "requests": [
                {"name": "nic", "exactly": {"capacity": {"requests": {"netclaim.dev/bandwidth": "100Mi"}}}}
            ]
        }
    }
    found = explain_pod(pod, demo_snapshot(FIVE_GIG, claims=[claim]))
    assert "claim c, request nic: enp0s10: ready, net1 10.64.7.5/24, bandwidth 100Mi" in found.lines
