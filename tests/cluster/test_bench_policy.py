"""A small `make bench-policy` inside `make test`: 12 pods and 6 MultiNetworkPolicies. Every pod's table
comes, each holds the two allow rules its policy makes (its peers in one set), a relabelled peer reaches
exactly the tables it should, and no agent failed to apply one. The figures are printed, not asserted."""

from __future__ import annotations

import io

from netclaim_lab.benchmarks import policy_scale
from netclaim_lab.cluster import ClusterHandle


def test_policies_at_a_small_scale_reach_every_pods_table(cluster: ClusterHandle) -> None:
    out = io.StringIO()
    figures = policy_scale.run(cluster, pods=12, policies=6, out=out)
    print(out.getvalue())
    assert figures["rules_per_pod"] == 2, figures  # TCP 8080 from the role's pods, TCP 9090 from a /24
    assert figures["relabel_tables"] == 3, figures  # p-1, p-6, p-7: selected by policies 0 and 1
    assert figures["agent_failures"] == 0, figures
