"""Interruptible (bid) rentals and account SSH keys: the product's Vast client against the
strict fake (issue 36, step 1). The client keeps its calls in a journal, so no database."""

import pytest

from devtools.fake_vast import FakeVast
from vastmgr.lib.errors import VastError
from vastmgr.remote import vast
from vastmgr.remote.vast import OfferFilter, VastClient

API_KEY = "vast-test-key-bids-0123456789"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBidsBidsBidsBidsBidsBidsBidsBidsBids test"


async def market(**options) -> FakeVast:
    fake = FakeVast(API_KEY, **options)
    fake.populate(40, seed=3)
    await fake.start()
    return fake


def client_for(fake: FakeVast, calls: list) -> VastClient:
    return VastClient(API_KEY, fake.url, journal=calls.append)


async def rent(client: VastClient, offer: dict, bid: float | None) -> int:
    return await client.create_instance(offer["id"], image="vastmgr/engine:1", disk_gb=16,
                                        label=f"{vast.LABEL_PREFIX}bid-test", bid_price=bid)


async def status(client: VastClient, instance_id: int) -> dict:
    row = await client.instance(instance_id)
    assert row is not None
    return row


async def test_offers_by_type_carry_their_price():
    fake = await market()
    calls: list = []
    client = client_for(fake, calls)
    try:
        by_type = {kind: {o["id"]: o for o in await client.search_offers(
            OfferFilter(offer_type=kind, limit=100))} for kind in vast.OFFER_TYPES}
        assert set(by_type[vast.ON_DEMAND]) == set(by_type[vast.INTERRUPTIBLE])
        storage = fake.offers  # the oracle: the fake's own market
        for offer_id, on_demand in by_type[vast.ON_DEMAND].items():
            bid = by_type[vast.INTERRUPTIBLE][offer_id]
            listed = storage[offer_id]
            assert bid["is_bid"] and bid["min_bid"] == listed["min_bid"]
            assert bid["dph_total"] == pytest.approx(
                listed["min_bid"] + on_demand["dph_total"] - listed["dph_base"])
            assert bid["dph_total"] < on_demand["dph_total"]
            assert by_type[vast.RESERVED][offer_id]["dph_total"] <= on_demand["dph_total"]
        assert [c.status for c in calls] == [200, 200, 200]
        with pytest.raises(ValueError, match="unknown offer type"):
            OfferFilter(offer_type="interruptible")
    finally:
        await fake.stop()


async def test_interruptible_rent_runs_at_its_bid_and_underbid_is_created_stopped():
    fake = await market()
    calls: list = []
    client = client_for(fake, calls)
    try:
        cheap, other = (await client.search_offers(
            OfferFilter(offer_type=vast.INTERRUPTIBLE, limit=2)))[:2]
        bid = round(cheap["min_bid"] * 1.2, 4)
        running = await rent(client, cheap, bid)
        fake.advance(120)
        row = await status(client, running)
        assert (row["actual_status"], row["is_bid"], row["label"]) == \
            ("running", True, f"{vast.LABEL_PREFIX}bid-test")
        assert row["dph_base"] == bid  # an interruptible instance pays its bid
        assert fake.requests[-2][2]["price"] == bid  # the create carried it, as `price`

        underbid = await rent(client, other, round(other["min_bid"] / 2, 4))
        fake.advance(120)
        row = await status(client, underbid)
        assert row["actual_status"] == "stopped" and row["intended_status"] == "running"
        assert "outbid" in row["status_msg"]
        await client.change_bid(underbid, round(other["min_bid"] * 1.1, 4))
        assert (await status(client, underbid))["actual_status"] == "running"
    finally:
        await fake.stop()


async def outbid_times(seed: int) -> list[float]:
    """When (on the fake's clock) each of three interruptible instances is first outbid."""
    fake = await market(market_seed=seed, preemption_rate=0.5)
    client = client_for(fake, [])
    try:
        offers = await client.search_offers(OfferFilter(offer_type=vast.INTERRUPTIBLE,
                                                        limit=3))
        ids = [await rent(client, o, round(o["min_bid"] * 1.05, 4)) for o in offers]
        first: dict[int, float] = {}
        while len(first) < len(ids) and fake.clock < 48 * 3600:
            fake.advance(60)
            for row in await client.list_instances():
                if row["actual_status"] == "stopped":
                    first.setdefault(row["id"], fake.clock)
        return [first.get(i, -1.0) for i in ids]
    finally:
        await fake.stop()


async def test_the_seeded_market_outbids_reproducibly():
    once, again, other = await outbid_times(5), await outbid_times(5), await outbid_times(6)
    assert once == again
    assert all(t > 0 for t in once), "at 0.5 per hour every instance is outbid within 48 h"
    assert once != other


async def test_an_outbid_instance_stops_and_a_higher_bid_brings_it_back():
    fake = await market()
    client = client_for(fake, [])
    try:
        offer = (await client.search_offers(OfferFilter(offer_type=vast.INTERRUPTIBLE,
                                                        limit=1)))[0]
        instance_id = await rent(client, offer, round(offer["min_bid"] * 1.1, 4))
        fake.advance(120)
        fake.outbid(instance_id, competitor_bid=offer["min_bid"] * 2)
        row = await status(client, instance_id)
        assert row["actual_status"] == "stopped" and "ports" not in row
        # The machine's minimum bid is now the competitor's: a bid search says so.
        again = await client.offer(offer["id"], offer_type=vast.INTERRUPTIBLE)
        assert again is None  # it is rented (by us, stopped), so not offered
        await client.change_bid(instance_id, round(offer["min_bid"] * 1.5, 4))
        assert (await status(client, instance_id))["actual_status"] == "stopped"
        await client.change_bid(instance_id, round(offer["min_bid"] * 2.5, 4))
        assert (await status(client, instance_id))["actual_status"] == "running"
    finally:
        await fake.stop()


async def test_bids_outside_vasts_bounds_are_refused():
    fake = await market()
    calls: list = []
    client = client_for(fake, calls)
    try:
        offer = (await client.search_offers(OfferFilter(limit=1)))[0]
        with pytest.raises(VastError, match="between"):
            await rent(client, offer, 0.0)
        assert len(calls) == 1  # refused before any call
        on_demand = await rent(client, offer, None)
        with pytest.raises(VastError, match="on-demand") as refused:
            await client.change_bid(on_demand, 0.5)
        assert refused.value.status == 400
        # The fake is stricter than the client's own check: the raw call is refused too.
        with pytest.raises(VastError) as raw:
            await client.call("PUT", f"/api/v0/instances/bid_price/{on_demand}/",
                              body={"client_id": "me", "price": 33})
        assert raw.value.status == 400
    finally:
        await fake.stop()


async def test_account_ssh_keys_are_added_listed_and_deleted():
    fake = await market()
    client = client_for(fake, [])
    try:
        offer = (await client.search_offers(OfferFilter(limit=1)))[0]
        instance_id = await rent(client, offer, None)
        key_id = await client.add_account_ssh_key(PUBLIC_KEY)
        assert [(k["id"], k["key"]) for k in await client.account_ssh_keys()] == \
            [(key_id, PUBLIC_KEY)]
        assert fake.instances[instance_id]["ssh_keys"] == [PUBLIC_KEY]
        await client.delete_account_ssh_key(key_id)
        assert await client.account_ssh_keys() == []
        with pytest.raises(VastError) as missing:
            await client.delete_account_ssh_key(key_id)
        assert missing.value.status == 404
    finally:
        await fake.stop()
