"""One spelling for the CNI config keys netclaim reads.

CNI plugins are Go programs, whose encoding/json matches keys to fields without regard to case: `IPAM`,
`Ipam` and `ipam` are one key to host-local. Every lookup netclaim makes in a CNI config goes through
`get_key` (compared as Go does), and a config is rewritten to the canonical spelling of the keys netclaim
reads (`canonical_keys`) before anything after the checks looks at it: the node's defaults, the plugin
list, the CNI version, host-local's clean-up. A tenant's config is already canonical (netclaim.api.tenancy
refuses any other spelling); an admin's may be written as the admin likes.
"""

from __future__ import annotations

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


def get_key(obj: dict[str, Any], key: str) -> Any:
    """obj[key] compared as Go's encoding/json does (case-insensitively); None when absent."""
    if key in obj:
        return obj[key]
    lowered = key.lower()
    return next((value for name, value in obj.items() if name.lower() == lowered), None)


def lookup_key(obj: dict[str, Any], key: str) -> tuple[str, Any] | None:
    """(the key as written, its value) for `key` compared as Go does; None when absent."""
    lowered = key.lower()
    return next(((name, value) for name, value in obj.items() if name.lower() == lowered), None)


def _canonical(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    spelling = {key.lower(): key for key in keys}
    return {spelling.get(name.lower(), name): value for name, value in obj.items()}


def canonical_keys(conflist: dict[str, Any]) -> dict[str, Any]:
    """The config list with the keys netclaim reads in their canonical spelling (the config's checks
    refused two spellings of one key in a claim's config; in an admin's, the last one written wins, as
    for the plugins)."""
    rewritten = _canonical(conflist, CONFLIST_KEYS)
    if not isinstance(rewritten.get("plugins"), list):
        return rewritten  # not a config list: its checks say so
    plugins = []
    for plugin in rewritten["plugins"]:
        if isinstance(plugin, dict):
            plugin = _canonical(plugin, PLUGIN_KEYS)
            if isinstance(plugin.get("ipam"), dict):
                plugin["ipam"] = _canonical(plugin["ipam"], IPAM_KEYS)
        plugins.append(plugin)
    rewritten["plugins"] = plugins
    return rewritten
