"""Nothing of a pod stays once it is gone: after a warm-up round, one more round of eight pods with a NIC
each, created and deleted, leaves the nodes' links, the tenant IPAM's reservations, the agents' state rows,
the claims' status entries and the agents' open files as they were (`make soak`: 1,000 such cycles)."""

from __future__ import annotations

import io

from netclaim_lab.benchmarks import soak
from netclaim_lab.cluster import ClusterHandle


def test_pods_that_come_and_go_leave_nothing_behind(cluster: ClusterHandle) -> None:
    out = io.StringIO()
    before, after = soak.run(cluster, ["node-1", "node-2"], rounds=1, pods=8, out=out)
    leaks = soak.report(before, after, cycles=8, out=out)
    print(out.getvalue())
    assert leaks == {
        "links": 0,
        "ip reservations": 0,
        "state rows": 0,
        "status entries": 0,
        "file descriptors": 0,
    }, out.getvalue()
