"""Every reason of the Events netclaim writes: the one list, which docs/operating.md ("Events") describes
row by row (tests/test_monitoring.py fails when one is missing there). Every way to write an Event takes
one of these, so a new reason is added here or not at all."""

from __future__ import annotations

from enum import StrEnum


class EventReason(StrEnum):
    # on pods (the agent)
    PREPARE_FAILED = "NetclaimPrepareFailed"
    ATTACH_FAILED = "NetclaimAttachFailed"
    CHECK_FAILED = "NetclaimCheckFailed"
    LINK_DOWN = "NetclaimLinkDown"
    LINK_UP = "NetclaimLinkUp"
    POLICY_NOT_APPLIED = "NetworkPolicyNotApplied"
    # on pods (the controller)
    POOL_EXHAUSTED = "IPPoolExhausted"
    RESERVATION_FAILED = "IPPoolReservationFailed"
    # on nodes (the agent)
    FIELDS_DROPPED = "NetclaimFieldsDropped"
    # on Services and MultiNetworkPolicies (the controller)
    SERVICE_INVALID = "NetworkServiceInvalid"
    POLICY_INVALID = "NetworkPolicyInvalid"
    POLICY_UNKNOWN_NETWORK = "NetworkPolicyUnknownNetwork"
    # on any object either program could not read
    UNREADABLE = "NetclaimUnreadable"
