"""The StatusTracker: the one place that knows what every job, partition and worker is doing.

A job's status, error and times live in its JobRecord here and nowhere else: the engine reads
the record and keeps only what the tracker does not hold. Every time is on the tracker's clock
(injectable); wall-clock times for people derive from it.

Design (cuzk status.rs style, without its defects):
- One ``threading.Lock`` guards the internal state. Writers come from the event loop and from
  device/finalizer threads; readers build snapshots.
- Internal records are immutable tuples replaced on write, so a reader holds the lock only long
  enough to copy references; snapshot objects are built after the lock is released.
- Every state change goes through ``_set_partition`` which keeps per-phase counts, so
  ``synthesis.active`` and the buffer counters are derived, never drift, and never wrap.
- A worker pickup returns a fresh token (monotonic counter). Releasing a worker requires that token,
  so a late finalizer can never clear a worker that has moved on to other work (cuzk keyed this on
  (job, partition), which a resubmitted job could still collide with).
- Every proof kind, single-partition PoSt included, is a pipeline; failed and cancelled jobs are
  counted exactly once and leave the list after the retention period like completed ones.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, cast

from cuzk_engine import __version__
from cuzk_engine.engine.snapshot import (
    AllocationSnapshot,
    BuffersSnapshot,
    CountersSnapshot,
    CpuSnapshot,
    DeviceSnapshot,
    EngineSnapshot,
    MemorySnapshot,
    PartitionSnapshot,
    PipelineSnapshot,
    SynthesisSnapshot,
    WorkerSnapshot,
)
from cuzk_engine.errors import StatusTransitionError
from cuzk_engine.vocabulary import (
    PARAMETER_PHASES,
    PARTITION_PHASES,
    SETTLED_PHASES,
    TERMINAL_STATUSES,
    WAITING_PHASES,
)

# Allowed phase transitions; anything else is an engine bug and raises at once.
_TRANSITIONS = {
    "pending": {"synthesizing", "cancelled", "failed"},
    "synthesizing": {"synth_done", "failed", "cancelled"},
    "synth_done": {"gpu", "cancelled", "failed"},
    "gpu": {"finalizing", "failed", "cancelled"},
    "finalizing": {"done", "failed", "cancelled"},
}


class _Part(NamedTuple):
    state: str = "pending"
    synth_start: float | None = None
    synth_end: float | None = None
    gpu_start: float | None = None
    gpu_end: float | None = None
    fin_start: float | None = None
    fin_end: float | None = None
    worker_id: int | None = None


class _Worker(NamedTuple):
    worker_id: int
    gpu_ordinal: int
    token: int | None = None
    job_id: str | None = None
    partition: int | None = None
    busy_since: float | None = None
    busy_total: float = 0.0


class _Srs(NamedTuple):
    circuit_id: str
    bytes: int
    state: str  # vocabulary.SRS_STATES
    in_use: int
    last_used: float
    since: float  # when it entered `state`
    progress: float | None  # generating: the share of the setup done


class JobRecord:
    """A job as the tracker records it: what it is, its status and error, and its times on the
    tracker's clock. The one record of a job's state: the engine keeps a reference and reads it,
    only the tracker writes it (under its lock)."""

    __slots__ = (
        "circuit_id",
        "error",
        "finished",
        "job_id",
        "kind",
        "parts",
        "priority",
        "profile",
        "ready",
        "request_id",
        "srs_load_ms",
        "started",
        "status",
        "submitted",
        "version",
    )

    def __init__(self, job_id: str, request_id: str | None, kind: str, profile: str,
                 circuit_id: str, priority: str, n: int, now: float):
        self.job_id = job_id
        self.request_id = request_id
        self.kind = kind
        self.profile = profile
        self.circuit_id = circuit_id
        self.priority = priority
        self.status = "queued"
        self.error: str | None = None
        self.submitted = now
        self.started: float | None = None
        self.finished: float | None = None
        self.srs_load_ms: float | None = None
        self.ready: float | None = None  # when its parameters were in hand
        self.parts: tuple[_Part, ...] = (_Part(),) * n
        self.version = 0  # bumped on every change, so readers can reuse an unchanged snapshot

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def settled(self) -> bool:
        return all(p.state in SETTLED_PHASES for p in self.parts)


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    backend: str
    description: str


def _ms(start: float | None, end: float | None, now: float) -> float | None:
    if start is None:
        return None
    return round(((end if end is not None else now) - start) * 1000.0, 3)


def _offset(origin: float, t: float | None) -> float | None:
    return None if t is None else round((t - origin) * 1000.0, 3)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000.0, 3)


# the PartitionSnapshot argument a running phase's timer fills, and where that phase began
_TIMER_SLOT = {"synthesizing": 2, "gpu": 3, "finalizing": 4}


class _RenderedJob(NamedTuple):
    job: JobRecord
    version: int
    partitions: tuple[PartitionSnapshot | None, ...]  # None where a timer runs
    timed: tuple[tuple[int, tuple, int, float], ...]  # (index, constructor args, slot, since)
    done: int


def _render_partitions(job: JobRecord, version: int, parts: tuple[_Part, ...]) -> _RenderedJob:
    origin = job.submitted
    snaps: list[PartitionSnapshot | None] = []
    timed: list[tuple[int, tuple, int, float]] = []
    for i, p in enumerate(parts):
        args = (i, p.state, _span(p.synth_start, p.synth_end), _span(p.gpu_start, p.gpu_end),
                _span(p.fin_start, p.fin_end), _offset(origin, p.synth_start),
                _offset(origin, p.gpu_start), _offset(origin, p.fin_start), p.worker_id)
        slot = _TIMER_SLOT.get(p.state)
        if slot is None:
            snaps.append(PartitionSnapshot(*args))
        else:
            since = (p.synth_start, p.gpu_start, p.fin_start)[slot - 2]
            assert since is not None, "a running phase has its start"
            snaps.append(None)
            timed.append((i, args, slot, since))
    return _RenderedJob(job, version, tuple(snaps), tuple(timed),
                        sum(1 for p in parts if p.state == "done"))


def _with_timers(rendered: _RenderedJob, now: float) -> list[PartitionSnapshot]:
    """The rendered partitions with each running phase's timer read at ``now``."""
    shown = list(rendered.partitions)
    for index, args, slot, since in rendered.timed:
        fresh = list(args)
        fresh[slot] = round((now - since) * 1000.0, 3)
        shown[index] = PartitionSnapshot(*fresh)
    return cast("list[PartitionSnapshot]", shown)  # every running timer filled in


