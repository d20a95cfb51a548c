"""A short soak inside `make test` (the long one is `make soak`): nothing leaks over repeated pod churn."""

from __future__ import annotations

import io

from netclaim_lab.benchmarks import soak
from netclaim_lab.cluster import ClusterHandle


def test_repeated_pod_churn_leaks_nothing(cluster: ClusterHandle) -> None:
    out = io.StringIO()
    before, after = soak.run(cluster, ["node-1", "node-2"], rounds=2, pods=8, out=out)
    leaks = soak.report(before, after, cycles=16, out=out)
    print(out.getvalue())
    assert leaks == {
        "links": 0,
        "ip reservations": 0,
        "state rows": 0,
        "status entries": 0,
        "file descriptors": 0,
    }, out.getvalue()
