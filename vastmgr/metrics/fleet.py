"""The fleet's metrics, read from the database at scrape time.

Every figure comes from the rows the pages render (the fleet view's `MachineView`s, proof jobs,
events), so a scrape of any dashboard process tells the same truth as the pages, and nothing
is lost when a process restarts. Counters are counts of append-only or final rows (proofs that
ended, events, billed time), so they only grow.

Labels stay bounded: `host` is a machine's name (bounded by the fleet), `kind` a proof kind,
`state`/`connection`/`level` come from fixed vocabularies, `code` from the lie detector's list,
`event_kind` from the code's Event kinds. No job ids.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, F, Min, Q, Sum
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cuzk_engine.vocabulary import KINDS
from vastmgr.fleet.ledger import Reading
from vastmgr.fleet.liveness import LIVE, OFFLINE, STALE
from vastmgr.fleet.models import Event, Machine
from vastmgr.front.readmodel import MachineView, load_machines
from vastmgr.proofs.models import ProofJob

# Proof duration buckets, seconds: a tiny proof takes about one, a large one minutes.
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
NO_HOST = "none"  # a proof that ended before reaching a machine
CONNECTIONS = (LIVE, STALE, OFFLINE)
ALERTED_EVENT_KINDS = ("ssh", "vast", "fault", "alert")


class FleetCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = time.time()
        hosts = load_machines(now)
        yield from _hosts(hosts)
        yield from _cost(hosts)
        yield from _upstream(hosts)
        yield from _proofs()
        yield from _backlog(now)
        yield from _events()


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def _hosts(hosts: list[MachineView]) -> Iterator[Metric]:
    by_state = _gauge("vastmgr_hosts", "Machines by lifecycle state and engine connection "
                      "(killed machines are not counted)", ["state", "connection"])
    counts = Counter((h.machine.state, h.connection) for h in hosts)
    for state in Machine.State.values:
        if state != Machine.State.KILLED:
            for connection in CONNECTIONS:
                by_state.add_metric([state, connection], counts[(state, connection)])
    yield by_state
    up = _gauge("vastmgr_host_up", "1 while the host's engine is live (connected and fresh)",
                ["host"])
    lifecycle = _gauge("vastmgr_host_state", "1 for the machine's current lifecycle state",
                       ["host", "state"])
    enabled = _gauge("vastmgr_host_enabled", "1 while the machine is watched and given work",
                     ["host"])
    seen = _gauge("vastmgr_host_last_seen_timestamp_seconds",
                  "When the controller last heard from the engine (Unix time)", ["host"])
    uptime = _gauge("vastmgr_host_engine_uptime_seconds",
                    "The engine's uptime now (its last snapshot's, aged); drops on a restart",
                    ["host"])
    workers = _gauge("vastmgr_host_gpu_workers", "GPU workers by state (live hosts)",
                     ["host", "state"])
    waiting = _gauge("vastmgr_host_waiting_jobs",
                     "Jobs on the engine no device has touched yet (live hosts)", ["host"])
    for h in hosts:
        name = h.machine.name
        up.add_metric([name], 1 if h.connection == LIVE else 0)
        lifecycle.add_metric([name, h.machine.state], 1)
        enabled.add_metric([name], 1 if h.machine.enabled else 0)
        if h.last_seen_ts is not None:
            seen.add_metric([name], h.last_seen_ts)
        aged = h.aged(h.snapshot.get("uptime_secs"))
        if aged is not None and h.connection != OFFLINE:
            uptime.add_metric([name], aged)
        if h.connection == LIVE:
            workers.add_metric([name, "proving"], h.busy_workers)
            workers.add_metric([name, "idle"], h.idle_workers)
            if h.queue_depth is not None:
                waiting.add_metric([name], h.queue_depth)
    yield from (up, lifecycle, enabled, seen, uptime, workers, waiting)


def _cost(hosts: list[MachineView]) -> Iterator[Metric]:
    dph = _gauge("vastmgr_host_cost_dollars_per_hour",
                 "What the machine bills now ($/h; 0 while not billed)", ["host"])
    spent = CounterMetricFamily("vastmgr_host_spent_dollars",
                                "Money spent on the machine since billing started", labels=["host"])
    for h in hosts:
        dph.add_metric([h.machine.name], h.running_dph)
        if h.spent is not None:
            spent.add_metric([h.machine.name], h.spent)
    yield dph
    yield spent
    # The fleet's own figures, destroyed rentals included: the spend counter never goes down
    # when a machine is destroyed (its host series simply ends).
    money = Reading.load()
    fleet_spent = CounterMetricFamily(
        "vastmgr_fleet_spent_dollars", "Money the fleet ever spent (the ledger's estimate, "
        "destroyed and killed rentals included)")
    fleet_spent.add_metric([], money.spend())
    yield fleet_spent
    fleet_dph = _gauge("vastmgr_fleet_cost_dollars_per_hour", "What the fleet bills now ($/h)")
    fleet_dph.add_metric([], money.dollars_per_hour())
    yield fleet_dph
    gpus = _gauge("vastmgr_fleet_gpus_rented", "GPUs rented now (the ledger)")
    gpus.add_metric([], money.gpus_rented())
    yield gpus
    billed = money.billed()
    if billed is not None:
        vast_billed = _gauge("vastmgr_fleet_billed_dollars",
                             "What Vast billed for the fleet, as last pulled from its charges")
        vast_billed.add_metric([], billed.dollars)
        yield vast_billed
    budget = settings.VASTMGR_BUDGET_DOLLARS_PER_HOUR
    if budget is not None:
        limit = _gauge("vastmgr_budget_dollars_per_hour",
                       "The fleet's $/h budget (VASTMGR_BUDGET_DOLLARS_PER_HOUR)")
        limit.add_metric([], budget)
        yield limit


def _upstream(hosts: list[MachineView]) -> Iterator[Metric]:
    present = _gauge("vastmgr_upstream_lie", "1 while the upstream daemon's latest snapshot "
                     "shows this kind of contradiction", ["host", "code"])
    episodes = CounterMetricFamily(
        "vastmgr_upstream_lie_episodes", "Times each kind of contradiction appeared in an "
        "upstream daemon's snapshots since its controller started watching",
        labels=["host", "code"])
    for h in hosts:
        for row in h.snapshot.get("lie_tally", []):
            present.add_metric([h.machine.name, row["code"]], 1 if row["present"] else 0)
            episodes.add_metric([h.machine.name, row["code"]], row["episodes"])
    yield present
    yield episodes


def _proofs() -> Iterator[Metric]:
    ended = CounterMetricFamily("vastmgr_proofs",
                                "Proof jobs that ended, by kind, machine and final status",
                                labels=["kind", "host", "status"])
    for row in (ProofJob.objects.filter(status__in=ProofJob.FINAL)
                .values("kind", "machine__name", "status").annotate(n=Count("id"))
                .order_by("kind", "machine__name", "status")):
        ended.add_metric([row["kind"], row["machine__name"] or NO_HOST, row["status"]], row["n"])
    yield ended
    durations = HistogramMetricFamily(
        "vastmgr_proof_duration_seconds",
        "Duration of proofs that ended done: from their submission on the engine until nothing "
        "of them ran any more", labels=["kind"])
    took = F("engine_duration")  # the one definition (proofs.progress.proof_duration_ms)
    buckets = {f"le_{i}": Count("id", filter=Q(took__lte=timedelta(seconds=bound)))
               for i, bound in enumerate(DURATION_BUCKETS)}
    rows = {row["kind"]: row for row in
            ProofJob.objects.filter(status=ProofJob.Status.DONE, engine_duration__isnull=False)
            .alias(took=took).values("kind")
            .annotate(count=Count("id"), total=Sum(took), **buckets).order_by("kind")}
    for kind in KINDS:
        row = rows.get(kind)
        if row is None:
            continue
        cumulative = [(floatToGoString(bound), row[f"le_{i}"])
                      for i, bound in enumerate(DURATION_BUCKETS)]
        durations.add_metric([kind], [*cumulative, ("+Inf", row["count"])],
                             row["total"].total_seconds())
    yield durations


def _backlog(now: float) -> Iterator[Metric]:
    jobs = _gauge("vastmgr_backlog_jobs", "Proof jobs queued on the dashboard, waiting for a "
                  "machine", ["kind"])
    age = _gauge("vastmgr_backlog_oldest_age_seconds",
                 "How long the oldest queued job of the kind has waited", ["kind"])
    budget = _gauge("vastmgr_backlog_budget_seconds",
                    "How long a job of the kind may wait (VASTMGR_BACKLOG_BUDGET_<KIND>_S)",
                    ["kind"])
    queued = {row["kind"]: row for row in ProofJob.objects.filter(status=ProofJob.Status.QUEUED)
              .values("kind").annotate(n=Count("id"), oldest=Min("submitted_at"))
              .order_by("kind")}
    for kind in KINDS:
        row = queued.get(kind)
        jobs.add_metric([kind], row["n"] if row else 0)
        age.add_metric([kind], max(0.0, now - row["oldest"].timestamp()) if row else 0.0)
        budget.add_metric([kind], settings.VASTMGR_BACKLOG_BUDGET_SECONDS[kind])
    yield from (jobs, age, budget)


def _events() -> Iterator[Metric]:
    """Events by kind and level: `ssh`/`vast` at level error are the SSH and Vast errors,
    `fault` the controller's and automation's failed ticks, `alert` the alerts raised."""
    events = CounterMetricFamily("vastmgr_events", "Events recorded, by kind and level",
                                 labels=["event_kind", "level"])
    # The kinds operators alert on exist from the start, so rate() has a series to read.
    counts = {(kind, Event.Level.ERROR.value): 0 for kind in ALERTED_EVENT_KINDS}
    for row in Event.objects.values("kind", "level").annotate(n=Count("id")).order_by():
        counts[(row["kind"], row["level"])] = row["n"]
    for (kind, level), n in sorted(counts.items()):
        events.add_metric([kind, level], n)
    yield events
