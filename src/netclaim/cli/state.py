"""`netclaim state`: a node's persisted attachments, read from the agent's state database while the agent
runs (read-only; run it in the agent's pod: `kubectl exec -n NS POD -c agent -- netclaim state`). One row per
allocated device of a claim: its pod, state, interface and addresses, the error it last met."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from netclaim.agent.store import Attachment, StoredRows

COLUMNS = ("CLAIM", "DEVICE", "POD UID", "STATE", "INTERFACE", "IPS", "SANDBOX", "ERROR")


def described(row: Attachment) -> dict[str, Any]:
    interface = row.outcome.interface
    return {
        "claim": f"{row.claim_namespace}/{row.claim_name}",
        "claimUID": row.claim_uid,
        "request": row.request,
        "pool": row.pool,
        "device": row.device,
        "shareID": row.share_id,
        "podUID": row.pod_uid,
        "state": str(row.state),
        "nic": row.plan.nic.if_name,
        "shared": row.plan.shared,
        "interface": interface.name if interface else row.plan.interface_name,
        "mac": interface.mac if interface else "",
        "ips": list(interface.addresses) if interface else [],
        "sandboxID": row.sandbox_id,
        "netns": row.netns,
        "error": row.error,
    }


def render(directory: Path, output: str) -> str:
    rows = StoredRows.read_only(directory)
    try:
        found = [described(row) for row in rows.all()]
    finally:
        rows.close()
    if output == "json":
        return json.dumps(found, indent=2)
    table = [COLUMNS] + [
        (
            r["claim"],
            r["device"],
            r["podUID"],
            r["state"],
            r["interface"],
            ",".join(r["ips"]) or "-",
            r["sandboxID"][:13] or "-",
            r["error"] or "-",
        )
        for r in found
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    return "\n".join(lines) if found else f"no attachment in {directory / 'netclaim.db'}"
