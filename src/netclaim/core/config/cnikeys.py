"""One spelling for the CNI config keys netclaim reads.

CNI plugins are Go programs, whose encoding/json matches keys to fields without regard to case: `IPAM`,
`Ipam` and `ipam` are one key to host-local. A check or a lookup that looks for `ipam` must never meet
`IPAM`, so the keys netclaim itself reads must be written in their canonical spelling, by everyone (an
admin's DeviceClass config too): another spelling is refused, naming the key, when the config is decoded
and by the admission policy. Then every lookup — the allow-list, the node's defaults, the plugin list, the
CNI version, host-local's clean-up — reads the key the plugin reads. The tenant allow-list
(netclaim.core.config.tenancy) holds a claim to the canonical spelling of every key it may set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# the keys netclaim itself reads, per level, in the spelling of the CNI spec and the reference plugins
CONFLIST_KEYS = ("cniVersion", "cniVersions", "name", "plugins", "disableCheck", "disableGC")
PLUGIN_KEYS = ("type", "ipam", "master", "device", "mode")
IPAM_KEYS = (
    "type",
    "dataDir",
    "ranges",
    "routes",
    "subnet",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "addresses",
)


def _misspelled(obj: dict[str, Any], keys: tuple[str, ...], path: str) -> Iterator[str]:
    canonical = {key.lower(): key for key in keys}
    for key in obj:
        name = canonical.get(key.lower())
        if name is not None and name != key:
            yield f"{path}{key}: write it {name!r}: netclaim reads this key in its canonical case only"


def spelling_problems(config: dict[str, Any]) -> Iterator[str]:
    """`path: problem` for each key netclaim reads that a config (a list or a single plugin) spells
    otherwise than canonically, at the config's own level, its plugins' and their IPAM's."""
    yield from _misspelled(config, CONFLIST_KEYS + PLUGIN_KEYS, "")
    listed = config.get("plugins")
    plugins = listed if isinstance(listed, list) else [config]
    prefix = "plugins" if isinstance(listed, list) else ""
    for index, plugin in enumerate(plugins):
        if not isinstance(plugin, dict):
            continue
        where = f"{prefix}[{index}]." if prefix else ""
        if prefix:
            yield from _misspelled(plugin, PLUGIN_KEYS, where)
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict):
            yield from _misspelled(ipam, IPAM_KEYS, f"{where}ipam.")
