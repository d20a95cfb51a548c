"""The Kubernetes adapter hands out netclaim's errors, chosen by what the API answered (errors.py)."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status, StatusCause, StatusDetails

from netclaim.adapters.kube.connection import translated
from netclaim.errors import (
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
    ConflictError,
    GoneError,
    NetclaimError,
)


def _api_error(code: int, message: str, name: str | None = None, cause: str | None = None) -> ApiError:
    details = StatusDetails(name=name, kind="resourceclaims") if name else None
    if cause is not None:
        details = StatusDetails(causes=[StatusCause(reason="FieldValueTooLong", message=cause)])
    return ApiError(status=Status(code=code, message=message, details=details))


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (_api_error(404, 'resourceclaims.resource.k8s.io "c" not found', name="c"), GoneError),
        # a kind the server does not serve (during an upgrade, or skew) says nothing about the object
        (_api_error(404, "the server could not find the requested resource"), ApiRejectedError),
        (_api_error(409, "the object has been modified"), ConflictError),
        (_api_error(429, "too many requests"), ApiUnavailableError),
        (_api_error(503, "unavailable"), ApiUnavailableError),
        (_api_error(403, "forbidden"), ApiRejectedError),
        (_api_error(422, "status.devices: Invalid value"), ApiRejectedError),
        (httpx.ConnectError("connection refused"), ApiUnavailableError),
        (httpx.ReadTimeout("timed out"), ApiUnavailableError),
        (RecursionError("maximum recursion depth exceeded while decoding a JSON object"), ConfigError),
    ],
)
def test_each_answer_becomes_the_error_class_that_decides_what_happens(
    raised: Exception, expected: type[NetclaimError]
) -> None:
    with pytest.raises(expected) as err, translated("claim ns/c"):
        raise raised
    assert str(err.value).startswith("claim ns/c: ")


def test_a_rejection_names_its_causes() -> None:
    cause = "status.devices[0].networkData.interfaceName: Too long"
    with pytest.raises(ApiRejectedError) as err, translated("status of claim ns/c"):
        raise _api_error(422, 'ResourceClaim "c" is invalid', cause=cause)
    assert str(err.value) == f'status of claim ns/c: 422 ResourceClaim "c" is invalid; {cause}'
