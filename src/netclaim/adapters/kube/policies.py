"""MultiNetworkPolicies, what they select, and the rules ConfigMaps: the controller's NetworkPoliciesApi and
the agent's PolicyRulesApi. Policies are a tenant's free JSON: read without lightkube's decoder."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from netclaim.adapters.kube.connection import (
    CONFIG_MAPS,
    POLICIES,
    SLICES,
    KubeConnection,
    Unreadable,
    translated,
)
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import NetworkPoliciesApi, PolicyRulesApi
from netclaim.core.names import NETWORK, POLICY_RULES_KEY, POLICY_RULES_LABEL
from netclaim.core.objects import ListItems, as_object
from netclaim.core.policy.rules import PolicySource
from netclaim.errors import GoneError


class KubePolicies(NetworkPoliciesApi):
    def __init__(self, kube: KubeConnection, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    async def list_networks(self, driver: str) -> set[str]:
        found = as_object(
            await self.kube.read(
                f"{driver}'s ResourceSlices", SLICES.path(), {"fieldSelector": f"spec.driver={driver}"}
            )
        )
        networks = set()
        for item in found.get("items") or []:
            for device in as_object(as_object(item).get("spec")).get("devices") or []:
                attribute = as_object(as_object(as_object(device).get("attributes")).get(NETWORK))
                if isinstance(attribute.get("string"), str):
                    networks.add(attribute["string"])
        return networks

    async def list_policies(self, namespace: str) -> list[PolicySource]:
        def made(listed: ListItems) -> tuple[list[PolicySource], list[Unreadable]]:
            return [PolicySource.from_api(as_object(item)) for item in listed.items], []

        found, _, _ = await self.kube.read_pages(
            f"MultiNetworkPolicies of namespace {namespace}", POLICIES.path(namespace), made, POLICIES.page
        )
        return found

    async def create_policy_event(
        self, namespace: str, name: str, uid: str, reason: EventReason, message: str
    ) -> None:
        involved = ObjectReference(
            kind=POLICIES.name, apiVersion=POLICIES.api_version, name=name, namespace=namespace, uid=uid
        )
        await self.kube.create_event(involved, reason, message)

    async def apply_rules_map(self, name: str, label: str, data: dict[str, str]) -> None:
        body = ConfigMap(
            apiVersion="v1",
            kind="ConfigMap",
            metadata=ObjectMeta(name=name, namespace=self.namespace, labels={POLICY_RULES_LABEL: label}),
            data=data,
        )
        with translated(f"ConfigMap {self.namespace}/{name}"):
            await self.kube.client.apply(body, field_manager=self.kube.field_manager, force=True)

    async def delete_rules_map(self, name: str) -> None:
        with contextlib.suppress(GoneError), translated(f"ConfigMap {self.namespace}/{name}"):
            await self.kube.client.delete(ConfigMap, name, namespace=self.namespace)


class KubePolicyRules(PolicyRulesApi):
    """The agent's: the rules ConfigMaps of the given label values, in the controller's namespace."""

    def __init__(self, kube: KubeConnection, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def _selector(self, labels: list[str]) -> str:
        return f"{POLICY_RULES_LABEL} in ({','.join(labels)})"

    async def list_policy_rules(self, labels: list[str]) -> dict[str, list[str]]:
        found = as_object(
            await self.kube.read(
                f"rules ConfigMaps {labels}",
                CONFIG_MAPS.path(self.namespace),
                {"labelSelector": self._selector(labels)},
            )
        )
        parts: dict[str, list[tuple[str, str]]] = {}
        for item in found.get("items") or []:
            meta, data = as_object(as_object(item).get("metadata")), as_object(item).get("data") or {}
            label = as_object(meta.get("labels")).get(POLICY_RULES_LABEL)
            if isinstance(label, str) and isinstance(data.get(POLICY_RULES_KEY), str):
                parts.setdefault(label, []).append((str(meta.get("name")), data[POLICY_RULES_KEY]))
        return {label: [text for _, text in sorted(found)] for label, found in parts.items()}

    async def policy_rules_changes(self, labels: list[str]) -> AsyncIterator[str]:
        path = CONFIG_MAPS.path(self.namespace)
        async for kind, _ in self.kube.watch(
            "watch of the rules ConfigMaps", path, labels=self._selector(labels)
        ):
            yield kind
