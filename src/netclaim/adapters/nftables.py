"""nftables in a network namespace: `nft` (Debian's nftables) run under `nsenter --net`, fed nft's JSON
(`nft -j -f -`, one transaction: all of it or none of it), and tables read back as JSON. The only place
netclaim runs nft; callers hand it data (netclaim.core.policy.ruleset, netclaim.netguard), never nft's
language, so no value can become a command."""

from __future__ import annotations

import json
from typing import Any

from netclaim.adapters import processes
from netclaim.core.node import Ruleset  # libnftables-json(5)
from netclaim.errors import KernelError

TIMEOUT_SECONDS = 5.0
NFT = "nft"


async def _run(netns: str, *args: str, data: bytes = b"") -> str:
    return await processes.run_tool(
        NFT, args, netns=netns, stdin=data, package="nftables, util-linux", time_limit=TIMEOUT_SECONDS
    )


async def apply(netns: str, ruleset: Ruleset, *, check_only: bool = False) -> None:
    """Run the batch in `netns` ("": the agent's own namespace): all of it or, on an error, none of it.
    `check_only`: the kernel checks it and commits nothing (`nft -c`)."""
    flags = ("-c", "-j", "-f", "-") if check_only else ("-j", "-f", "-")
    await _run(netns, *flags, data=json.dumps(ruleset, separators=(",", ":")).encode())


async def define(netns: str, script: str, *, check_only: bool = False) -> None:
    """Run a script of netclaim's own definitions in nft's language (`nft -f -`): constants only, never a
    value a pod or a tenant brings (those go in as JSON, `apply`)."""
    flags = ("-c", "-f", "-") if check_only else ("-f", "-")
    await _run(netns, *flags, data=script.encode())


async def table(netns: str, family: str, name: str) -> list[dict[str, Any]]:
    """The table's objects as `nft -j list table` gives them (its table, chains, sets, rules); [] when the
    namespace has none of that name."""
    try:
        listed = await _run(netns, "-j", "list", "table", family, name)
    except KernelError as err:
        if "No such file or directory" in str(err):
            return []
        raise
    objects: list[dict[str, Any]] = json.loads(listed).get("nftables", [])
    return [o for o in objects if "metainfo" not in o]


async def tables(netns: str) -> list[tuple[str, str]]:
    """(family, name) of every table in `netns` ("": the agent's own namespace)."""
    listed = json.loads(await _run(netns, "-j", "list", "tables"))
    return [
        (str(o["table"]["family"]), str(o["table"]["name"]))
        for o in listed.get("nftables", [])
        if "table" in o
    ]
