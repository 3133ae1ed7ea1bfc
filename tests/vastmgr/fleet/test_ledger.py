"""The ledger owns money: intervals written once per change, spend that never goes down (a
destroyed or deleted machine's money stays), windows, $/proof by its rule, and the provider's
bill held against the estimate with one Event per crossing."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from vastmgr.fleet import ledger
from vastmgr.fleet.models import BillingInterval, Event, Machine, ProviderBill

pytestmark = pytest.mark.django_db

HOUR = 3600.0


def rented(name: str, price: str, gpus: int = 1, instance: int | None = None) -> Machine:
    return Machine.objects.create(name=name, provider="vast", price_per_hour=Decimal(price),
                                  gpu_count=gpus, vast_instance_id=instance)


def test_a_rental_bills_each_rate_in_its_interval_and_its_money_outlives_it():
    t0 = timezone.now() - timedelta(hours=10)
    gpu = rented("gpu-1", "0.5", gpus=2)
    ledger.bill(gpu, "running", "0.5", gpus=2, cause="rent", at=t0)
    # The same state seen again (by the reconcile after the product) writes nothing.
    assert ledger.bill(gpu, "running", "0.5", gpus=2, cause="rent",
                       at=t0 + timedelta(hours=1)) is None
    ledger.bill(gpu, "running", "0.8", gpus=2, cause="price change", at=t0 + timedelta(hours=2))
    ledger.bill(gpu, "stored", "0.01", cause="stop", at=t0 + timedelta(hours=4))
    ledger.bill(gpu, "running", "0.8", gpus=2, cause="start", at=t0 + timedelta(hours=6))
    now = (t0 + timedelta(hours=7)).timestamp()
    reading = ledger.Reading.load(now)
    # 2 h at 0.5 + 2 h at 0.8 + 2 h at 0.01 + 1 h at 0.8
    assert reading.spend() == pytest.approx(1.0 + 1.6 + 0.02 + 0.8)
    assert reading.dollars_per_hour() == pytest.approx(0.8)
    assert reading.gpus_rented() == 2
    assert reading.spend(since=now - 2 * HOUR) == pytest.approx(0.01 + 0.8)
    assert [i.cause for i in BillingInterval.objects.all()] == [
        "rent", "price change", "stop", "start"]

    ledger.stop_billing(gpu, t0 + timedelta(hours=7))
    gpu.kill("destroyed")
    later = ledger.Reading.load(now + 5 * HOUR)
    assert later.spend() == pytest.approx(reading.spend())  # never goes down, never grows
    assert later.dollars_per_hour() == 0 and later.gpus_rented() == 0
    gpu.delete()
    assert ledger.Reading.load(now + 6 * HOUR).spend() == pytest.approx(reading.spend())


def test_a_stopped_rental_bills_its_disk_and_holds_no_gpu():
    t0 = timezone.now() - timedelta(hours=1)
    gpu = rented("gpu-1", "0.4", gpus=4)
    ledger.bill(gpu, "stored", "0.02", gpus=4, cause="stop", at=t0)
    reading = ledger.Reading.load()
    assert reading.gpus_rented() == 0 and reading.billing_now(gpu.pk)
    assert reading.dollars_per_hour() == pytest.approx(0.02)


def test_cost_per_proof_is_the_window_spend_over_every_proof_delivered_in_it():
    now = timezone.now()
    paid = rented("paid", "1.0")
    ledger.bill(paid, "running", "1.0", cause="rent", at=now - timedelta(hours=30))
    reading = ledger.Reading.load(now.timestamp())
    # 24 h of the window at $1/h over 48 proofs (whatever machine proved them).
    assert reading.per_proof(48) == pytest.approx(0.5)
    assert reading.per_proof(0) is None
    assert "÷ proofs delivered" in ledger.PER_PROOF_RULE


def test_the_bill_is_kept_and_a_difference_raises_one_event_per_crossing():
    start = timezone.now() - timedelta(hours=1)
    gpu = rented("gpu-1", "1.0", instance=77)
    ledger.bill(gpu, "running", "1.0", cause="rent", at=start)
    at = start + timedelta(hours=1)
    assert ledger.record_bills({77: (1.02, {"gpu": 1.0, "disk": 0.02})}, at,
                               tolerance=0.05) is None  # within 5 %: nothing to say
    assert ProviderBill.objects.get().dollars == Decimal("1.0200")
    differs = ledger.record_bills({77: (1.5, {"gpu": 1.5})}, at, tolerance=0.05)
    assert differs is not None and differs.level == "warning"
    assert "$1.0000" in differs.message and "$1.5000" in differs.message
    assert ledger.record_bills({77: (1.6, {"gpu": 1.6})}, at, tolerance=0.05) is None  # once
    back = ledger.record_bills({77: (1.0, {"gpu": 1.0})}, at, tolerance=0.05)
    assert back is not None and "agrees" in back.message
    assert Event.objects.filter(data__alert=ledger.BILLING_ALERT).count() == 2
    reading = ledger.Reading.load(at.timestamp() + 60)
    billed = reading.billed()
    assert billed is not None and billed.dollars == pytest.approx(1.0)
    assert billed.age_s(reading.now) == pytest.approx(60, abs=1)
