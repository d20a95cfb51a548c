"""The Kubernetes API boundary: client construction and the error kinds callers react to."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError

# Errors after which a call may succeed later (apiserver restarting, network blip, conflicts).
RETRYABLE = (httpx.TransportError, httpx.TimeoutException, ConnectionError, OSError)


def client(kubeconfig: Path | None, field_manager: str) -> AsyncClient:
    """From a kubeconfig file, else the pod's ServiceAccount (in-cluster), else $KUBECONFIG."""
    if kubeconfig is not None:
        config = KubeConfig.from_file(kubeconfig)
    elif Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        config = KubeConfig.from_service_account()
    else:
        config = KubeConfig.from_env()
    return AsyncClient(config, field_manager=field_manager, timeout=httpx.Timeout(10.0, read=60.0))


def is_not_found(err: ApiError) -> bool:
    return err.status.code == 404


def is_retryable(err: BaseException) -> bool:
    if isinstance(err, ApiError):
        return err.status.code in (409, 429, 500, 502, 503, 504)
    return isinstance(err, RETRYABLE)
