"""atheris: the config decoder and the placeholder renderer on arbitrary bytes; only ConfigError may escape,
and it names the field.

Run: python tests/fuzz/fuzz_config.py -atheris_runs=20000   (tests/unit/test_fuzz.py does, bounded)
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports():
    from netclaim.core.config.cniconfig import CNIConfig, as_conflist, decode
    from netclaim.core.config.placeholders import render
    from netclaim.errors import ConfigError


def one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    text = provider.ConsumeUnicodeNoSurrogates(len(data))
    try:
        parameters = json.loads(text)
    except ValueError:
        parameters = {
            "apiVersion": "netclaim.dev/v1alpha1",
            "kind": "CNIConfig",
            "config": {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "macvlan", "master": text}]},
        }
    try:
        config = decode(parameters, "fuzz")
        if isinstance(config, CNIConfig) and config.config is not None:
            render(as_conflist(config.config), {"device.ifName": "e", "consumed.bandwidth": 1}, "config")
    except ConfigError as err:  # the one outcome besides success; it must say where
        assert str(err).startswith(("fuzz", "config")), str(err)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
