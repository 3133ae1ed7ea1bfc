"""The ledger against the strict fake's own billing: a rental followed through rent, a price
change at extension, a stop and a start on Vast's side and a destroy there, each written once
at the rate Vast bills; Vast's charges pulled, kept beside the estimate, and one Event when
they differ by more than the configured share."""

import time

import pytest
from asgiref.sync import sync_to_async

from vastmgr.fleet import ledger
from vastmgr.fleet.models import BillingInterval, Event, Machine, ProviderBill
from vastmgr.remote import vast
from vastmgr.remote.vast import RentRequest, VastClient

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)

# Dear enough that the few seconds of a test bill whole cents.
DPH_BASE = 900.0


def client_for(fake_vast, sleep) -> VastClient:
    return VastClient(API_KEY, fake_vast.url, sleep=sleep, jitter=lambda: 0.5)


async def intervals(machine: Machine) -> list[tuple[str, float, int, str]]:
    return [(i.kind, float(i.dollars_per_hour), i.gpus, i.cause) async for i in
            BillingInterval.objects.filter(machine=machine).order_by("started_at", "id")]


async def console(client: VastClient, instance_id: int, state: str) -> None:
    """Stop or start the instance as another Vast client would (the console, the CLI)."""
    await client.call("PUT", f"/api/v0/instances/{instance_id}/", body={"state": state})


async def test_every_change_is_billed_once_at_the_rate_vast_bills(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    offer = fake_vast.add_offer(dph_base=DPH_BASE, num_gpus=2)
    machine = await vast.rent(client, RentRequest.from_offer(offer))
    instance_id = machine.vast_instance_id
    storage = offer["storage_cost"] * vast.DEFAULT_DISK_GB / vast.HOURS_PER_MONTH
    lag_dollars = 0.0  # what the estimate may trail Vast by: each change's $/h × time unseen

    async def seen(change, rate_change: float) -> None:
        nonlocal lag_dollars
        changed_at = time.time()
        await change()
        await vast.reconcile(client)
        lag_dollars += abs(rate_change) * (time.time() - changed_at) / 3600

    async def boot():
        fake_vast.advance(120)  # loading → running

    async def reprice():
        fake_vast.reprice(instance_id, DPH_BASE * 2)  # the contract extended at a new price

    async def vanish():
        fake_vast.vanish(instance_id)  # destroyed on Vast's side

    await seen(boot, DPH_BASE)
    await vast.reconcile(client)  # the same listing again: nothing new to write
    await seen(reprice, DPH_BASE)
    await seen(lambda: console(client, instance_id, "stopped"), 2 * DPH_BASE)
    await seen(lambda: console(client, instance_id, "running"), 2 * DPH_BASE)
    await seen(vanish, 2 * DPH_BASE + storage)

    assert await intervals(machine) == [
        ("stored", pytest.approx(storage, abs=1e-6), 0, "created"),
        ("running", pytest.approx(DPH_BASE + storage, abs=1e-4), 2, "running"),
        ("running", pytest.approx(2 * DPH_BASE + storage, abs=1e-4), 2, "price change"),
        ("stored", pytest.approx(storage, abs=1e-6), 0, "stop"),
        ("running", pytest.approx(2 * DPH_BASE + storage, abs=1e-4), 2, "start"),
    ]
    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED
    # The fake's own segments, rate for rate: the same sequence.
    contract = fake_vast.contracts[instance_id]
    assert [round(s["gpu"] + s["disk"], 4) for s in contract["segments"]] == [
        round(r, 4) for _, r, _, _ in await intervals(machine)]
    # Billing ended with the instance: spend stays, nothing bills.
    reading = await sync_to_async(ledger.Reading.load)()
    assert reading.dollars_per_hour() == 0 and reading.gpus_rented() == 0
    record = fake_vast.billing_records()[instance_id]
    # The estimate differs from Vast only by what changed before a reconcile saw it.
    assert abs(reading.spend(machine.pk) - record["dollars"]) <= lag_dollars + 0.001
    # The test billed enough for the comparison to mean something: ten times its rounding allowance
    # (how much depends on how fast the machine ran the steps above, hence no larger bar).
    assert record["dollars"] > 0.01


async def test_vasts_charges_are_kept_and_a_difference_raises_one_event(
        fake_vast, no_sleep, settings):
    client = client_for(fake_vast, no_sleep)
    machine = await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer(dph_base=1.0)))
    fake_vast.advance(120)
    await vast.reconcile(client)
    assert await vast.pull_bills(client, tolerance=0.05) == 1
    bill = await ProviderBill.objects.aget(machine=machine)
    assert set(bill.items) <= {"gpu", "disk"} and bill.instance_id == machine.vast_instance_id
    assert not await Event.objects.filter(data__alert=ledger.BILLING_ALERT).aexists()

    # Bandwidth the estimate cannot know of: the bill now exceeds it by far more than 5 %.
    fake_vast.charge_bandwidth(machine.vast_instance_id, down=5.0, up=1.0)
    await vast.pull_bills(client, tolerance=0.05)
    await vast.pull_bills(client, tolerance=0.05)
    [alert] = [e async for e in Event.objects.filter(data__alert=ledger.BILLING_ALERT)]
    assert alert.level == "warning" and "billed" in alert.message
    bill = await ProviderBill.objects.aget(machine=machine)
    assert bill.items["bwd"] == pytest.approx(5.0) and bill.items["bwu"] == pytest.approx(1.0)
    # Shown beside the estimate with its age.
    money = await sync_to_async(ledger.machine_money)(machine.pk)
    assert money["billed"] == pytest.approx(float(bill.dollars))
    assert 0 <= money["billed_age"] < 30


async def test_the_charges_endpoint_is_as_strict_as_its_spec(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    with pytest.raises(vast.VastError) as missing:
        await client.call("GET", "/api/v0/charges/", params={"select_filters": {"day": {}}})
    assert missing.value.status == 400
    with pytest.raises(vast.VastError) as token:
        await client.call("GET", "/api/v0/charges/", params={
            "select_filters": {"day": {"gte": 0, "lte": 1}}, "after_token": "%%%"})
    assert token.value.status == 400
    with pytest.raises(vast.VastError) as slashless:
        await client.call("GET", "/api/v0/charges", params={
            "select_filters": {"day": {"gte": 0, "lte": 1}}})
    assert slashless.value.status == 404
