"""`tc` (iproute2) on the node: the hairpin of a NIC whose macvlan children are in VEPA mode. The only place
netclaim runs tc: pyroute2's u32 cannot express a match before the network header (the Ethernet
destination), which this needs.

Every frame a VEPA child sends leaves through its NIC's egress (where netclaim.configure.guard checks it);
the hairpin hands those meant for a child of the same NIC back to the NIC's receive path, as an 802.1Qbg
switch port would: unicast to a child is redirected (it never reaches the wire), broadcast and multicast
are mirrored (the wire gets them too). Its filters are replaced whole, make-before-break: written at one
of two priorities of our own, then the other is deleted; filters of other software, and the clsact qdisc
they share, are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from netclaim.adapters import processes
from netclaim.names import MAC, check_interface_name

TIMEOUT_SECONDS = 5.0
TC = "tc"
PRIORITIES = (49153, 49154)  # ours (0xc001, 0xc002): far from what tools pick by default (49152 and down)


async def _run(netns: str, *args: str, batch: str = "") -> str:
    return await processes.run_tool(
        TC,
        args,
        netns=netns,
        stdin=batch.encode(),
        package="iproute2, util-linux",
        time_limit=TIMEOUT_SECONDS,
    )


async def live_priorities(nic: str, netns: str = "") -> set[int]:
    """Which of our priorities hold filters on the NIC's egress now."""
    listed = await _run(netns, "-j", "filter", "show", "dev", check_interface_name(nic), "egress")
    found = json.loads(listed or "[]")
    return {int(f["pref"]) for f in found if isinstance(f, dict) and f.get("pref") in PRIORITIES}


async def hairpin(nic: str, macs: Sequence[str], netns: str = "") -> None:
    """Make the NIC's hairpin hand back to its receive path the frames for `macs` (the children's) and
    every broadcast and multicast; with no MAC, remove it. `netns` "": the agent's own (the node's)."""
    check_interface_name(nic)
    for mac in macs:
        if MAC.fullmatch(mac) is None:
            raise ValueError(f"{mac!r} is not a MAC address")  # a bug: the guard gives canonical MACs
    live = await live_priorities(nic, netns)
    new = PRIORITIES[0] if PRIORITIES[1] in live or not live else PRIORITIES[1]
    lines = []
    if new in live:  # both were live (a run cut short): this one goes first
        lines.append(f"filter del dev {nic} egress prio {new}")
    if macs:
        lines.append(f"qdisc replace dev {nic} clsact")
        common = f"filter add dev {nic} egress prio {new} protocol all u32"
        lines.append(f"{common} match u8 0x01 0x01 at -14 action mirred ingress mirror dev {nic}")
        for mac in macs:
            octets = mac.split(":")
            first, rest = "".join(octets[:2]), "".join(octets[2:])
            lines.append(
                f"{common} match u16 0x{first} 0xffff at -14 match u32 0x{rest} 0xffffffff at -12 "
                f"action mirred ingress redirect dev {nic}"
            )
    lines += [f"filter del dev {nic} egress prio {old}" for old in sorted(live - {new})]
    if lines:
        await _run(netns, "-batch", "-", batch="\n".join(lines) + "\n")


async def version() -> str:
    """`tc -V`: that tc is there (PrerequisiteError otherwise)."""
    return (await _run("", "-V")).strip()
