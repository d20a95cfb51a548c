"""The controller's Lease (coordination.k8s.io/v1), for its leader election (netclaim.runtime.election):
read, made and written conditionally on the resourceVersion read."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from netclaim.adapters.kube.connection import Kind, KubeConnection, raise_for_status, translated
from netclaim.core.objects import as_object
from netclaim.errors import GoneError
from netclaim.runtime.election import LeaseApi, LeaseRecord

JSON = {"Content-Type": "application/json"}
LEASES = Kind("coordination.k8s.io/v1", "Lease", "leases")


class KubeLease(LeaseApi):
    def __init__(self, kube: KubeConnection, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.what = f"Lease {namespace}/{name}"

    async def get_lease(self) -> LeaseRecord | None:
        with contextlib.suppress(GoneError):
            return _record(as_object(await self.kube.read(self.what, LEASES.path(self.namespace, self.name))))
        return None

    async def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        with translated(self.what):
            response = await self.kube.http.post(
                LEASES.path(self.namespace), content=self._body(record), headers=JSON
            )
            raise_for_status(response)
        return _record(as_object(response.json()))

    async def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        with translated(self.what):
            response = await self.kube.http.put(
                LEASES.path(self.namespace, self.name), content=self._body(record), headers=JSON
            )
            raise_for_status(response)
        return _record(as_object(response.json()))

    def _body(self, record: LeaseRecord) -> bytes:
        spec: dict[str, Any] = {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.duration_seconds,
            "leaseTransitions": record.transitions,
        }
        if record.acquired:
            spec["acquireTime"] = record.acquired
        if record.renewed:
            spec["renewTime"] = record.renewed
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.version:
            metadata["resourceVersion"] = record.version
        body = {"apiVersion": LEASES.api_version, "kind": LEASES.name, "metadata": metadata, "spec": spec}
        return json.dumps(body).encode()


def _record(data: dict[str, Any]) -> LeaseRecord:
    spec, meta = as_object(data.get("spec")), as_object(data.get("metadata"))
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        acquired=str(spec.get("acquireTime") or ""),
        renewed=str(spec.get("renewTime") or ""),
        version=str(meta.get("resourceVersion") or ""),
    )
