"""The fleet read model: each machine as its row and panel show it (`MachineView`), the fleet's
totals and summary cards, and a machine's history charts, all read from database rows.

Every page, the JSON API, `/metrics` and the notifier read the fleet through here; the HTML of
`render` is one of its readers. The connection state is judged against `now`, so every process
that reads the same rows at the same moment reads the same truth.

A stored snapshot is read as a `PartialSnapshot`: an upstream daemon's lacks fields, and what a
daemon did not report is shown as "not reported", never as 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import ClassVar

from django.db.models import Count, Min, Q
from django.utils import timezone

from vastmgr.fleet.ledger import PER_PROOF_RULE, Billed, Reading
from vastmgr.fleet.liveness import LIVE, OFFLINE, OUTBID, machine_connection
from vastmgr.fleet.models import Event, Machine, MachineSample, MachineStatus
from vastmgr.fleet.partial_snapshot import (
    PartialMemory,
    PartialSnapshot,
    PartialWorker,
    idle_with_work_waiting,
    pending_handles,
)
from vastmgr.proofs.models import ProofJob
from vastmgr.proofs.progress import (
    NOT_STARTED,
    pipeline_phase,
)
from vastmgr.remote.models import BadMachine, Secret, UnmanagedInstance, VastSync

# The idle-GPU flag is raised only once the condition has held this long on the controller's
# clock: between a submission and the next worker pickup it is true for a moment, and a flag
# that flashes on every submission says nothing.
IDLE_FLAG_HOLD = 5.0
# A machine in these states whose engine never answered has simply not started one yet.
NOT_STARTED_STATES = frozenset({Machine.State.REGISTERED, Machine.State.PROVISIONING,
                                Machine.State.PARAMS_READY})
NEW = "new"  # MachineView.presence of such a machine


@dataclass
class MachineView:
    """One host as the fleet row and panel show it; the derived values are computed once per
    render (templates ask for them several times, for hundreds of rows a tick).

    A view is kept from one render to the next while its rows are the same (`same_rows`) and
    moved to the next render's time with `at`: what it computed from the rows alone stays,
    what moves with the clock is computed again (the fleet controller renders its thousand
    hosts' totals twice a second)."""

    machine: Machine
    status: MachineStatus | None
    now: float
    done_24h: int = 0
    failed_24h: int = 0
    bad_host: BadMachine | None = None  # its provider machine is on the bad-machines list
    reading: Reading | None = None  # the ledger as this render reads it (see `money`)

    # The cached values that depend on `now`: dropped when the view moves in time.
    MOVES_WITH_NOW: ClassVar[tuple[str, ...]] = ("connection",)

    def __post_init__(self) -> None:
        # The machine's last seen as this view read it: the controller moves it in place.
        self._last_seen = self.machine.last_seen

    def same_rows(self, machine: Machine, status: MachineStatus | None, done_24h: int,
                  failed_24h: int, bad_host: BadMachine | None) -> bool:
        """Whether a view of these rows would be this one (at another time)."""
        return (machine is self.machine and status is self.status
                and machine.last_seen == self._last_seen and done_24h == self.done_24h
                and failed_24h == self.failed_24h and bad_host is self.bad_host)

    def at(self, now: float) -> MachineView:
        """This view moved to `now`."""
        self.now = now
        for name in self.MOVES_WITH_NOW:
            self.__dict__.pop(name, None)
        return self

    @cached_property
    def snapshot(self) -> PartialSnapshot:
        if self.status is None or not self.status.snapshot:
            return {}
        return self.status.snapshot

    @cached_property
    def last_seen_ts(self) -> float | None:
        return self.machine.last_seen.timestamp() if self.machine.last_seen else None

    @property
    def snapshot_age(self) -> float | None:
        """Seconds since the stored snapshot was taken: its relative times are this much older."""
        taken = self.status.snapshot_at if self.status else None
        if taken is None:
            return None if self.last_seen_ts is None else max(0.0, self.now - self.last_seen_ts)
        return max(0.0, self.now - taken.timestamp())

    @property
    def snapshot_at(self) -> float | None:
        """When the shown snapshot was taken (the controller's receipt, seconds since the
        epoch); what `data-snapshot-at` says."""
        taken = self.status.snapshot_at if self.status else None
        return None if taken is None else taken.timestamp()

    @property
    def stale(self) -> bool:
        """Data is shown but the engine is not live: every value is as old as the snapshot."""
        return bool(self.snapshot) and self.connection != LIVE

    @property
    def live(self) -> bool:
        """Its engine's figures are current: its running clocks may run. Otherwise each stops
        at the last snapshot and says how old it is (`{% ticking … of=view %}`)."""
        return self.connection == LIVE

    def aged(self, seconds_ago: float | None) -> float | None:
        """A snapshot's "N s ago" made current: add the snapshot's own age."""
        if seconds_ago is None:
            return None
        return seconds_ago + (self.snapshot_age or 0.0)

    @cached_property
    def connection(self) -> str:
        status = self.status
        state = OFFLINE if status is None else machine_connection(
            self.machine.enabled, status.connected, self._last_seen, status.interval, self.now)
        if state != LIVE and self.billing is not None and \
                self.billing.vast_status == OUTBID:
            return OUTBID  # not lost: Vast stopped it for a higher bid
        return state

    @property
    def presence(self) -> str:
        """The connection as a person should read it: a machine still being set up whose
        engine has never answered is `new` (shown as "not started yet"), not an alarm; every
        other machine shows its connection. The connection itself stays the truth for
        `data-conn`, metrics and alerts."""
        if (self.connection == OFFLINE and self.last_seen_ts is None
                and self.machine.state in NOT_STARTED_STATES):
            return NEW
        return self.connection

    @property
    def seen_ago(self) -> int | None:
        return None if self.last_seen_ts is None else max(0, int(self.now - self.last_seen_ts))

    @cached_property
    def workers(self) -> list[PartialWorker]:
        return self.snapshot.get("gpu_workers", [])

    @cached_property
    def busy_workers(self) -> int:
        return sum(1 for w in self.workers if w.get("state") == "proving")

    @property
    def idle_workers(self) -> int:
        return len(self.workers) - self.busy_workers

    @property
    def devices(self) -> list[dict]:
        return self.snapshot.get("devices", [])

    @cached_property
    def queue_depth(self) -> int | None:
        """Jobs on the engine that no device has touched yet: queued for synthesis, or
        synthesized (wholly or partly) and waiting for a device. None when the engine reports
        no pipelines at all (an upstream daemon may not): unknown, not zero."""
        if "pipelines" not in self.snapshot:
            return None
        return sum(1 for p in self.snapshot["pipelines"] if pipeline_phase(p) in NOT_STARTED)

    @cached_property
    def partitions_waiting(self) -> int | float:
        """Synthesized partitions waiting for a device, over all jobs."""
        return pending_handles(self.snapshot)

    @cached_property
    def memory(self) -> dict:
        memory: PartialMemory = self.snapshot.get("memory", {})
        total = memory.get("total_bytes", 0)
        used = memory.get("used_bytes", 0)
        percent = round(100 * used / total, 1) if total else 0
        level = "bad" if percent > 85 else "warn" if percent > 60 else "ok"
        return {"used": used, "total": total, "percent": percent, "level": level}

    @property
    def gpu_idle_while_waiting(self) -> bool:
        # Synthesized partitions waiting for a device while a worker sits idle: a real loss,
        # once it has lasted (see IDLE_FLAG_HOLD).
        since = self.status.idle_waiting_since if self.status else None
        return (self.connection == LIVE and since is not None
                and self.now - since.timestamp() >= IDLE_FLAG_HOLD
                and idle_with_work_waiting(self.snapshot))

    # ---- cost: read from the ledger (vastmgr.fleet.ledger), which owns money

    @cached_property
    def billing(self):
        """The remote app's record (billing start and end, Vast's facts), if it has one."""
        # Cached: a machine without one raises (and getattr catches) on every look.
        return getattr(self.machine, "remote", None)

    def money(self) -> Reading:
        """The ledger as this render reads it (machine_views sets it; a lone view loads it)."""
        if self.reading is None or self.reading.now != self.now:
            self.reading = Reading.load(self.now, [self.machine.pk])
        return self.reading

    @property
    def billing_active(self) -> bool:
        return self.money().billing_now(self.machine.pk)

    @property
    def running_dph(self) -> float:
        return self.money().dollars_per_hour(self.machine.pk)

    @property
    def gpus_rented(self) -> int:
        return self.money().gpus_rented(self.machine.pk)

    @property
    def spent(self) -> float | None:
        """All it ever billed; None when it never billed (no price, never rented)."""
        if not self.money().ever_billed(self.machine.pk):
            return None
        return self.money().spend(self.machine.pk)

    @property
    def spent_24h(self) -> float | None:
        if not self.money().ever_billed(self.machine.pk):
            return None
        return self.money().spend(self.machine.pk, since=self.now - 24 * 3600)

    @property
    def cost_per_proof(self) -> float | None:
        """Measured: what the last 24 h cost divided by the proofs it delivered in them."""
        if not self.money().ever_billed(self.machine.pk):
            return None
        return self.money().per_proof(self.done_24h, machine_id=self.machine.pk)

    @property
    def billed(self) -> Billed | None:
        """What Vast billed for it (all time), as last pulled."""
        return self.money().billed(self.machine.pk)

    # ---- hardware, as the provider reports it (Vast's instance record), else the machine row

    @property
    def vast_facts(self) -> dict:
        remote = self.billing
        return remote.vast_facts if remote is not None and remote.vast_facts else {}

    @property
    def engine_gpus(self) -> list[dict]:
        """The engine's devices that are GPUs (an engine proving on the CPU reports "cpu"); an
        upstream daemon's are those its GetStatus lists, one per device (`map_daemon_status`)."""
        if "daemon" in self.snapshot:
            return [dict(gpu) for gpu in self.snapshot["daemon"].get("gpus", [])]
        return [d for d in self.devices if d.get("backend") not in (None, "cpu")]

    @property
    def gpu_count(self) -> int | None:
        count = self.vast_facts.get("num_gpus") or self.machine.gpu_count
        return count or len(self.engine_gpus) or None

    @property
    def gpu_name(self) -> str:
        return (self.vast_facts.get("gpu_name") or self.machine.gpu_name
                or (self.engine_gpus[0].get("name") or "" if self.engine_gpus else ""))

    @property
    def current_facts(self) -> dict:
        """The facts that describe the instance now: none once it is destroyed (its last
        listing said how it was then, not how it is)."""
        return {} if self.machine.state == Machine.State.KILLED else self.vast_facts

    @property
    def gpu_util(self) -> float | None:
        """Percent, as Vast reports it; None where nobody reports it."""
        return _number(self.current_facts.get("gpu_util"))

    @property
    def gpu_temp(self) -> float | None:
        return _number(self.current_facts.get("gpu_temp"))

    @property
    def ram(self) -> dict | None:
        """The instance's memory: used of its limit (GB) when Vast reports both, else the host's
        RAM (cpu_ram, MB); None when not reported."""
        facts = self.current_facts
        used, limit = _number(facts.get("mem_usage")), _number(facts.get("mem_limit"))
        total_mb = _number(facts.get("cpu_ram"))
        if used is not None and limit:
            return {"used_gb": used, "total_gb": limit, "percent": round(100 * used / limit)}
        if total_mb is not None:
            return {"used_gb": None, "total_gb": total_mb / 1000, "percent": None}
        return None

    @property
    def uptime(self) -> float | None:
        """Seconds since the instance started (Vast), else since the engine started."""
        started = _number(self.vast_facts.get("start_date"))
        remote = self.billing
        if started is not None:
            ended = remote.billing_ended.timestamp() if remote and remote.billing_ended \
                else self.now
            return max(0.0, ended - started)
        if self.machine.state == Machine.State.KILLED:
            return None
        return self.aged(self.snapshot.get("uptime_secs"))

    @property
    def uptime_clock(self) -> tuple[float, float] | None:
        """The uptime as a clock of the machine's data: (its value when the shown snapshot was
        taken, that snapshot's age); `{% ticking … of=view %}` stops it there while the machine
        is not live."""
        uptime = self.uptime
        if uptime is None:
            return None
        age = min(self.snapshot_age or 0.0, uptime)
        return uptime - age, age

    @property
    def uptime_stopped(self) -> str:
        """A destroyed machine's uptime, which no longer runs (else empty)."""
        uptime = self.uptime
        return duration(uptime) if uptime is not None and \
            self.machine.state == Machine.State.KILLED else ""

    @property
    def ssh_command(self) -> str:
        machine = self.machine
        if machine.provider == Machine.Provider.LOCAL or not machine.host:
            return ""
        port = f"-p {machine.ssh_port} " if machine.ssh_port != 22 else ""
        return f"ssh {port}{machine.ssh_user}@{machine.host}"

    @property
    def bench_cost_per_proof(self) -> float | None:
        price, rate = self.machine.price_per_hour, self.machine.bench_rate
        if price is None or not rate:
            return None
        return float(price) / rate


def _number(value) -> float | None:
    """A provider's value as a number; None when absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def load_machines(now: float, machine_ids: Iterable[int] | None = None, *,
               killed_since: datetime | None = None) -> list[MachineView]:
    """Live machines (`killed_since`: also those killed since then)."""
    query = Machine.objects.select_related("live", "remote")
    alive = ~Q(state=Machine.State.KILLED)
    query = query.filter(alive | Q(pk__in=killed_machines(killed_since)) if killed_since
                         else alive)
    if machine_ids is not None:
        query = query.filter(pk__in=machine_ids)
    machines = list(query)
    return machine_views(machines, {m.pk: getattr(m, "live", None) for m in machines}, now)


def machine_views(machines: Sequence[Machine], statuses: Mapping[int, MachineStatus | None],
               now: float, kept: Mapping[int, MachineView] | None = None) -> list[MachineView]:
    """Views of `machines` with the given live status rows (the fleet controller passes the
    state it holds in memory, which is what it writes to the database). `kept`: views from an
    earlier render, each used again (at `now`) where its rows are still the same."""
    since = timezone.now() - timedelta(hours=24)
    counts = {
        row["machine"]: row
        for row in ProofJob.objects.filter(finished_at__gte=since, machine__isnull=False)
        .values("machine")
        .annotate(done=Count("id", filter=Q(status=ProofJob.Status.DONE)),
                  failed=Count("id", filter=Q(status=ProofJob.Status.FAILED)))
    }
    provider_ids = {m.vast_machine_id for m in machines if m.vast_machine_id is not None}
    bad = {b.provider_machine_id: b for b in BadMachine.objects.filter(
        provider=Machine.Provider.VAST, provider_machine_id__in=provider_ids)} \
        if provider_ids else {}
    money = Reading.load(now, [m.pk for m in machines])
    views = []
    for machine in machines:
        row = counts.get(machine.pk, {})
        status = statuses.get(machine.pk)
        done, failed = row.get("done", 0), row.get("failed", 0)
        bad_host = bad.get(machine.vast_machine_id) if machine.vast_machine_id is not None \
            else None
        view = kept.get(machine.pk) if kept is not None else None
        if view is not None and view.same_rows(machine, status, done, failed, bad_host):
            view = view.at(now)
            view.reading = money
            views.append(view)
        else:
            views.append(MachineView(machine, status, now, done, failed, bad_host, money))
    return views


def killed_machines(since: datetime):
    """Ids of machines killed since `since`, from the lifecycle events."""
    return (Event.objects.filter(kind="lifecycle", data__to=Machine.State.KILLED,
                                 time__gte=since, machine__isnull=False)
            .values("machine").distinct())


# The summary cards: lifecycle states grouped as an operator reads them (vast-manager's cards).
STATE_GROUPS = {
    "running": ("Running", (Machine.State.RUNNING,)),
    "benchmarking": ("Benchmarking", (Machine.State.PARAMS_READY, Machine.State.BENCHMARKED)),
    "provisioning": ("Fetching params", (Machine.State.PROVISIONING,)),
    "registered": ("Registered", (Machine.State.REGISTERED,)),
    "stopped": ("Stopped", (Machine.State.STOPPED,)),
}
KILLED_WINDOW = timedelta(hours=24)


def gpus_on_engines(views: Iterable[MachineView]) -> int:
    """GPUs the engines of the running machines among `views` report (GPUs rented are the
    ledger's): the one count the fleet card, the API and the metrics show."""
    return sum(len(v.engine_gpus) for v in views if v.machine.state == Machine.State.RUNNING)


def state_cards(hosts: list[MachineView], now: float) -> dict:
    """Per state group: its label, the filter it links to and how many machines are in it;
    the machines killed in the last 24 h; GPUs, $/h, measured and benchmarked proofs/h."""
    running = [h for h in hosts if h.machine.state == Machine.State.RUNNING]
    since = datetime.fromtimestamp(now, UTC)
    done_1h = ProofJob.objects.filter(status=ProofJob.Status.DONE,
                                      finished_at__gte=since - timedelta(hours=1)).count()
    rates = [h.machine.bench_rate for h in running if h.machine.bench_rate]
    vast_key = Secret.is_set(Secret.VAST_API_KEY)
    return {
        "states": [{"key": key, "label": label,
                    "count": sum(1 for h in hosts if h.machine.state in states)}
                   for key, (label, states) in STATE_GROUPS.items()],
        "killed": killed_machines(since - KILLED_WINDOW).count(),
        "gpus_engines": gpus_on_engines(running),
        "proofs_1h": done_1h,
        "bench_rate": sum(rates) if rates else None,
        "unmanaged": UnmanagedInstance.objects.count(),
        "vast_age": VastSync.age_s(since) if vast_key else None,
        "vast_key": vast_key,
        "vast_stale_after": VastSync.STALE_AFTER_S,
    }


def fleet_totals(hosts: list[MachineView], now: float | None = None) -> dict:
    now = now or time.time()
    since = timezone.now() - timedelta(hours=24)
    finished = ProofJob.objects.filter(finished_at__gte=since).aggregate(
        done=Count("id", filter=Q(status=ProofJob.Status.DONE)),
        failed=Count("id", filter=Q(status=ProofJob.Status.FAILED)),
        failed_unassigned=Count("id", filter=Q(status=ProofJob.Status.FAILED,
                                               machine__isnull=True)),
        cancelled=Count("id", filter=Q(status=ProofJob.Status.CANCELLED)))
    queued = ProofJob.objects.filter(status=ProofJob.Status.QUEUED).aggregate(
        count=Count("id"), oldest=Min("submitted_at"))
    oldest = queued["oldest"]
    live = [h for h in hosts if h.connection == LIVE]
    # Money: the whole fleet's, killed and destroyed rentals included, from the ledger.
    money = Reading.load(now)
    billed = money.billed()
    # Jobs the dashboard holds while a live engine has an idle worker and nothing waiting:
    # dispatch takes a tick, so only a job queued for longer than the hold counts.
    undispatched = (oldest is not None and now - oldest.timestamp() >= IDLE_FLAG_HOLD
                    and any(h.idle_workers and not h.queue_depth for h in live
                            if h.machine.can_prove))
    return {
        "hosts": len(hosts),
        "live": len(live),
        "stale": sum(1 for h in hosts if h.connection == "stale"),
        "offline": sum(1 for h in hosts if h.presence == OFFLINE),
        "not_started": sum(1 for h in hosts if h.presence == NEW),
        "busy": sum(h.busy_workers for h in live),
        "workers": sum(len(h.workers) for h in live),
        "queue_depth": sum(h.queue_depth or 0 for h in live),
        "partitions_waiting": sum(h.partitions_waiting for h in live),
        "queued_jobs": queued["count"],
        **{f"{key}_24h": value for key, value in finished.items()},
        "dph": money.dollars_per_hour(),
        "spent": money.spend() if money.spans else None,
        "cost_per_proof": money.per_proof(finished["done"]),
        "cost_per_proof_rule": PER_PROOF_RULE,
        "billed": billed.dollars if billed else None,
        "billed_age": billed.age_s(now) if billed else None,
        "gpus_rented": money.gpus_rented(),
        "idle_while_waiting": any(h.gpu_idle_while_waiting for h in hosts) or undispatched,
        **state_cards(hosts, now),
    }


CHART_WINDOWS = {"15m": ("15 min", 900), "1h": ("1 h", 3600), "24h": ("24 h", 86400)}
DEFAULT_WINDOW = "1h"
CHART_POINTS = 360  # at most this many points per series: longer windows are bucketed
GAP_FACTOR = 3  # samples further apart than this many sample periods: the host was away


def chart_window(key: str | None) -> str:
    return key if key in CHART_WINDOWS else DEFAULT_WINDOW


def chart_series(machine: Machine, now: float, window: str = DEFAULT_WINDOW,
                 sample_every: float = 10.0) -> dict:
    """Proofs/min and GPU busy % over `window`, from the stored engine counters.

    Both come from counter differences between consecutive samples, never from one sample:
    proofs/min from `proofs_completed`, busy % from the workers' cumulative device seconds
    (samples written before that counter existed fall back to the share of workers proving at
    the sample). A counter that went down means the engine restarted: the later value is what
    it did since. Series are bucketed to at most CHART_POINTS points; a gap in the history
    (host away) stays a gap.
    """
    label, seconds = CHART_WINDOWS[chart_window(window)]
    start = now - seconds
    samples = list(MachineSample.objects.filter(
        machine=machine, time__gte=datetime.fromtimestamp(start - GAP_FACTOR * sample_every, UTC),
    ).order_by("time").values_list("time", "busy_fraction", "busy_seconds", "workers",
                                   "proofs_completed"))
    bucket = max(seconds / CHART_POINTS, sample_every)
    times: list[int] = []
    busy: list[float | None] = []
    rate: list[float | None] = []
    sums = None  # [end time, seconds, proofs, busy worker-seconds, worker-seconds]
    total_proofs = total_seconds = total_busy = total_capacity = 0.0
    previous = None
    for when, fraction, busy_seconds, workers, completed in samples:
        t = when.timestamp()
        if previous is not None and t > start:
            p_t, p_busy, p_completed = previous
            dt = t - p_t
            if dt > GAP_FACTOR * max(sample_every, 1.0):
                _flush(sums, times, busy, rate)
                sums = None
                times.append(round(p_t + dt / 2))
                busy.append(None)
                rate.append(None)
            else:
                proofs = completed - p_completed if completed >= p_completed else completed
                if busy_seconds is not None and p_busy is not None and workers:
                    worked = busy_seconds - p_busy if busy_seconds >= p_busy else busy_seconds
                    worked = min(worked, dt * workers)
                else:
                    worked = fraction * dt * (workers or 1)
                capacity = dt * (workers or 1)
                if sums is not None and t - sums[0] > bucket:
                    _flush(sums, times, busy, rate)
                    sums = None
                if sums is None:
                    sums = [t, 0.0, 0.0, 0.0, 0.0]
                sums[0] = t
                sums[1] += dt
                sums[2] += proofs
                sums[3] += worked
                sums[4] += capacity
                total_seconds += dt
                total_proofs += proofs
                total_busy += worked
                total_capacity += capacity
        previous = (t, busy_seconds, completed)
    _flush(sums, times, busy, rate)
    return {
        "window": chart_window(window),
        "window_label": label,
        "windows": [{"key": k, "label": v[0]} for k, v in CHART_WINDOWS.items()],
        "covered": round(total_seconds),
        "covered_label": duration(total_seconds),
        "partial": total_seconds < seconds - 2 * sample_every,
        "proofs": round(total_proofs),
        "rate": round(60 * total_proofs / total_seconds, 2) if total_seconds else None,
        "busy": round(100 * total_busy / total_capacity, 1) if total_capacity else None,
        "points": sum(1 for value in rate if value is not None),
        "bucket_label": duration(bucket),
        "series": {"t": times, "busy": busy, "rate": rate, "start": round(start),
                   "end": round(now)},
        "sample_every": sample_every,
        "script_id": f"host-{machine.pk}-chart-data",
    }


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _flush(sums, times, busy, rate) -> None:
    if sums is None or sums[1] <= 0:
        return
    times.append(round(sums[0]))
    rate.append(round(60 * sums[2] / sums[1], 3))
    busy.append(round(100 * sums[3] / sums[4], 1) if sums[4] else None)


