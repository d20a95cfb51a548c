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


class _StrictLoader(yaml.SafeLoader):
    """YAML as the apiserver reads it for us: a key given twice is an error, not "the last one wins"."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[object, object]:
    keys = [loader.construct_object(key) for key, _ in node.value]
    for position, key in enumerate(keys):
        if key in keys[:position]:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", node.value[position][0].start_mark
            )
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml_model(path: Path, model: type[M], header: str) -> M:
    """`header` tells what the file should start with, e.g. `kind: PublishPolicy`."""
    try:
        raw = yaml.load(path.read_text(), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with apiVersion: netclaim.dev/v1alpha1, {header}")
    return validate_strict(model, raw, str(path))
