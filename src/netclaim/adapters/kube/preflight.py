"""The agent's PreflightApi: who the API server takes its token for; a slice as the server would keep it."""

from __future__ import annotations

import json
from typing import Any

from lightkube.resources.authentication_v1 import SelfSubjectReview

from netclaim.adapters.kube.connection import SLICES, KubeConnection, raise_for_status, translated
from netclaim.core.kubeapi import PreflightApi
from netclaim.errors import ConfigError


class KubePreflight(PreflightApi):
    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def identity(self) -> tuple[str, dict[str, list[str]]]:
        with translated("SelfSubjectReview"):
            review = await self.kube.client.create(SelfSubjectReview())
        user = review.status.userInfo if review.status is not None else None
        if user is None:
            raise ConfigError("SelfSubjectReview: the API server answered without the user")
        return str(user.username or ""), {key: list(values) for key, values in (user.extra or {}).items()}

    async def dry_run_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        # the JSON as sent and as answered, past lightkube's models: what matters is what the server drops
        with translated(f"ResourceSlice {body['metadata']['name']} (dry run)"):
            response = await self.kube.http.post(
                SLICES.path(),
                params={"dryRun": "All", "fieldManager": self.kube.field_manager},
                content=json.dumps(body),
                headers={"Content-Type": "application/json"},
            )
            raise_for_status(response)
        answered: dict[str, Any] = response.json()
        return answered