def _job_phase(status: str, submitted: float, started: float | None, ready: float | None,
               finished: float | None, parts: tuple[_Part, ...],
               params: _Srs | None) -> tuple[str, float]:
    """A job's phase (vocabulary.JOB_PHASES) and since when it has been in it."""
    if status == "queued":
        return "queued", submitted
    if status == "running":
        assert started is not None, "a running job has started"
        if ready is not None:
            return "running", ready
        # Without its parameters yet: generating them (first use) or reading them, also when
        # another job's load of the same set is what it waits for.
        if params is not None and params.state == "generating":
            return "generating_parameters", params.since
        return "loading_parameters", params.since if params is not None else started
    assert finished is not None, "an ended job has finished"
    if status != "done" and any(p.state not in SETTLED_PHASES for p in parts):
        return ("cancelling" if status == "cancelled" else "failing"), finished
    return status, finished


MemoryReader = Callable[[], tuple[int, int]]


class StatusTracker:
    """Thread-safe engine status; see the module docstring for the guarantees."""

    def __init__(
        self,
        devices: list[DeviceInfo],
        workers_per_device: int,
        *,
        memory: MemoryReader = lambda: (0, 0),
        synthesis_max_concurrent: int = 1,
        cpu: CpuSnapshot | None = None,
        retention: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._lock = threading.Lock()
        self._clock = clock
        self._t0 = clock()
        # what the clock reads at the epoch: wall-clock times for people derive from the one clock
        self._epoch = self._t0 - time.time()
        self._memory = memory
        self._retention = retention
        self._synth_max = synthesis_max_concurrent
        self._cpu = cpu
        self._devices = list(devices)
        self._workers: list[_Worker] = []
        self._device_workers: dict[int, list[int]] = {}
        for dev in devices:
            for _ in range(workers_per_device):
                wid = len(self._workers)
                self._workers.append(_Worker(wid, dev.ordinal))
                self._device_workers.setdefault(dev.ordinal, []).append(wid)
        self._jobs: dict[str, JobRecord] = {}
        self._ended: dict[str, JobRecord] = {}  # terminal jobs still listed, oldest ending first
        self._pickups: dict[int, tuple[int, str, int]] = {}  # token -> (worker, job, partition)
        self._tokens = itertools.count(1)
        self._phase_counts = dict.fromkeys(PARTITION_PHASES, 0)
        self._done_by_kind: dict[str, int] = {}
        self._failed_by_kind: dict[str, int] = {}
        self._cancelled_by_kind: dict[str, int] = {}
        self._queued_by_kind: dict[str, int] = {}
        self._srs: dict[str, _Srs] = {}
        self._accepting = True
        self._seq = 0
        self._listeners: list[Callable[[], None]] = []
        self._pipe_cache: dict[str, _RenderedJob] = {}

    # ------------------------------------------------------------------ plumbing

    def add_listener(self, fn: Callable[[], None]) -> None:
        """``fn`` is called (outside the lock, from the writer's thread) after every change."""
        with self._lock:
            self._listeners = [*self._listeners, fn]

    def remove_listener(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._listeners = [f for f in self._listeners if f is not fn]

    def _changed(self) -> list[Callable[[], None]]:
        self._seq += 1
        return self._listeners

    @staticmethod
    def _notify(listeners: list[Callable[[], None]]) -> None:
        for fn in listeners:
            fn()

    @property
    def seq(self) -> int:
        return self._seq

    def now(self) -> float:
        """The tracker's clock, the one every time of a job is read on."""
        return self._clock()

    def wall_time(self, t: float) -> float:
        """A time on the tracker's clock as seconds since the epoch, for people to read."""
        return t - self._epoch

    @property
    def started(self) -> float:
        """When the tracker started, on its clock."""
        return self._t0

    def _job(self, job_id: str) -> JobRecord:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise StatusTransitionError(f"unknown job {job_id!r}") from None

    def _set_partition(self, job: JobRecord, index: int, state: str, **fields) -> _Part:
        old = job.parts[index]
        if state not in _TRANSITIONS.get(old.state, ()):
            raise StatusTransitionError(
                f"job {job.job_id} partition {index}: {old.state} -> {state} is not allowed"
            )
        new = old._replace(state=state, **fields)
        job.parts = job.parts[:index] + (new,) + job.parts[index + 1:]
        job.version += 1
        self._phase_counts[old.state] -= 1
        self._phase_counts[state] += 1
        return new

    def _finish_job(self, job: JobRecord, status: str, error: str | None, now: float) -> bool:
        """Move a job to a terminal status; counts it exactly once. Returns False if already."""
        if job.terminal:
            return False
        if job.status == "queued":
            self._queued_by_kind[job.kind] -= 1
        job.status = status
        job.error = error
        job.finished = now
        job.version += 1
        self._ended[job.job_id] = job  # in finishing order, which _gc relies on
        table = {"done": self._done_by_kind, "failed": self._failed_by_kind,
                 "cancelled": self._cancelled_by_kind}[status]
        table[job.kind] = table.get(job.kind, 0) + 1
        for i, p in enumerate(job.parts):
            # Parts nobody is working on settle now; in-flight ones settle when their step ends.
            if p.state in WAITING_PHASES:
                self._set_partition(job, i, "cancelled")
        return True

    def _release_worker(self, token: int, now: float) -> None:
        """Clear the worker that took ``token`` — only if it still holds that same pickup."""
        pick = self._pickups.get(token)
        if pick is None:
            return
        w = self._workers[pick[0]]
        if w.token != token:
            return
        assert w.busy_since is not None, "a worker holding a pickup is busy"
        self._workers[pick[0]] = _Worker(
            w.worker_id, w.gpu_ordinal, busy_total=w.busy_total + (now - w.busy_since)
        )

    # ------------------------------------------------------------------ job lifecycle

    def register_job(self, job_id: str, *, kind: str, profile: str, circuit_id: str,
                     priority: str, partitions: int,
                     request_id: str | None = None) -> JobRecord:
        """Track a new, queued job; returns its record (to read; only the tracker writes it)."""
        if partitions < 1:
            raise ValueError("a job has at least one partition")
        with self._lock:
            if job_id in self._jobs:
                raise StatusTransitionError(f"job {job_id!r} is already tracked")
            record = JobRecord(job_id, request_id, kind, profile, circuit_id, priority,
                               partitions, self._clock())
            self._jobs[job_id] = record
            self._phase_counts["pending"] += partitions
            self._queued_by_kind[kind] = self._queued_by_kind.get(kind, 0) + 1
            ls = self._changed()
        self._notify(ls)
        return record

    def job_started(self, job_id: str) -> None:
        with self._lock:
            job = self._job(job_id)
            if job.status != "queued":
                raise StatusTransitionError(f"job {job_id}: start from {job.status}")
            job.status = "running"
            job.started = self._clock()
            job.version += 1
            self._queued_by_kind[job.kind] -= 1
            ls = self._changed()
        self._notify(ls)

    def srs_loaded_for(self, job_id: str, ms: float) -> None:
        """The job has its parameters (``ms``: what loading them took, 0 if resident): it
        leaves its parameter phase."""
        with self._lock:
            job = self._job(job_id)
            job.srs_load_ms = round(ms, 3)
            job.ready = self._clock()
            job.version += 1
            ls = self._changed()
        self._notify(ls)

    def job_done(self, job_id: str) -> None:
        with self._lock:
            job = self._job(job_id)
            if any(p.state != "done" for p in job.parts):
                raise StatusTransitionError(f"job {job_id}: done with unfinished partitions")
            if not self._finish_job(job, "done", None, self._clock()):
                raise StatusTransitionError(f"job {job_id}: done after {job.status}")
            ls = self._changed()
        self._notify(ls)

    def job_failed(self, job_id: str, reason: str) -> bool:
        with self._lock:
            changed = self._finish_job(self._job(job_id), "failed", reason, self._clock())
            ls = self._changed() if changed else []
        self._notify(ls)
        return changed

    def job_cancelled(self, job_id: str, reason: str = "cancelled by request") -> bool:
        with self._lock:
            changed = self._finish_job(self._job(job_id), "cancelled", reason, self._clock())
            ls = self._changed() if changed else []
        self._notify(ls)
        return changed

    def set_accepting(self, accepting: bool) -> None:
        with self._lock:
            self._accepting = accepting
            ls = self._changed()
        self._notify(ls)

    # ------------------------------------------------------------------ partition phases

    def synth_start(self, job_id: str, index: int) -> bool:
        """Returns False (and settles the partition) if the job already ended."""
        with self._lock:
            job = self._job(job_id)
            if job.terminal:
                return False
            now = self._clock()
            if job.ready is None:  # a partition synthesizes: the job has its parameters
                job.ready = now
            self._set_partition(job, index, "synthesizing", synth_start=now)
            ls = self._changed()
        self._notify(ls)
        return True

    def synth_end(self, job_id: str, index: int) -> bool:
        """Returns False if the job ended meanwhile: the partition is then cancelled."""
        with self._lock:
            job = self._job(job_id)
            now = self._clock()
            alive = not job.terminal
            self._set_partition(job, index, "synth_done" if alive else "cancelled", synth_end=now)
            ls = self._changed()
        self._notify(ls)
        return alive

    def worker_pickup(self, worker_id: int, job_id: str, index: int) -> int | None:
        """A worker takes a synthesized partition onto its device; returns the pickup token, or
        None if the job already ended (the partition was settled then and must be dropped)."""
        with self._lock:
            job = self._job(job_id)
            if job.terminal:
                return None
            w = self._workers[worker_id]
            if w.token is not None:
                raise StatusTransitionError(
                    f"worker {worker_id} picked up {job_id}/{index} while still holding "
                    f"{w.job_id}/{w.partition}"
                )
            now = self._clock()
            self._set_partition(job, index, "gpu", gpu_start=now, worker_id=worker_id)
            token = next(self._tokens)
            self._pickups[token] = (worker_id, job_id, index)
            self._workers[worker_id] = w._replace(token=token, job_id=job_id, partition=index,
                                                  busy_since=now)
            ls = self._changed()
        self._notify(ls)
        return token

    def device_done(self, token: int) -> bool:
        """The device step of a pickup ended; the worker is released and the partition moves on
        to finalizing. Returns False if the job ended meanwhile (the partition is cancelled)."""
        with self._lock:
            _, job_id, index = self._pickups[token]
            now = self._clock()
            job = self._jobs[job_id]
            alive = not job.terminal
            if alive:
                self._set_partition(job, index, "finalizing", gpu_end=now, fin_start=now)
            else:
                self._set_partition(job, index, "cancelled", gpu_end=now)
            self._release_worker(token, now)
            if not alive:
                del self._pickups[token]
            ls = self._changed()
        self._notify(ls)
        return alive

    def finalize_done(self, job_id: str, index: int, token: int | None = None) -> bool:
        """A partition's proof is finished and stored. With a token, the worker of that pickup is
        released too, but only if it still holds that very pickup (stale-finalizer guard).
        Returns False if the job ended meanwhile (the partition is cancelled instead)."""
        with self._lock:
            now = self._clock()
            job = self._job(job_id)
            alive = not job.terminal
            self._set_partition(job, index, "done" if alive else "cancelled", fin_end=now)
            if token is not None:
                self._release_worker(token, now)
                self._pickups.pop(token, None)
            ls = self._changed()
        self._notify(ls)
        return alive

    def partition_failed(self, job_id: str, index: int, reason: str,
                         token: int | None = None) -> bool:
        """A partition failed: it fails its job (once) and settles; its worker is released.
        Returns True when this failure ended the job (False: it had already ended)."""
        with self._lock:
            now = self._clock()
            job = self._job(job_id)
            fields = {}
            if job.parts[index].state == "synthesizing":
                fields["synth_end"] = now
            elif job.parts[index].state == "gpu":
                fields["gpu_end"] = now
            elif job.parts[index].state == "finalizing":
                fields["fin_end"] = now
            self._set_partition(job, index, "failed", **fields)
            if token is not None:
                self._release_worker(token, now)
                self._pickups.pop(token, None)
            ended = self._finish_job(job, "failed", f"partition {index}: {reason}", now)
            ls = self._changed()
        self._notify(ls)
        return ended

    # ------------------------------------------------------------------ SRS allocations

    def srs_update(self, circuit_id: str, nbytes: int, state: str, in_use: int,
                   progress: float | None = None) -> None:
        with self._lock:
            now = self._clock()
            old = self._srs.get(circuit_id)
            since = old.since if old is not None and old.state == state else now
            self._srs[circuit_id] = _Srs(circuit_id, nbytes, state, in_use, now, since,
                                         None if progress is None else round(progress, 4))
            ls = self._changed()
        self._notify(ls)

    def srs_removed(self, circuit_id: str) -> None:
        with self._lock:
            if self._srs.pop(circuit_id, None) is None:
                return
            ls = self._changed()
        self._notify(ls)

    # ------------------------------------------------------------------ reading

    def _gc(self, now: float) -> None:
        """Forget settled terminal jobs after the retention. Runs under the lock inside
        snapshot(), so it looks only at ended jobs, oldest first, and stops at the first one
        still inside the retention: a reader never scans the live jobs here."""
        gone = []
        for jid, job in self._ended.items():
            assert job.finished is not None, "an ended job has finished"
            if now - job.finished < self._retention:
                break
            if job.settled():  # a partition still on a device or finalizing keeps it listed
                gone.append(jid)
        for jid in gone:
            del self._ended[jid]
            job = self._jobs.pop(jid)
            for p in job.parts:
                self._phase_counts[p.state] -= 1
        if gone:
            self._seq += 1

    def snapshot(self) -> EngineSnapshot:
        total, used = self._memory()
        with self._lock:
            now = self._clock()
            self._gc(now)
            seq = self._seq
            # only references and scalars here: the snapshot objects are built after release
            jobs = [(j, j.version, j.status, j.error, j.started, j.srs_load_ms, j.ready,
                     j.finished, j.parts) for j in self._jobs.values()]
            workers = tuple(self._workers)
            counts = dict(self._phase_counts)
            done, failed, cancelled = (dict(self._done_by_kind), dict(self._failed_by_kind),
                                       dict(self._cancelled_by_kind))
            queued = {k: v for k, v in self._queued_by_kind.items() if v}
            srs = tuple(self._srs.values())
            accepting = self._accepting
        # A writer that found the lock taken is woken by the release but still needs the GIL,
        # which this thread would keep for the whole build (up to the interpreter's switch
        # interval, 5 ms): give it up once so that writer runs now.
        time.sleep(0)
        return self._build(now, seq, total, used, jobs, workers, counts, done, failed, cancelled,
                           queued, srs, accepting)

    def _build(self, now, seq, total, used, jobs, workers, counts, done, failed, cancelled,
               queued, srs, accepting) -> EngineSnapshot:
        # A job renders its partitions again only when its version moved; otherwise the cached
        # snapshot objects are reused and only the running timers are recomputed for ``now``.
        # Concurrent readers may race on the cache: entries are immutable, so a lost update
        # only costs a rebuild.
        old_cache = self._pipe_cache
        cache: dict[str, _RenderedJob] = {}
        pipelines = []
        srs_by_circuit = {s.circuit_id: s for s in srs}
        for job, version, status, error, started, srs_ms, ready, finished, parts in jobs:
            rendered = old_cache.get(job.job_id)
            if rendered is None or rendered.job is not job or rendered.version != version:
                rendered = _render_partitions(job, version, parts)
            cache[job.job_id] = rendered
            psnaps = _with_timers(rendered, now)
            submitted = job.submitted
            params = srs_by_circuit.get(job.circuit_id)
            phase, since = _job_phase(status, submitted, started, ready, finished, parts, params)
            waited_for = params if phase in PARAMETER_PHASES else None
            pipelines.append(PipelineSnapshot(
                job.job_id, job.request_id, job.kind, job.kind, job.profile, job.circuit_id,
                job.priority, status, error, round(now - submitted, 3),
                _ms(submitted, started, now), srs_ms, len(parts), rendered.done, psnaps,
                phase, round(now - since, 3),
                None if waited_for is None else waited_for.bytes,
                None if waited_for is None else waited_for.progress,
            ))
        self._pipe_cache = cache
        wsnaps = [
            WorkerSnapshot(
                w.worker_id, w.gpu_ordinal, "idle" if w.token is None else "proving", w.job_id,
                w.partition,
                None if w.busy_since is None else round(now - w.busy_since, 3),
                round(w.busy_total + (0.0 if w.busy_since is None else now - w.busy_since), 3),
            )
            for w in workers
        ]
        devices = [
            DeviceSnapshot(d.ordinal, d.name, d.backend, d.description,
                           list(self._device_workers.get(d.ordinal, [])))
            for d in self._devices
        ]
        allocations = {
            "srs": [
                AllocationSnapshot(s.circuit_id, s.bytes, s.state, s.in_use,
                                   round(now - s.last_used, 3),
                                   s.state == "loaded" and s.in_use == 0,
                                   round(now - s.since, 3), s.progress)
                for s in srs
            ],
            "pce": [],
        }
        return EngineSnapshot(
            seq=seq,
            version=__version__,
            uptime_secs=round(now - self._t0, 3),
            accepting=accepting,
            memory=MemorySnapshot(total, used, max(total - used, 0)),
            synthesis=SynthesisSnapshot(self._synth_max, counts["synthesizing"]),
            pipelines=pipelines,
            gpu_workers=wsnaps,
            devices=devices,
            allocations=allocations,
            counters=CountersSnapshot(
                sum(done.values()), sum(failed.values()), sum(cancelled.values()),
                done, failed, cancelled, sum(queued.values()), queued,
            ),
            buffers=BuffersSnapshot(counts["synthesizing"], counts["synth_done"], counts["gpu"],
                                    counts["finalizing"]),
            cpu=self._cpu,
        )

    def partitions_of(self, job: JobRecord) -> list[PartitionSnapshot]:
        """A job's partitions as a snapshot would show them now (its result carries them, so
        a reader of a finished job sees every partition's final state and times)."""
        with self._lock:
            now = self._clock()
            parts = job.parts
        return _with_timers(_render_partitions(job, job.version, parts), now)

    def busy_fraction(self) -> dict[int, float]:
        """Per-worker share of uptime spent holding a device step."""
        with self._lock:
            now = self._clock()
            up = max(now - self._t0, 1e-9)
            return {
                w.worker_id: (w.busy_total + (0 if w.busy_since is None else now - w.busy_since))
                / up
                for w in self._workers
            }
