"""Load versioned YAML files (cluster, policy, overrides) strictly, with errors naming file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from netclaim.errors import ConfigError, format_validation_error

M = TypeVar("M", bound=BaseModel)


def validate_strict(model: type[M], raw: object, source: str) -> M:
    """Validate plain data as JSON would carry it: no silent coercion ("32" is not an int)."""
    try:
        return model.model_validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from err


def load_yaml_model(path: Path, model: type[M], header: str) -> M:
    """`header` tells what the file should start with, e.g. `kind: PublishPolicy`."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with apiVersion: netclaim.dev/v1alpha1, {header}")
    return validate_strict(model, raw, str(path))
