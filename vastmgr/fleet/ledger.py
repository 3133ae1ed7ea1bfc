"""The ledger: the one owner of money.

Every rental is a run of billing intervals (`BillingInterval`), each at the $/h in force then:
running (GPUs and disk bill), stored (stopped: the disk bills), closed when the rental ends.
They are written where the state changes (rent, a price change at extension, stop, start,
destroy, kill; outside the product too, as the reconcile sees it), once each, and kept for
ever. Everything the product shows about money is read here: spend (all time or any window),
$/h now, GPUs rented, $/proof, and what the provider billed (`ProviderBill`, pulled from
Vast's charges) beside that estimate. Nothing else computes money.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from vastmgr.fleet.models import BillingInterval, Event, Machine, ProviderBill

# $/proof is measured over this window: spend of the window ÷ proofs delivered in it.
PER_PROOF_WINDOW = timedelta(hours=24)
PER_PROOF_RULE = ("spend of the last 24 h ÷ proofs delivered in the last 24 h, every machine "
                  "counted (killed ones and those without a price included)")
# A difference between estimate and bill below this many dollars is rounding, not a finding
# (Vast rounds each charge to 3 decimals and bills by the second).
BILL_DIFFERENCE_FLOOR = 0.01
BILLING_ALERT = "billing_difference"

RATE_PLACES = Decimal("0.000001")


def _rate(dollars_per_hour: float | Decimal) -> Decimal:
    return Decimal(str(dollars_per_hour)).quantize(RATE_PLACES)


def bill(machine: Machine, kind: str, dollars_per_hour: float | Decimal, *, cause: str,
         gpus: int = 0, at: datetime | None = None) -> BillingInterval | None:
    """From `at` (default now), `machine` bills at this rate: its open interval closes and a
    new one opens. Nothing is written when the open interval already bills the same, so a
    change seen twice (by the product and by the next reconcile) is written once."""
    rate = _rate(dollars_per_hour)
    gpus = gpus if kind == BillingInterval.Kind.RUNNING else 0
    with transaction.atomic():
        current = (BillingInterval.objects.select_for_update()
                   .filter(machine=machine, ended_at__isnull=True).first())
        if current is not None and (current.kind, current.dollars_per_hour, current.gpus) == (
                kind, rate, gpus):
            return None
        at = at or timezone.now()
        if current is not None:
            current.ended_at = max(at, current.started_at)
            current.save(update_fields=["ended_at"])
        return BillingInterval.objects.create(
            machine=machine, machine_name=machine.name, kind=kind, dollars_per_hour=rate,
            gpus=gpus, started_at=at, cause=cause)


def stop_billing(machine: Machine, at: datetime | None = None) -> None:
    """The rental ended (destroyed, killed, gone from the provider): nothing bills from `at`."""
    at = at or timezone.now()
    with transaction.atomic():
        for current in BillingInterval.objects.select_for_update().filter(
                machine=machine, ended_at__isnull=True):
            current.ended_at = max(at, current.started_at)
            current.save(update_fields=["ended_at"])


def dollars_per_proof(spend: float, proofs: int) -> float | None:
    """The rule of PER_PROOF_RULE: None when no proof was delivered."""
    return spend / proofs if proofs else None


@dataclass(frozen=True)
class _Span:
    machine_id: int | None
    kind: str
    dollars_per_hour: float
    gpus: int
    start: float
    end: float | None

    def cost(self, since: float | None, until: float) -> float:
        start = self.start if since is None else max(self.start, since)
        end = until if self.end is None else min(self.end, until)
        return self.dollars_per_hour * max(end - start, 0.0) / 3600


@dataclass(frozen=True)
class Billed:
    """What the provider billed for some rentals, and the oldest of those figures' time."""

    dollars: float
    fetched_at: float | None

    def age_s(self, now: float) -> float | None:
        return None if self.fetched_at is None else max(0.0, now - self.fetched_at)


