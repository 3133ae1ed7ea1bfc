"""The planner's snapshot from what the product already knows: proof jobs, machines, their
lifecycle events, bench history (MachinePerf), the bad-machines list and the market's offers."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

from django.db.models import Max

from cuzk_engine.vocabulary import DEFAULT_PRIORITIES, KINDS
from vastmgr.autopilot import planner
from vastmgr.autopilot.models import Autopilot, ManagedMachine
from vastmgr.autopilot.planner import Host, KindWork, MachinePhase, Offer, PlannerInput
from vastmgr.fleet.ledger import Reading
from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import state_since
from vastmgr.remote.models import BadMachine, MachinePerf

# Until a host of the provider has come up: Vast boot, install, parameters and benchmark.
PRIOR_PIPELINE_S = 15 * 60.0
PIPELINE_HISTORY = 20  # the last this many hosts that came up
ARRIVAL_WINDOW = timedelta(minutes=15)
MEASURED_JOBS = 3  # finished jobs of a kind on a host before its own rate is trusted
STARTING_STATES = (Machine.State.REGISTERED, Machine.State.PROVISIONING,
                   Machine.State.PARAMS_READY, Machine.State.BENCHMARKED)


def pipeline_s(provider: str) -> float:
    """The 90th percentile of rent-to-running times of the provider's recent hosts."""
    times = []
    for machine in Machine.objects.filter(provider=provider).order_by("-created")[:100]:
        reached = (Event.objects.filter(machine=machine, kind="lifecycle",
                                        data__to=Machine.State.RUNNING)
                   .order_by("time").values_list("time", flat=True).first())
        if reached is not None:
            times.append((reached - machine.created).total_seconds())
        if len(times) >= PIPELINE_HISTORY:
            break
    if not times:
        return PRIOR_PIPELINE_S
    times.sort()
    return times[min(len(times) - 1, int(0.9 * len(times)))]


def work(pilot: Autopilot, now: datetime) -> tuple[KindWork, ...]:
    unfinished = ProofJob.objects.filter(status__in=(
        ProofJob.Status.QUEUED, *ProofJob.IN_FLIGHT)).order_by("submitted_at")
    recent = ProofJob.objects.filter(submitted_at__gt=now - ARRIVAL_WINDOW)
    per_hour = timedelta(hours=1) / ARRIVAL_WINDOW
    found = []
    for kind in KINDS:
        jobs = unfinished.filter(kind=kind)
        oldest = jobs.first()
        priority = oldest.priority if oldest else DEFAULT_PRIORITIES[kind]
        found.append(KindWork(
            kind, jobs.count(),
            (now - oldest.submitted_at).total_seconds() if oldest else 0.0,
            pilot.budget_s(kind, priority), recent.filter(kind=kind).count() * per_hour))
    return tuple(found)


def per_gpu_bench(gpu_name: str) -> list[float]:
    return [p.proofs_per_hour / max(p.gpu_count, 1)
            for p in MachinePerf.objects.filter(gpu_name=gpu_name)]


def bench_rates(porep_equivalent: float, bench_kind: str) -> dict[str, float]:
    """Rates per kind from a benchmark rate of `bench_kind`."""
    scale = planner.KIND_WORK[bench_kind]
    return {kind: porep_equivalent * scale / w for kind, w in planner.KIND_WORK.items()}


def machine_rates(machine: Machine, settings: RemoteSettings, now: datetime) -> dict[str, float]:
    """Per kind: the host's own rate from its finished jobs of the last day where it has
    enough of them, else its benchmark (or its GPU model's, or the gate's minimum) scaled by
    each kind's work."""
    bench = machine.bench_rate or statistics.median(
        per_gpu_bench(machine.gpu_name) or [settings.min_bench_rate / max(
            machine.gpu_count, 1)]) * max(machine.gpu_count, 1)
    rates = bench_rates(bench, settings.bench_kind)
    done = ProofJob.objects.filter(machine=machine, status=ProofJob.Status.DONE,
                                   finished_at__gt=now - timedelta(days=1),
                                   started_at__isnull=False)
    for kind in KINDS:
        spans = [(j.finished_at - j.started_at).total_seconds()
                 for j in done.filter(kind=kind).only("started_at", "finished_at")[:50]]
        if len(spans) >= MEASURED_JOBS and sum(spans) > 0:
            rates[kind] = 3600 * len(spans) / sum(spans)
    return rates


