"""The parameters of admission policy netclaim-pool-namespaces: ConfigMaps of the controller's namespace,
through lightkube (they hold only what the controller wrote). The controller's PoolParamsApi."""

from __future__ import annotations

import contextlib

from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import ConfigMap

from netclaim.adapters.kube.connection import IPPOOLS, KubeConnection, translated
from netclaim.core.kubeapi import PoolParamsApi
from netclaim.core.objects import PARAMS_LABEL, POOL_NAMESPACES
from netclaim.errors import GoneError


class KubePoolParams(PoolParamsApi):
    def __init__(self, kube: KubeConnection, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    async def list_pool_params(self) -> dict[str, dict[str, str]]:
        with translated(f"admission parameters in namespace {self.namespace}"):
            found = [
                c
                async for c in self.kube.client.list(
                    ConfigMap, namespace=self.namespace, labels={PARAMS_LABEL: POOL_NAMESPACES}
                )
            ]
        return {str(c.metadata.name): dict(c.data or {}) for c in found if c.metadata is not None}

    async def apply_pool_params(self, name: str, data: dict[str, str], pool: str, pool_uid: str) -> None:
        owner = OwnerReference(apiVersion=IPPOOLS.api_version, kind=IPPOOLS.name, name=pool, uid=pool_uid)
        body = ConfigMap(
            apiVersion="v1",
            kind="ConfigMap",
            metadata=ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels={PARAMS_LABEL: POOL_NAMESPACES},
                ownerReferences=[owner],
            ),
            data=data,
        )
        with translated(f"ConfigMap {self.namespace}/{name}"):
            await self.kube.client.apply(body, field_manager=self.kube.field_manager, force=True)

    async def delete_pool_params(self, name: str) -> None:
        with contextlib.suppress(GoneError), translated(f"ConfigMap {self.namespace}/{name}"):
            await self.kube.client.delete(ConfigMap, name, namespace=self.namespace)
