"""`tc` (iproute2) on the node: the hairpin of a NIC whose macvlan children are in VEPA mode. The only place
netclaim runs tc: pyroute2's u32 cannot express a match before the network header (the Ethernet
destination), which this needs.

Every frame a VEPA child sends leaves through its NIC's egress (where netclaim.agent.pods.guard checks it);
the hairpin hands those meant for a child of the same NIC back to the NIC's receive path, as an 802.1Qbg
switch port would: unicast to a child is redirected (it never reaches the wire), broadcast and multicast
are mirrored (the wire gets them too). One filter mirrors, at BROADCAST; each child's MAC has a filter of
its own at a priority of CHILDREN, added and deleted alone; filters of other software, and the clsact
qdisc they share, are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from netclaim.adapters import processes
from netclaim.core.names import MAC, check_interface_name
from netclaim.core.node import BROADCAST, CHILDREN

TIMEOUT_SECONDS = 5.0
TC = "tc"


async def _run(netns: str, *args: str, batch: str = "") -> str:
    return await processes.run_tool(
        TC,
        args,
        netns=netns,
        stdin=batch.encode(),
        package="iproute2, util-linux",
        time_limit=TIMEOUT_SECONDS,
    )


async def ours(nic: str, netns: str = "") -> set[int]:
    """The priorities of our filters on the NIC's egress now (BROADCAST and those of CHILDREN)."""
    listed = await _run(netns, "-j", "filter", "show", "dev", check_interface_name(nic), "egress")
    found = {f.get("pref") for f in json.loads(listed or "[]") if isinstance(f, dict)}
    return {p for p in found if isinstance(p, int) and (p == BROADCAST or p in CHILDREN)}


async def change(
    nic: str,
    add: Mapping[int, str],
    remove: Iterable[int] = (),
    *,
    broadcast: bool | None = None,
    netns: str = "",
) -> None:
    """One batch on the NIC's hairpin: a redirect filter for each MAC of `add` at its priority (of
    CHILDREN), those at the priorities of `remove` deleted after them, and the broadcast mirror made
    (`broadcast` True) or deleted (False). `netns` "": the agent's own (the node's)."""
    check_interface_name(nic)
    common = f"dev {nic} egress protocol all"
    lines = [f"qdisc replace dev {nic} clsact"] if add or broadcast else []
    if broadcast:
        lines.append(
            f"filter add {common} prio {BROADCAST} u32 match u8 0x01 0x01 at -14 "
            f"action mirred ingress mirror dev {nic}"
        )
    for priority, mac in sorted(add.items()):
        if MAC.fullmatch(mac) is None or priority not in CHILDREN:
            raise ValueError(
                f"{mac!r} at {priority}: not a MAC at one of ours"
            )  # a bug: the guard gives them
        octets = mac.split(":")
        first, rest = "".join(octets[:2]), "".join(octets[2:])
        lines.append(
            f"filter add {common} prio {priority} u32 match u16 0x{first} 0xffff at -14 "
            f"match u32 0x{rest} 0xffffffff at -12 action mirred ingress redirect dev {nic}"
        )
    lines += [f"filter del {common} prio {priority}" for priority in sorted(set(remove))]
    if broadcast is False:
        lines.append(f"filter del {common} prio {BROADCAST}")
    if lines:
        await _run(netns, "-batch", "-", batch="\n".join(lines) + "\n")


async def version() -> str:
    """`tc -V`: that tc is there (PrerequisiteError otherwise)."""
    return (await _run("", "-V")).strip()
