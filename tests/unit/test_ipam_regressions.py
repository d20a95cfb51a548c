"""Regressions of bugs an outside review of the IPAM code found (each failed before its fix)."""

from __future__ import annotations

import ipaddress

import pytest

from netclaim.controller.ipam import Reconciler
from netclaim.core.ipam.addresses import AddressBook, AddressRequest
from netclaim.core.ipam.ippool import POOLS_POOL
from netclaim.core.ipam.pools import PoolUse, exhausted_message
from netclaim.core.objects import AllocatedDevice
from netclaim.errors import ConfigError
from tests.unit.fakes import SAMPLE_DRIVER, SAMPLE_NODE, FakeKubeApi, sample_claim

FULL = PoolUse(capacity=2, allocated_claims=2, addresses={4: 2})
ROOM = PoolUse(capacity=6, allocated_claims=1, addresses={4: 1})


def test_a_pod_whose_selector_names_a_pool_with_room_is_not_told_another_pool_is_full() -> None:
    """Docstring: "the full pools its selectors name (or every full pool when they name none)"."""
    selectors = ['device.attributes["netclaim.dev"].pool == "lan5"']
    assert exhausted_message(selectors, {"lan3": FULL, "lan5": ROOM}) is None


async def test_an_ipv6_address_from_a_full_v4_only_pool_is_a_config_error_not_transient() -> None:
    api = FakeKubeApi()
    api.add_pool("tiny", {"ranges": [{"subnet": "10.10.5.0/32"}]})
    book = AddressBook(api, SAMPLE_NODE)
    allocated = AllocatedDevice("addr", SAMPLE_DRIVER, POOLS_POOL, "tiny", "s", {})
    other = sample_claim((), (), name="claim-2", uid="claim-uid-2")
    await book.allocate(other, [AddressRequest(allocated, {}, "net")])
    claim = sample_claim((), (), name="claim-1", uid="claim-uid-1")
    with pytest.raises(ConfigError, match="has no IPv6 range"):
        await book.allocate(claim, [AddressRequest(allocated, {6: ipaddress.ip_address("fd00::7")}, "net")])


async def test_a_pool_recreated_under_the_same_name_gets_its_status_written() -> None:
    api = FakeKubeApi()
    api.add_pool("lan3", {"ranges": [{"subnet": "10.10.3.0/30"}]})
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    del api.ippools["lan3"]  # deleted: its status goes with the object
    del api.ippool_status["lan3"]
    await reconciler.once()
    api.add_pool("lan3", {"ranges": [{"subnet": "10.10.3.0/30"}]})  # created again, same spec
    await reconciler.once()
    assert "lan3" in api.ippool_status
