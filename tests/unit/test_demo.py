"""The demo's set-up order: no pod is created before the controller has published the IP pool, or every
pod is unschedulable for a moment and the demo takes that moment for its outcome."""

from __future__ import annotations

from typing import Any, cast

from netclaim_lab import demo
from netclaim_lab.cluster import ClusterHandle


class RecordingHandle:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def kubectl(self, *args: str, **_: Any) -> str:
        self.calls.append(args)
        return "serviceaccount/default"


def test_pods_are_created_only_after_the_pool_is_ready() -> None:
    handle = RecordingHandle()
    demo.apply(cast(ClusterHandle, handle))
    calls = handle.calls
    pool_applied = calls.index(("apply", "-f", str(demo.EXAMPLES / "ippool.yaml")))
    pool_ready = next(i for i, call in enumerate(calls) if call[:2] == ("wait", "--for=condition=Ready"))
    first_pod = min(i for i, call in enumerate(calls) if call[0] == "apply" and "-n" in call)
    assert pool_applied < pool_ready < first_pod
    assert calls[pool_ready][2] == f"ippool/{demo.POOL}"
