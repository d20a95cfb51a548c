"""What the core asks of the Kubernetes API, one role at a time, each program its own: the interfaces the
agent and the controller depend on.

configure/, ipam/ and publish/ (and the controller's reconciler) see the API server only through these
Protocols, never through the HTTP client: the Kubernetes adapter (netclaim.adapters.kube) implements them
over one shared connection, a class per kind of object playing both programs' roles of it, and the unit
tests hand in one fake that plays every role (tests/unit/fakes.py). Each program's roles hold only what it
calls, which is what its RBAC grants it (deploy/rbac.yaml; tests/unit/test_kube_roles.py checks it):

the agent (one per node)
- ClaimsApi: reads a claim kubelet names, writes its status.devices and Warning Events on pods;
- PodAnnotationsApi: the pods' network-status annotation, only when that is turned on;
- NodeSlicesApi: publishes its node's ResourceSlices, watches them, and asks its Node's UID (their owner);
- AddressesApi: takes and releases its claims' addresses (IPPools read, IPAllocations made and deleted);
- PreflightApi: its own identity and a dry-run slice, before it starts (`netclaim preflight`).

the controller (one per cluster)
- ClusterClaimsApi: lists and watches every claim, and warns the Pending pods that wait for a full pool;
- PoolSlicesApi: publishes the IP pools' slice, owned by the IPPool CRD, and looks for the DeviceClasses
  of restricted pools;
- IPPoolsApi: frees the addresses of claims that are gone, writes each IPPool's status, watches both;
- PoolParamsApi: keeps the parameters of admission policy netclaim-pool-namespaces, ConfigMaps of its own
  namespace, one per restricted IPPool;
- NetworkServicesApi: reads the Services over a netclaim network, their pods and claims, and keeps their
  EndpointSlices.

What both programs ask alike is a role of its own that both extend: PodEventsApi, SliceStoreApi (what the
one slice writer needs, netclaim.core.devices.slices), AddressRecordsApi. The operator tools read with the
adapter's reader (netclaim.cli.read), no role of the core.

Every call raises netclaim's errors (netclaim.errors): GoneError (the object is gone), ConflictError (it
changed since it was read), AlreadyExistsError, ApiUnavailableError (retry later), ApiRejectedError
(refused: RBAC, admission, a kind the server does not serve), ConfigError (it cannot be read). What a list
cannot read of one object is left out (or read in part, for a claim) and reported by the adapter: it never
fails the list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from netclaim.core.events import EventReason
from netclaim.core.objects import Claim, IPAllocation, Pod, Slice
from netclaim.core.policy.rules import PolicySource

T = TypeVar("T")


@dataclass(frozen=True)
class Listed(Generic[T]):
    """A list's objects, and its resourceVersion: a watch from that version misses no change after the list
    (None when the answer had none to read: then only a watch from now is possible)."""

    items: list[T]
    version: str | None


DELETED = "DELETED"  # a watch event's type for an object gone


class Watched(Protocol[T]):
    """A kind the controller's informers keep (netclaim.controller.informer): listed, then watched from the
    list's version, each object made by the adapter into what is kept of it."""

    async def listed(self) -> Listed[T]: ...

    def changes(self, since: str | None) -> AsyncIterator[tuple[str, T]]:
        """(event type, object) of each change from `since` (a list's version), or from now."""
        ...


class PodEventsApi(Protocol):
    """Events on pods: both programs'."""

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: EventReason, message: str, warning: bool = True
    ) -> None:
        """A Warning (or Normal) Event on the pod, its message cut to what the API takes."""


class ClaimsApi(PodEventsApi, Protocol):
    """The agent's: the claims kubelet names to it and their status."""

    async def get_claim(self, namespace: str, name: str) -> Claim:
        """ConfigError when not even its identity can be read; what was read only in part: Claim.problems."""

    async def write_claim_devices(
        self, claim: Claim, driver: str, entries: list[dict[str, Any]]
    ) -> str | None:
        """Replace `driver`'s entries of the claim's `status.devices` as read by `entries` (ConflictError
        when the claim changed since); other drivers' entries stay as they are. The claim's new
        resourceVersion, when the answer says it."""


class PodAnnotationsApi(Protocol):
    """The agent's, only with the network-status annotation turned on (and then its RBAC has the rule):
    the pods it annotates."""

    async def get_pod(self, namespace: str, name: str) -> Pod: ...

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        """Set one annotation on the pod as read (ConflictError when the pod changed since)."""