class Reading:
    """The ledger read at one moment (`now`, epoch seconds): load it once per page, answer,
    API call or metrics scrape, so that every figure it shows is of the same moment."""

    def __init__(self, now: float, spans: Iterable[_Span], bills: Iterable[ProviderBill]):
        self.now = now
        self.spans = tuple(spans)
        self.by_machine: dict[int | None, list[_Span]] = {}
        for span in self.spans:
            self.by_machine.setdefault(span.machine_id, []).append(span)
        self.bills = {b.machine_id: b for b in bills}

    @classmethod
    def load(cls, now: float | None = None,
             machine_ids: Iterable[int] | None = None) -> Reading:
        intervals = BillingInterval.objects.all()
        bills = ProviderBill.objects.all()
        if machine_ids is not None:
            ids = list(machine_ids)
            intervals = intervals.filter(machine_id__in=ids)
            bills = bills.filter(machine_id__in=ids)
        spans = [_Span(i.machine_id, i.kind, float(i.dollars_per_hour), i.gpus,
                       i.started_at.timestamp(), i.ended_at.timestamp() if i.ended_at else None)
                 for i in intervals]
        return cls(time.time() if now is None else now, spans, list(bills))

    def _of(self, machine_id: int | None) -> Iterable[_Span]:
        if machine_id is None:
            return self.spans
        return self.by_machine.get(machine_id, ())

    def _open(self, machine_id: int | None) -> Iterable[_Span]:
        return (s for s in self._of(machine_id) if s.end is None or s.end > self.now)

    def spend(self, machine_id: int | None = None, *, since: float | None = None,
              until: float | None = None) -> float:
        """Dollars billed (estimated) between `since` (default: ever) and `until` (now), of
        one machine or of the whole fleet, destroyed rentals included."""
        until = self.now if until is None else min(until, self.now)
        return sum(s.cost(since, until) for s in self._of(machine_id))

    def ever_billed(self, machine_id: int) -> bool:
        return any(True for _ in self._of(machine_id))

    def dollars_per_hour(self, machine_id: int | None = None) -> float:
        """What bills now ($/h): the open intervals' rates (a stopped rental's disk included)."""
        return sum(s.dollars_per_hour for s in self._open(machine_id))

    def gpus_rented(self, machine_id: int | None = None) -> int:
        """GPUs billed now (a stopped rental holds none)."""
        return sum(s.gpus for s in self._open(machine_id))

    def billing_now(self, machine_id: int) -> bool:
        return any(True for _ in self._open(machine_id))

    def spend_window(self, window: timedelta = PER_PROOF_WINDOW) -> float:
        return self.spend(since=self.now - window.total_seconds())

    def per_proof(self, proofs_delivered: int, window: timedelta = PER_PROOF_WINDOW,
                  machine_id: int | None = None) -> float | None:
        """$/proof over `window`: its spend ÷ the proofs delivered in it (PER_PROOF_RULE)."""
        spend = self.spend(machine_id, since=self.now - window.total_seconds())
        return dollars_per_proof(spend, proofs_delivered)

    def billed(self, machine_id: int | None = None) -> Billed | None:
        """What the provider billed (all time) for one machine, or for every machine it
        billed; None when no bill was pulled yet."""
        bills = list(self.bills.values()) if machine_id is None else (
            [self.bills[machine_id]] if machine_id in self.bills else [])
        if not bills:
            return None
        return Billed(sum(float(b.dollars) for b in bills),
                      min(b.fetched_at.timestamp() for b in bills))


def record_bills(charges: dict[int, tuple[float, dict[str, float]]], fetched_at: datetime,
                 *, tolerance: float) -> Event | None:
    """Keep the provider's charges (instance id → (dollars, items)) of our machines and hold
    them against the ledger's estimate over the same rentals: one Event when they start to
    differ by more than `tolerance` (a share of the bill), one when they agree again."""
    machines = {m.vast_instance_id: m for m in Machine.objects.filter(
        vast_instance_id__in=list(charges))}
    for instance_id, (dollars, items) in charges.items():
        machine = machines.get(instance_id)
        ProviderBill.objects.update_or_create(instance_id=instance_id, defaults={
            "machine": machine, "machine_name": machine.name if machine else f"vast-{instance_id}",
            "dollars": Decimal(str(dollars)).quantize(Decimal("0.0001")), "items": items,
            "fetched_at": fetched_at})
    billed_ids = [m.pk for m in machines.values()]
    if not billed_ids:
        return None
    reading = Reading.load(fetched_at.timestamp(), billed_ids)
    estimate = reading.spend()
    billed = sum(charges[i][0] for i in machines)
    difference = abs(estimate - billed)
    differs = difference > max(BILL_DIFFERENCE_FLOOR, tolerance * billed)
    latest = (Event.objects.filter(kind="alert", data__alert=BILLING_ALERT)
              .order_by("-time", "-id").first())
    if differs == bool(latest and latest.data.get("differs")):
        return None
    share = f"{100 * difference / billed:.0f} %" if billed else "all of it"
    message = (f"the estimated spend ${estimate:.4f} differs from what Vast billed "
               f"${billed:.4f} by {share} (more than {100 * tolerance:.0f} %)" if differs else
               f"the estimated spend ${estimate:.4f} agrees with what Vast billed "
               f"${billed:.4f} again")
    return Event.record("alert", message,
                        level=Event.Level.WARNING if differs else Event.Level.INFO,
                        data={"alert": BILLING_ALERT, "differs": differs,
                              "estimated": round(estimate, 4), "billed": round(billed, 4),
                              "tolerance": tolerance})


def machine_money(machine_id: int, now: float | None = None) -> dict:
    """One machine's money as its pages show it: $/h now, GPUs billed, spend (None if it never
    billed), and what Vast billed with that figure's age (None before the first pull)."""
    reading = Reading.load(now, [machine_id])
    billed = reading.billed(machine_id)
    return {"billing": reading.billing_now(machine_id),
            "dph": reading.dollars_per_hour(machine_id),
            "gpus": reading.gpus_rented(machine_id),
            "spent": reading.spend(machine_id) if reading.ever_billed(machine_id) else None,
            "billed": billed.dollars if billed else None,
            "billed_age": billed.age_s(reading.now) if billed else None}
