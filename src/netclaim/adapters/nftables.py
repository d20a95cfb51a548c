"""nftables inside a pod's network namespace: `nft` (Debian's nftables) run under `nsenter --net`, a script
applied in one transaction, the table read back. The only place netclaim runs nft."""

from __future__ import annotations

from netclaim.adapters import processes
from netclaim.errors import KernelError, PrerequisiteError

TIMEOUT_SECONDS = 5.0
NFT, NSENTER = "nft", "nsenter"


async def _run(netns: str, *args: str, script: str = "") -> str:
    what = f"nft {' '.join(args)} in {netns}"
    try:
        finished = await processes.run(
            [NSENTER, f"--net={netns}", "--", NFT, *args], stdin=script.encode(), time_limit=TIMEOUT_SECONDS
        )
    except FileNotFoundError as err:
        raise PrerequisiteError(
            f"{what}: {err.filename} is not installed (Debian: nftables, util-linux)"
        ) from err
    if finished.returncode != 0:
        raise KernelError(
            f"{what}: exit {finished.returncode}: {finished.stderr.decode(errors='replace').strip()}"
        )
    return finished.stdout.decode(errors="replace")


async def apply(netns: str, script: str) -> None:
    """Run the script (`nft -f -`): all of it or, on an error, none of it."""
    await _run(netns, "-f", "-", script=script)


async def table(netns: str, name: str) -> str:
    """The table as `nft list table` prints it; "" when the namespace has none of that name."""
    family, _, table_name = name.partition(" ")
    try:
        return await _run(netns, "list", "table", family, table_name)
    except KernelError as err:
        if "No such file or directory" in str(err):
            return ""
        raise