def hosts(settings: RemoteSettings, now: datetime,
          money: Reading | None = None) -> tuple[Host, ...]:
    """The machines the planner counts as capacity. A host's $/h is what the ledger bills for
    it now, or its quoted price while it does not bill that much yet (starting: it will)."""
    money = money or Reading.load(now.timestamp())
    found = []
    for machine in Machine.objects.exclude(state__in=(Machine.State.KILLED,
                                                      Machine.State.STOPPED)).filter(
            enabled=True).select_related("autopilot"):
        managed = getattr(machine, "autopilot", None)
        if managed is not None and managed.draining:
            phase = MachinePhase.DRAINING
        elif machine.state == Machine.State.RUNNING:
            phase = MachinePhase.PROVING
        elif managed is not None and machine.state in STARTING_STATES:
            phase = MachinePhase.STARTING
        else:
            continue  # an operator's host on its way: not capacity the autopilot can count on
        jobs = ProofJob.objects.filter(machine=machine)
        in_flight = jobs.in_flight().count()
        last_work = jobs.aggregate(last=Max("finished_at"))["last"]
        since = max(filter(None, [last_work, state_since(machine)]))
        rented = managed.rented_at if managed is not None else machine.created
        found.append(Host(
            machine.pk, machine.name, phase,
            max(money.dollars_per_hour(machine.pk), float(machine.price_per_hour or 0)),
            machine_rates(machine, settings, now), in_flight, (now - rented).total_seconds(),
            0.0 if in_flight else (now - since).total_seconds(), managed is not None,
            machine.vast_machine_id))
    return tuple(found)


def offers(raw: list[dict], settings: RemoteSettings) -> tuple[Offer, ...]:
    """The market's offers with estimated rates; models that bench below the gate left out."""
    found = []
    for bare in filter(None, map(planner.offer_from_vast, raw)):
        estimated = planner.estimate_offer(bare, per_gpu_bench(bare.gpu_name),
                                           bench_kind=settings.bench_kind,
                                           min_bench_rate=settings.min_bench_rate,
                                           work=planner.KIND_WORK)
        if estimated is not None:
            found.append(estimated)
    return tuple(found)


def billed_elsewhere(counted: tuple[Host, ...], money: Reading) -> float:
    """$/h the ledger bills now for machines the planner does not count (an operator's machine
    still registering, a stopped rental's disk...): the caps are held against all of it."""
    return max(0.0, money.dollars_per_hour()
               - sum(money.dollars_per_hour(h.machine_id) for h in counted))


def committed_per_hour(counted: tuple[Host, ...], money: Reading) -> float:
    """What the caps are checked against: the ledger's $/h now, with the full price of the
    counted hosts that do not bill it yet."""
    return billed_elsewhere(counted, money) + sum(h.price_per_hour for h in counted)


def build(pilot: Autopilot, raw_offers: list[dict], now: datetime) -> PlannerInput:
    settings = RemoteSettings.load()
    last_change = pilot.last_change_at.timestamp() if pilot.last_change_at else None
    money = Reading.load(now.timestamp())
    counted = hosts(settings, now, money)
    return PlannerInput(
        now.timestamp(), work(pilot, now), counted, offers(raw_offers, settings),
        pilot.limits(), pipeline_s(Machine.Provider.VAST),
        frozenset(BadMachine.objects.filter(provider=Machine.Provider.VAST)
                  .values_list("provider_machine_id", flat=True)),
        ManagedMachine.objects.filter(rented_at__gt=now - timedelta(hours=1)).count(),
        last_change, billed_elsewhere(counted, money))
