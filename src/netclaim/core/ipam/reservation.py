"""Pool addresses reserved before the pod binds: the pools' devices carry a binding condition (KEP-5007,
beta and on by default from Kubernetes 1.36), so the scheduler, once it has allocated a claim a pool's
device, waits in its PreBind step until the claim's status says RESERVED for that device, and gives the
allocation back when it says RESERVATION_FAILED. The controller reserves (netclaim.controller.reservations);
kubelet's prepare then finds the address held and only reads it.

Where the API server or the scheduler runs without the gate (1.34, 1.35, or turned off), the device is
stored without the fields or its allocation results carry none: claims take their addresses at prepare, as
before. Which path a claim takes is read from its allocation result, never guessed from a version.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from netclaim.core.ipam.ippool import POOLS_POOL
from netclaim.core.objects import AllocatedDevice, Claim, condition

RESERVED = "AddressReserved"
RESERVATION_FAILED = "AddressReservationFailed"
BINDING_FIELDS: dict[str, Any] = {
    "bindingConditions": [RESERVED],
    "bindingFailureConditions": [RESERVATION_FAILED],
}


def reserved_before_binding(allocated: AllocatedDevice) -> bool:
    return allocated.pool == POOLS_POOL and RESERVED in allocated.binding_conditions


def awaiting(claim: Claim, driver: str) -> list[AllocatedDevice]:
    """The claim's pool devices the scheduler waits on: allocated with RESERVED, while no status entry of
    theirs says RESERVED or RESERVATION_FAILED is True."""
    settled = {
        (e.get("pool"), e.get("device"), e.get("shareID") or "")
        for e in claim.devices_status
        if e.get("driver") == driver
        and any(
            isinstance(c, dict)
            and c.get("type") in (RESERVED, RESERVATION_FAILED)
            and c.get("status") == "True"
            for c in e.get("conditions") or ()
        )
    }
    return [
        r
        for r in claim.results
        if r.driver == driver and reserved_before_binding(r) and (r.pool, r.device, r.share_id) not in settled
    ]


def _entry(driver: str, allocated: AllocatedDevice) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": allocated.pool, "device": allocated.device}
    if allocated.share_id:
        entry["shareID"] = allocated.share_id
    return entry


def reserved_condition(message: str, since: str) -> dict[str, str]:
    return condition("True", "AddressHeld", message, since=since, kind=RESERVED)


def reserved_entry(
    driver: str, allocated: AllocatedDevice, addresses: tuple[str, ...], since: str
) -> dict[str, Any]:
    """The status entry that lets the scheduler bind the pod: the addresses held for the claim, as the
    agent's entry shows them once prepared (networkData.ips, canonical CIDR form)."""
    message = f"held for the claim from IPPool {allocated.device} before the pod was bound"
    return {
        **_entry(driver, allocated),
        "conditions": [
            reserved_condition(message, since),
            condition("True", "AddressAllocated", message, since=since),
        ],
        "networkData": {"ips": sorted(str(ipaddress.ip_interface(a)) for a in addresses)},
    }


def failed_entry(driver: str, allocated: AllocatedDevice, message: str, since: str) -> dict[str, Any]:
    """The status entry that makes the scheduler give the allocation back and try the pod again."""
    failed = condition("True", "ReservationFailed", message, since=since, kind=RESERVATION_FAILED)
    return {**_entry(driver, allocated), "conditions": [failed]}


def with_reservations(claim: Claim, entries: list[dict[str, Any]], since: str) -> list[dict[str, Any]]:
    """`driver`'s entries for the claim, each pool device's that was reserved before binding carrying RESERVED
    as well: an entry without it would make the scheduler wait again for a pod that shares the claim."""
    waited = {(r.pool, r.device, r.share_id) for r in claim.results if reserved_before_binding(r)}
    kept = []
    for entry in entries:
        key = (entry.get("pool"), entry.get("device"), entry.get("shareID") or "")
        conditions = entry.get("conditions") or []
        if key in waited and not any(c.get("type") == RESERVED for c in conditions):
            entry = {
                **entry,
                "conditions": [*conditions, reserved_condition("reserved before binding", since)],
            }
        kept.append(entry)
    return kept
