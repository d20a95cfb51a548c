"""Load versioned YAML files (cluster, policy, overrides) strictly, with errors naming file and field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml

from netclaim.core.config import strict
from netclaim.errors import ConfigError

M = TypeVar("M")


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
    return strict.decode(model, raw, str(path))
