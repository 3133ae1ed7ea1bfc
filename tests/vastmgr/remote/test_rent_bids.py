"""Interruptible rentals from the Offers page and its rent dialog (issue 36), through the Django
client against the strict fake Vast: a bid search shows each machine's minimum bid and opens the
dialog on a bid; a rent at a bid creates an interruptible instance at that bid and the machine
page says so; a bid below the machine's minimum or not below its on-demand price is a 400 that
names the figures, and nothing is rented."""

import math
import re
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async

from vastmgr.fleet.models import Machine
from vastmgr.remote.models import RemoteMachine

from .test_parity_offers import logged_in, market, offer_rows  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_bid_search_shows_minimum_bids_and_the_dialog_rents_at_a_bid(market):  # noqa: F811
    fake_vast, offers = market
    staff = await sync_to_async(logged_in)("ops")
    page = (await sync_to_async(staff.get)("/remote/offers/", {"offer_type": "bid"})
            ).content.decode()
    rows = offer_rows(page)
    for offer in offers:
        listed = fake_vast.offers[offer["id"]]
        assert f'data-min-bid="{listed["min_bid"]:.4f}"' in rows[offer["id"]]
        assert f'<td class="num min-bid">{listed["min_bid"]:.4f}</td>' in rows[offer["id"]]
    assert 'name="offer_type" value="bid" checked' in page  # the dialog opens on a bid
    on_demand = (await sync_to_async(staff.get)("/remote/offers/")).content.decode()
    assert 'name="offer_type" value="on-demand" checked' in on_demand

    target = fake_vast.offers[offers[1]["id"]]
    bid = round(target["min_bid"] * 1.2, 4)
    response = await sync_to_async(staff.post)("/remote/offers/rent/", {
        "offer_ids": [target["id"]], "max_price_per_proof": "0.004", "disk_gb": "64",
        "offer_type": "bid", "bid_price": f"{bid:.4f}"})

    machine = await Machine.objects.select_related("remote").aget(provider="vast")
    assert response.status_code == 302 and response.url == f"/remote/machines/{machine.pk}/"
    instance = fake_vast.instances[machine.vast_instance_id]
    assert instance["is_bid"] and instance["dph_base"] == bid  # the fake's own record
    assert machine.remote.bid_price == Decimal(f"{bid:.4f}")
    assert float(machine.price_per_hour) == pytest.approx(instance["dph_total"], abs=1e-4)
    assert machine.remote.min_bench_rate == math.ceil(
        Decimal(str(instance["dph_total"])) / Decimal("0.004"))
    page = (await sync_to_async(staff.get)(f"/remote/machines/{machine.pk}/")).content.decode()
    shown = re.search(r'<p id="vast-offer-type">(.*?)</p>', page, re.DOTALL)
    assert shown and "Interruptible, at a bid of" in shown.group(1)
    assert f'data-bid="{bid:.4f}">${bid:.4f}/h' in shown.group(1)


@pytest.mark.parametrize("bid, reason", [
    (lambda o: o["min_bid"] * 0.9, "below the machine's minimum bid"),
    (lambda o: o["dph_base"], "not below the machine's on-demand price"),
    (lambda o: None, "needs a bid"),
    (lambda o: "cheap", "Enter a number"),
    (lambda o: 33, "less than or equal to 32"),
])
async def test_a_bid_the_offer_refuses_is_a_400_and_nothing_is_rented(market, bid, reason):  # noqa: F811
    fake_vast, offers = market
    offer = fake_vast.offers[offers[0]["id"]]
    value = bid(offer)
    staff = await sync_to_async(logged_in)("ops")
    response = await sync_to_async(staff.post)("/remote/offers/rent/", {
        "offer_ids": [offer["id"], offers[2]["id"]], "max_price_per_proof": "0.004",
        "disk_gb": "64", "offer_type": "bid",
        **({"bid_price": f"{value:.4f}" if isinstance(value, float) else str(value)}
           if value is not None else {})})
    body = response.content.decode()
    assert response.status_code == 400 and body.startswith("Not rented: ") and reason in body
    if isinstance(value, float):
        assert f"offer {offer['id']}: " in body and f"${value:.4f}/h" in body
    assert not await Machine.objects.aexists() and not await RemoteMachine.objects.aexists()
    assert [r for r in fake_vast.requests if r[0] == "PUT"] == []  # no create reached Vast