class ClusterClaimsApi(PodEventsApi, Protocol):
    """The controller's: every claim of the cluster, and the pods that wait for theirs."""

    async def list_claims(self, driver: str | None = None) -> list[Claim]:
        """Every ResourceClaim of the cluster, each as the controller keeps it (Claim.compact(driver))
        when `driver` is given; one read only in part is listed with what was read."""

    async def listed_claims(self, driver: str | None = None) -> Listed[Claim]:
        """list_claims, with the list's resourceVersion."""

    async def get_claim(self, namespace: str, name: str) -> Claim:
        """The claim as the API has it now (GoneError when it is not there)."""

    def claim_changes(self, since: str | None = None) -> AsyncIterator[tuple[str, Claim]]:
        """Every claim's event (ADDED, MODIFIED, DELETED) and the claim as it carried it, as they happen,
        from resourceVersion `since` or from now (one that cannot be read has `unreadable` set, and no UID
        when not even its identity could be read); an end of the watch the caller must start afresh from
        (a list, when it watched from one) is ApiUnavailableError."""

    async def unschedulable_pods(self) -> list[Pod]:
        """Pending pods the scheduler could not place."""


class SliceStoreApi(Protocol):
    """The ResourceSlices of one pool of one driver, as the one slice writer reads and writes them."""

    async def list_slices(self, driver: str, pool: str, node: str | None = None) -> list[Slice]:
        """The slices of `driver`'s pool `pool`; with `node`, only those on it (a node's share: what an
        agent's token may list)."""

    async def apply_slice(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Write the slice as `body` says (server-side apply, taking every field: netclaim owns it); the
        devices as the API server stored them (a feature gate that is off drops fields silently)."""

    async def delete_slice(self, name: str) -> None:
        """Delete a slice; one already gone is fine."""


class NodeSlicesApi(SliceStoreApi, Protocol):
    """The agent's: its node's ResourceSlices, and their owner."""

    def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        """The event types (ADDED, MODIFIED, DELETED) of this node's slices, as they happen; an end of the
        watch the caller must start afresh from is ApiUnavailableError."""

    async def node_uid(self, node: str) -> str: ...

    async def create_node_event(self, node: str, node_uid: str, reason: EventReason, message: str) -> None:
        """A Warning Event on the Node (what concerns the node's publishing as a whole)."""

    async def set_node_condition(self, node: str, condition: dict[str, str]) -> None:
        """One condition of the Node's status (type, status, reason, message), by its type; its
        lastTransitionTime moves only when its status changes. Only the agent's own node, only its own
        condition type (admission: netclaim-node-condition-own-node)."""


class PreflightApi(Protocol):
    """`netclaim preflight`'s, with the agent's own token: who the API server takes it for, and what it
    keeps of a slice (the feature gates it runs with decide which fields it drops)."""

    async def identity(self) -> tuple[str, dict[str, list[str]]]:
        """The user the API server authenticates this connection as, and its extra fields (a node-bound
        token's authentication.kubernetes.io/node-name), by a SelfSubjectReview."""

    async def dry_run_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """The slice as the API server would store it, by a dry-run create (admission included): nothing
        is written."""


class PoolSlicesApi(SliceStoreApi, Protocol):
    """The controller's: the IP pools' slices, their owner, and the classes that select their devices."""

    async def crd_uid(self, name: str) -> str:
        """The UID of CustomResourceDefinition `name` (the owner of what exists only with it)."""

    async def device_class_exists(self, name: str) -> bool: ...


class AddressRecordsApi(Protocol):
    """IPPools and the IPAllocations that hold their addresses, as both programs read and free them."""

    async def list_ippools(self, *, cached: bool = False) -> list[dict[str, Any]]:
        """Every IPPool as the API has it; one that cannot be read is left out. `cached`: as the API server's
        watch cache holds them (resourceVersion 0), without waiting for that cache to catch up with etcd:
        what the last moments changed may be missing."""

    async def list_ip_allocations(
        self, *, pool: str | None = None, claim_uid: str | None = None
    ) -> list[IPAllocation]:
        """The IPAllocations (of `pool`, of claim `claim_uid`); one that cannot be read is left out: it is
        neither counted as held nor freed."""

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        """Release the address, only if the object is still the one read (same UID); gone already is fine."""


class AddressesApi(AddressRecordsApi, Protocol):
    """The agent's: its claims' addresses, taken at prepare and released at unprepare."""

    async def get_ippool(self, name: str) -> dict[str, Any]:
        """The IPPool as the API has it (ConfigError when it cannot be read)."""

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        """ConfigError when it cannot be read."""

    async def held_ip_allocations(self, claim_uid: str, not_older_than: str | None) -> Listed[IPAllocation]:
        """The claim's IPAllocations that can be read, with the list's resourceVersion. `not_older_than`: a
        resourceVersion the answer must hold everything up to, served from the API server's watch cache
        (no wait when the cache is past it); None: a consistent list."""

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        """Take the address: AlreadyExistsError when another claim (or this one, earlier) holds it."""


class IPPoolsApi(AddressRecordsApi, Protocol):
    """The controller's: every pool's addresses, the pools' status, and their changes."""

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        """Replace the pool's whole status: nothing stale is kept."""

    async def mark_released(self, allocation: IPAllocation, when: str) -> None:
        """Annotate the allocation RELEASED_AT `when` (only if it is still that object: its UID)."""

    def ippool_changes(self) -> AsyncIterator[str]:
        """The event types of every IPPool, as they happen; not read further."""

    async def listed_ip_allocations(self) -> Listed[IPAllocation]:
        """Every IPAllocation that can be read, with the list's resourceVersion."""

    def ip_allocation_changes(self, since: str | None = None) -> AsyncIterator[tuple[str, IPAllocation]]:
        """Every IPAllocation's event and the object as it carried it, from resourceVersion `since` or from
        now; one that cannot be read is left out (logged), as lists leave it out. An end of the watch is
        ApiUnavailableError, as claim_changes'."""


class PoolParamsApi(Protocol):
    """The controller's: the parameters of admission policy netclaim-pool-namespaces, a ConfigMap per
    restricted IPPool in the controller's namespace (netclaim.core.ipam.pools.namespace_params)."""

    async def list_pool_params(self) -> dict[str, dict[str, str]]:
        """name → data of each parameter (ConfigMaps with the parameters' label)."""

    async def apply_pool_params(self, name: str, data: dict[str, str], pool: str, pool_uid: str) -> None:
        """Create or replace parameter `name`, owned by IPPool `pool` (deleting the pool deletes it)."""

    async def delete_pool_params(self, name: str) -> None:
        """Gone already is fine."""


class NetworkServicesApi(Protocol):
    """The controller's writes for the Services labelled with a netclaim network: the EndpointSlices it
    keeps for them and Events on them (what it reads of them, as of pods and claims, is the informers')."""

    async def apply_endpoint_slice(self, body: dict[str, Any]) -> None:
        """Write the slice as `body` says (server-side apply, taking every field: the controller owns it)."""

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        """Delete a slice; one already gone is fine."""

    async def create_service_event(
        self, namespace: str, service: str, service_uid: str, reason: EventReason, message: str
    ) -> None:
        """A Warning Event on the Service."""


class PolicyRulesApi(Protocol):
    """The agent's: the network policy rules the controller compiled (netclaim.controller.policy), the
    ConfigMaps of the given RULES_LABEL values only."""

    async def list_policy_rules(self, labels: list[str]) -> dict[str, list[str]]:
        """RULES_LABEL value → the rules (JSON) of each of its ConfigMaps (the parts of one), by name."""

    def policy_rules_changes(self, labels: list[str]) -> AsyncIterator[str]:
        """The event type of each change of those ConfigMaps, as it happens."""


class NetworkPoliciesApi(Protocol):
    """The controller's writes for MultiNetworkPolicies: the rules ConfigMaps for the agents in its own
    namespace, and Events on the policies (what it reads of them, as of the pods, namespaces and claims,
    is the informers')."""

    async def list_networks(self, driver: str) -> set[str]:
        """The networks (`netclaim.dev/network`) of the devices `driver` publishes, every node's."""

    async def list_policies(self, namespace: str) -> list[PolicySource]:
        """The namespace's MultiNetworkPolicies, as the informer keeps them (read again: PolicySources)."""

    async def create_policy_event(
        self, namespace: str, name: str, uid: str, reason: EventReason, message: str
    ) -> None:
        """A Warning Event on the MultiNetworkPolicy."""

    async def apply_rules_map(self, name: str, label: str, data: dict[str, str]) -> None: ...

    async def delete_rules_map(self, name: str) -> None: ...
