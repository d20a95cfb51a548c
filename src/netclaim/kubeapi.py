"""What the core asks of the Kubernetes API, one role at a time: the interfaces it depends on.

configure/, ipam/ and publish/ (and the controller's reconciler) see the API server only through these
Protocols, never through the HTTP client: the Kubernetes adapter (netclaim.adapters.kube) implements each
role over one shared connection, and the unit tests hand in one fake that plays every role
(tests/unit/fakes.py). Who uses which:

- ClaimsApi: the agent reads a claim at prepare, writes its status.devices, the pod's network-status
  annotation and Events on pods; the controller lists every claim and warns the pods that wait.
- SlicesApi: the agent publishes its node's ResourceSlices; the controller the IP pools' slices, and looks
  for the DeviceClasses of restricted pools.
- AddressesApi: the agent takes and releases its claims' addresses; the controller frees the addresses of
  claims that are gone and writes each IPPool's status.

Every call raises netclaim's errors (netclaim.errors): GoneError (the object is gone), ConflictError (it
changed since it was read), AlreadyExistsError, ApiUnavailableError (retry later), ApiRejectedError
(refused: RBAC, admission, a kind the server does not serve), ConfigError (it cannot be read). What a list
cannot read of one object is left out (or read in part, for a claim) and reported by the adapter: it never
fails the list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from netclaim.objects import Claim, IPAllocation, Pod, Slice


class ClaimsApi(Protocol):
    """ResourceClaims, and the pods that use them."""

    async def get_claim(self, namespace: str, name: str) -> Claim:
        """ConfigError when not even its identity can be read; what was read only in part: Claim.problems."""

    async def list_claims(self) -> list[Claim]:
        """Every ResourceClaim of the cluster; one read only in part is listed with what was read."""

    async def write_claim_devices(self, claim: Claim, driver: str, entries: list[dict[str, Any]]) -> None:
        """Replace `driver`'s entries of the claim's `status.devices` as read by `entries` (ConflictError
        when the claim changed since); other drivers' entries stay as they are."""

    async def get_pod(self, namespace: str, name: str) -> Pod: ...

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        """Set one annotation on the pod as read (ConflictError when the pod changed since)."""

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: str, message: str
    ) -> None:
        """A Warning Event on the pod, its message cut to what the API takes."""

    async def unschedulable_pods(self) -> list[Pod]:
        """Pending pods the scheduler could not place."""


class SlicesApi(Protocol):
    """The ResourceSlices netclaim publishes, what owns them, and the classes that select their devices."""

    async def list_slices(self, node: str, driver: str) -> list[Slice]:
        """The slices of `driver` on `node`."""

    async def list_driver_slices(self, driver: str, pool: str) -> list[Slice]:
        """The slices of `driver`'s pool `pool` (a pool of no node: the IP pools' devices)."""

    async def apply_slice(self, body: dict[str, Any]) -> None:
        """Write the slice as `body` says (server-side apply, taking every field: netclaim owns it)."""

    async def delete_slice(self, name: str) -> None:
        """Delete a slice; one already gone is fine."""

    def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        """The event types (ADDED, MODIFIED, DELETED) of this node's slices, as they happen; an end of the
        watch the caller must start afresh from is ApiUnavailableError."""

    async def node_uid(self, node: str) -> str: ...

    async def crd_uid(self, name: str) -> str:
        """The UID of CustomResourceDefinition `name` (the owner of what exists only with it)."""

    async def device_class_exists(self, name: str) -> bool: ...


class AddressesApi(Protocol):
    """IPPools, and the IPAllocations that hold their addresses."""

    async def get_ippool(self, name: str) -> dict[str, Any]:
        """The IPPool as the API has it (ConfigError when it cannot be read)."""

    async def list_ippools(self) -> list[dict[str, Any]]:
        """Every IPPool as the API has it; one that cannot be read is left out."""

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        """Replace the pool's whole status: nothing stale is kept."""

    async def list_ip_allocations(
        self, *, pool: str | None = None, claim_uid: str | None = None
    ) -> list[IPAllocation]:
        """The IPAllocations (of `pool`, of claim `claim_uid`); one that cannot be read is left out: it is
        neither counted as held nor freed."""

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        """ConfigError when it cannot be read."""

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        """Take the address: AlreadyExistsError when another claim (or this one, earlier) holds it."""

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        """Release the address, only if the object is still the one read (same UID); gone already is fine."""
