"""`netclaim status` and `netclaim nics`: the demo report's tables, for any namespace and any cluster.

status: pod → claim → device → interface, addresses, MAC, bandwidth and readiness, from the claims'
allocation and status (KEP-4817). nics: per node, each published device with its capacities used and
free, counted from every allocated claim's consumed capacity.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from netclaim.cli.explain import Snapshot
from netclaim.cli.fit import consumed_capacity, published_devices, show_quantity
from netclaim.core.names import DRIVER_DOMAIN

RED, GREEN, RESET = "\033[31m", "\033[32m", "\033[0m"


def status_rows(snapshot: Snapshot) -> list[dict[str, str]]:
    """One row per netclaim device of each pod with claims (one row saying so when none is allocated)."""
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in snapshot.claims}
    rows = []
    for pod in snapshot.pods:
        if not pod.claims:
            continue
        base = {"pod": pod.name, "phase": pod.phase, "node": pod.node or "(Pending)"}
        found = False
        for name in pod.claim_names():
            claim = claims.get((pod.namespace, name)) or {}
            status = claim.get("status") or {}
            entries = {
                (e.get("pool"), e.get("device")): e
                for e in status.get("devices") or []
                if e.get("driver") == DRIVER_DOMAIN
            }
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            for result in results:
                if result.get("driver") != DRIVER_DOMAIN:
                    continue
                found = True
                entry = entries.get((result.get("pool"), result.get("device"))) or {}
                data = entry.get("networkData") or {}
                ready = next(
                    (c for c in entry.get("conditions") or [] if c.get("type") == "Ready"), {"status": "-"}
                )
                rows.append(
                    {
                        **base,
                        "claim": name,
                        "request": str(result.get("request", "")),
                        "device": str(result.get("device", "")),
                        "bandwidth": str(
                            (result.get("consumedCapacity") or {}).get(f"{DRIVER_DOMAIN}/bandwidth", "-")
                        ),
                        "interface": str(data.get("interfaceName", "-")),
                        "ips": ", ".join(data.get("ips") or []) or "-",
                        "mac": str(data.get("hardwareAddress", "-")),
                        "ready": str(ready.get("status"))
                        + (f" ({ready['reason']})" if ready.get("status") == "False" else ""),
                    }
                )
        if not found:
            rows.append(
                {**base, "claim": ", ".join(pod.claim_names()) or "-", "request": "-", "device": "-",
                 "bandwidth": "-", "interface": "-", "ips": "-", "mac": "-", "ready": "not allocated"}
            )  # fmt: skip
    return rows


def nic_rows(snapshot: Snapshot) -> list[dict[str, str]]:
    """Per node, each netclaim device and its capacities: total, used, free."""
    consumed, holders = consumed_capacity(snapshot.claims)
    rows = []
    for device in published_devices(snapshot.slices):
        if device.driver != DRIVER_DOMAIN:
            continue
        used = consumed.get(device.key, {})
        capacities = []
        for name, total in sorted(device.capacity.items()):
            taken = total if not device.shared and device.key in holders else used.get(name, Decimal(0))
            short = name.rpartition("/")[2]
            used_text = f"{show_quantity(taken)}/{show_quantity(total)}"
            capacities.append(f"{short} {used_text} used, {show_quantity(total - taken)} free")
        own = device.attributes.get(device.driver, {})
        rows.append(
            {
                "node": device.node or "(all)",
                "device": device.name,
                "ifName": str(own.get("ifName") or own.get("pool") or "-"),
                "mode": "shared" if device.shared else "whole",
                "holders": str(sum(1 for c in snapshot.claims if _holds(c, device.key)))
                if device.shared
                else holders.get(device.key, "-"),
                "capacity": "; ".join(capacities) or "-",
            }
        )
    return sorted(rows, key=lambda r: (r["node"], r["ifName"]))


def _holds(claim: dict[str, Any], key: tuple[str, str, str]) -> bool:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return any((r.get("driver"), r.get("pool"), r.get("device")) == key for r in results)


def use_color(stream: Any) -> bool:
    """Colours only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def render_table(rows: Sequence[dict[str, str]], color: bool = False) -> str:
    if not rows:
        return "(nothing)\n"
    columns = list(rows[0])
    cells = [[c.upper() for c in columns]] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for index, row in enumerate(cells):
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        if color and index:
            text = " ".join(row)
            if "False" in text or "Pending" in text or "not allocated" in text:
                line = f"{RED}{line}{RESET}"
            elif "True" in text or "Running" in text:
                line = f"{GREEN}{line}{RESET}"
        lines.append(line)
    return "\n".join(lines) + "\n"
