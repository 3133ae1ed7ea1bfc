"""Where an upstream cuzk status snapshot contradicts itself: the lie detector.

Our StatusTracker guarantees invariants on every snapshot (DESIGN.md, "The status model";
`cuzk_engine.engine.snapshot.snapshot_violations`): a partition is in `gpu` exactly when one proving
worker holds it, `synthesis.active` equals the partitions synthesizing, the buffer counters are
the partitions in each phase, memory used stays within the total, every job is counted once and
leaves the list after the retention period. Curio's Rust daemon breaks each of them in known ways
(reference: cuzk-notes §4.2-4.3). This module checks a snapshot in the shape the panels render
(see `controller.upstream.map_snapshot`) and says, for each violation, what it means for the
operator and which upstream behaviour causes it.

Some lies only show over time ("failed 20 min ago and still listed", "only grows"), so a
detector keeps a short per-host history. It also tallies every kind of lie per host, so the panel
can show how often each one happened since the controller started watching.

Pure Python, no Django: it is fed a `PartialSnapshot` (JSON, any field may be missing) and a
time. Numbers are still checked with `_n`: a field of the right key may hold the wrong type
when the snapshot did not come through `map_snapshot`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from cuzk_engine.vocabulary import IN_FLIGHT_PHASES, PARTITION_PHASES
from vastmgr.fleet.partial_snapshot import (
    LieRow,
    LieTallyRow,
    PartialPartition,
    PartialPipeline,
    PartialSnapshot,
    PartialWorker,
)

# A usize counter this large went below zero (a decrement without its increment) and wrapped.
WRAPPED = 1 << 63
# Upstream drops a completed job 30 s after `job_completed`; our engine keeps terminal jobs for
# its retention (30 s by default). Past this, a settled job still listed never completed.
STUCK_AFTER = 60.0
# "Only grows" needs the counter watched for a while: rising, never falling, across this span.
GROWTH_SPAN = 30.0
HISTORY = 300.0


@dataclass(frozen=True)
class Lie:
    code: str  # the kind of lie, stable (tallied per host)
    title: str  # what the snapshot claims, with the specifics
    meaning: str  # what is really going on, for the operator
    cause: str  # the upstream behaviour behind it

    def as_dict(self) -> LieRow:
        return LieRow(code=self.code, title=self.title, meaning=self.meaning, cause=self.cause)


@dataclass
class Sightings:
    """How often one kind of lie showed on a host: episodes (times it appeared), snapshots it
    was in, first and last seen."""
    episodes: int
    snapshots: int
    first_seen: float
    last_seen: float


TITLES = {
    "gpu-unheld": "partition on the GPU with no worker proving it",
    "worker-not-on-gpu": "worker proving a partition that is not on the GPU",
    "shared-partition": "two workers on one partition",
    "worker-fields": "worker state and job fields disagree",
    "invisible-gpu-work": "GPU work no worker shows",
    "synthesis-active": "synthesis.active disagrees with the partitions",
    "synthesis-active-grows": "synthesis.active only grows",
    "partitions-done": "partitions_done disagrees with the partitions",
    "buffer-wrapped": "buffer counter wrapped",
    "buffer-grows": "buffer counter never drains",
    "srs-empty": "SRS list empty while proving",
    "memory": "memory used above the total",
    "counters-by-kind": "counter total differs from its sum by kind",
    "failed-listed": "failed job never leaves the list",
    "done-never-completed": "all partitions done but the job never completed",
    "gpus-per-worker": "GetStatus lists a GPU once per worker",
    "srs-hardcoded": "SRS tier, size and users are hard-coded",
    "pinned-unreported": "pinned memory reads 0 of 0",
    "srs-unlisted": "a proving kind's SRS is not in loaded_srs",
    "queue-hides-partitions": "queues leave out partitions waiting",
    "counters-undercount": "/status counts fewer proofs than GetStatus",
    "synthesis-max-uncapped": "synthesis.max_concurrent ignores max_parallel_synthesis",
    "assigned-gpu-empty": "SubmitProof never says which GPU",
    "cancel-noop": "CancelProof said not running, the proof runs on",
    "kind-names": "one proof kind under three names",
}
# Upstream's three vocabularies for one proof kind: /status and GetStatus' proof_kind (Display,
# the key here, ours too), the prefix of its SRS circuit ids (porep-32g, ...), and its metrics'
# proof_kind label (ProofKind::metric_label). The one table every translation reads.
CIRCUIT_PREFIX = {"porep-c2": "porep", "snap-update": "snap", "window-post": "wpost",
                  "winning-post": "winning"}
METRIC_LABEL = {"porep-c2": "porep_c2", "snap-update": "snap_update",
                "window-post": "window_post", "winning-post": "winning_post"}
# cuzk-core config.rs: [synthesis] max_parallel_synthesis defaults to 18.
MAX_PARALLEL_SYNTHESIS = 18


def _n(value) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


class LieDetector:
    """One per watched upstream host: `check(snapshot, now)` returns the lies in that snapshot."""

    def __init__(self, *, stuck_after: float = STUCK_AFTER, growth_span: float = GROWTH_SPAN):
        self.stuck_after = stuck_after
        self.growth_span = growth_span
        self.uptime: float | None = None
        # (job, "failed"|"done") -> first seen; a pipeline may not name its job
        self.settled_since: dict[tuple[str | None, str], float] = {}
        self.series: dict[str, deque[tuple[float, float]]] = {}  # counter -> (time, excess)
        self.tally: dict[str, Sightings] = {}
        self.present: set[str] = set()
        # What the daemon answered to calls we made (gRPC), checked against what it shows next.
        self.unassigned: set[str] = set()  # jobs SubmitProof gave no GPU
        self.not_running: set[str] = set()  # jobs CancelProof called not running

    def note_submitted(self, job_id: str, assigned_gpu: str) -> None:
        """SubmitProof's answer for a job (upstream's assigned_gpu is always empty)."""
        if not assigned_gpu:
            self.unassigned.add(job_id)

    def note_cancelled(self, job_id: str, was_running: bool) -> None:
        """CancelProof's answer for a job (upstream's was_running is always false)."""
        if not was_running:
            self.not_running.add(job_id)

    # ---- the entry point --------------------------------------------------------------

    def check(self, snapshot: PartialSnapshot, now: float) -> list[Lie]:
        uptime = _n(snapshot.get("uptime_secs"))
        if uptime is not None and self.uptime is not None and uptime < self.uptime:
            # The daemon restarted: what it said before is no evidence about the new process.
            self.settled_since.clear()
            self.series.clear()
        self.uptime = uptime
        pipelines = snapshot.get("pipelines", [])
        workers = snapshot.get("gpu_workers", [])
        phases = _phase_counts(pipelines)
        lies = [
            *self._workers_and_partitions(pipelines, workers),
            *self._synthesis(snapshot, phases, now),
            *self._buffers(snapshot, phases, workers, now),
            *self._srs(snapshot, pipelines, workers),
            *self._memory_and_counters(snapshot),
            *self._settled_jobs(pipelines, now),
            *self._daemon(snapshot, pipelines),
        ]
        self._count(lies, now)
        return lies

    def tally_rows(self) -> list[LieTallyRow]:
        """Per kind of lie: episodes (times it appeared), snapshots it was in, first and last
        seen, and whether it is present now."""
        return [LieTallyRow(code=code, title=TITLES.get(code, code), episodes=seen.episodes,
                            snapshots=seen.snapshots, first_seen=seen.first_seen,
                            last_seen=seen.last_seen, present=code in self.present)
                for code, seen in sorted(self.tally.items())]

    def _count(self, lies: list[Lie], now: float) -> None:
        codes = {lie.code for lie in lies}
        for code in codes:
            seen = self.tally.setdefault(code, Sightings(episodes=0, snapshots=0, first_seen=now,
                                                         last_seen=now))
            seen.episodes += code not in self.present
            seen.snapshots += 1
            seen.last_seen = now
        self.present = codes

    # ---- workers and partitions -------------------------------------------------------

    def _workers_and_partitions(self, pipelines: list[PartialPipeline],
                                workers: list[PartialWorker]) -> list[Lie]:
        lies = []
        states = {(p.get("job_id"), pt.get("index")): pt.get("state")
                  for p in pipelines for pt in _partitions(p)}
        holders: dict[tuple, list] = {}
        idle = []
        for w in workers:
            wid, state = w.get("worker_id"), w.get("state")
            job, part = w.get("current_job"), w.get("current_partition")
            if state == "proving":
                if job is None or part is None:
                    lies.append(Lie("worker-fields", f"worker W{wid} is proving but names no "
                                    "job or partition",
                                    "the worker's current assignment is unknown",
                                    "the worker record was cleared without its busy flag"))
                    continue
                holders.setdefault((job, part), []).append(wid)
            elif state == "idle":
                idle.append(wid)
                if job is not None or part is not None:
                    lies.append(Lie("worker-fields", f"worker W{wid} is {state} but still names "
                                    f"partition {part} of job {job}",
                                    "the job fields are left over from earlier work",
                                    "the worker was marked idle without clearing its job"))
        for (job, part), wids in holders.items():
            if len(wids) > 1:
                lies.append(Lie(
                    "shared-partition",
                    f"workers {_ws(wids)} all show partition {part} of job {job}",
                    "at most one of them is proving it; the other assignments are stale",
                    "upstream keys worker state by (job id, partition) only, and Curio reuses job "
                    "ids across task retries (porep-<miner>-<sector>): a retry re-registers the job "
                    "and overwrites its entries (the (job, partition) guard of partition_gpu_end, "
                    "not a per-pickup token)"))
            state = states.get((job, part))
            if state != "gpu":
                where = ("is not in the pipelines" if state is None
                         else f"is {state}")
                lies.append(Lie(
                    "worker-not-on-gpu",
                    f"worker W{wids[0]} shows partition {part} of job {job}, which {where}",
                    "the worker is not proving that partition; it may be idle or on other work",
                    "partition_gpu_start marks the worker busy on pickup, before the already-failed "
                    "check, so a skipped partition of a failed job leaves it showing 'proving' until "
                    "its next pickup; a GPU error in gpu_prove_start never updates the worker; a "
                    "retried job id re-registers the job under the worker"))
        for p in pipelines:
            for pt in _partitions(p):
                if pt.get("state") == "gpu" and (p.get("job_id"), pt.get("index")) not in holders:
                    idle_note = f" (idle: {_ws(idle)})" if idle else ""
                    lies.append(Lie(
                        "gpu-unheld",
                        f"partition {pt.get('index')} of job {p.get('job_id')} is on the GPU but "
                        f"no worker is proving it{idle_note}",
                        "the partition is most likely in its finalizer (CPU), not on a GPU; if it "
                        "stays, its GPU start failed and it will never move",
                        "upstream has no finalizing phase: the worker is reset (or takes its next "
                        "partition) before the finalizer runs, and the partition reads 'gpu' until "
                        "partition_gpu_end; a GPU error in gpu_prove_start never updates it at all"))
        return lies

    # ---- synthesis --------------------------------------------------------------------

    def _synthesis(self, snapshot: PartialSnapshot, phases: dict[str, int],
                   now: float) -> list[Lie]:
        active = _n(snapshot.get("synthesis", {}).get("active"))
        if active is None:
            return []
        synthesizing = phases["synthesizing"]
        excess = active - synthesizing
        if self._only_grows("synthesis.active", excess, now):
            return [Lie("synthesis-active-grows",
                        f"synthesis.active only grows: {active:g} active with {synthesizing} "
                        f"partition(s) synthesizing, never down in {self.growth_span:g} s",
                        "the number is a leak count, not work: synthesis capacity looks used up",
                        "partition_failed does not decrement synthesis.active, so every failed "
                        "synthesis leaves it one higher until the daemon restarts")]
        if excess:
            cause = ("partition_failed does not decrement it, and monolithic (PoSt, batched) "
                     "syntheses are counted nowhere" if excess > 0 else
                     "monolithic (PoSt, batched) jobs synthesize without touching the tracker")
            return [Lie("synthesis-active",
                        f"synthesis.active is {active:g} but {synthesizing} partition(s) are "
                        "synthesizing",
                        "the synthesis figure does not describe the work in the pipelines", cause)]
        return []

    # ---- buffers ----------------------------------------------------------------------

    def _buffers(self, snapshot: PartialSnapshot, phases: dict[str, int],
                 workers: list[PartialWorker], now: float) -> list[Lie]:
        if "buffers" not in snapshot:
            return []
        buffers = snapshot["buffers"]
        lies = []
        in_flight = sum(phases[p] for p in IN_FLIGHT_PHASES)
        for name in sorted(buffers):
            value = _n(buffers[name])
            if value is None:
                continue
            if value >= WRAPPED:
                lies.append(Lie(
                    "buffer-wrapped", f"{name} wrapped ({value})",
                    f"{name} went below zero: the figure is meaningless",
                    "the monolithic path calls buf_synth_done() without buf_synth_start(), and "
                    "failed partition syntheses never decrement the counter, so the usize wraps"))
                self.series.pop(name, None)
            elif self._only_grows(name, value - in_flight, now):
                lies.append(Lie(
                    "buffer-grows",
                    f"buffers never drain: {name} only grows ({value:g} with {in_flight} "
                    f"partition(s) in flight, never down in {self.growth_span:g} s)",
                    "the counter counts allocations, never releases; it says nothing about "
                    "memory held now",
                    "buf_dealloc_done() is never called upstream, so aux_in_flight and "
                    "shells_in_flight only increase (a known counter bug)"))
        provers = _n(buffers.get("provers_in_flight"))
        on_gpu = phases["gpu"] + phases["finalizing"]
        proving = sum(1 for w in workers if w.get("state") == "proving")
        if provers is not None and on_gpu < provers < WRAPPED:
            lies.append(Lie(
                "invisible-gpu-work",
                f"{provers:g} proof(s) in flight per provers_in_flight, but {on_gpu} partition(s) "
                f"on a GPU and {proving} worker(s) shown proving",
                "GPUs are busy with work the panel cannot show; idle workers here are not idle",
                "monolithic jobs (WinningPoSt, WindowPoSt, batched PoRep) never touch the upstream "
                "StatusTracker: not in pipelines, not in counters, workers read idle"))
        return lies

    def _only_grows(self, name: str, excess: float, now: float) -> bool:
        """True when `excess` (a counter above the work that explains it) is positive, rose at
        least twice and never fell, across at least `growth_span` seconds of samples. (One rise
        is one event, e.g. one failed synthesis; growing means it keeps happening.)"""
        series = self.series.setdefault(name, deque())
        if series and excess < series[-1][1]:
            series.clear()  # it went down: whatever it counts does drain
        series.append((now, excess))
        while now - series[0][0] > HISTORY:
            series.popleft()
        if excess <= 0:
            return False
        rises = sum(1 for (_, before), (_, after) in pairwise(series) if after > before)
        return rises >= 2 and now - series[0][0] >= self.growth_span

    # ---- SRS, memory, counters ----------------------------------------------------------

    def _srs(self, snapshot: PartialSnapshot, pipelines: list[PartialPipeline],
             workers: list[PartialWorker]) -> list[Lie]:
        if snapshot.get("allocations", {}).get("srs") != []:
            return []
        proving = [w for w in workers if w.get("state") == "proving"]
        on_gpu = [(p.get("job_id"), pt.get("index")) for p in pipelines
                  for pt in _partitions(p) if pt.get("state") == "gpu"]
        if not proving and not on_gpu:
            return []
        job = proving[0].get("current_job") if proving else on_gpu[0][0]
        return [Lie("srs-empty", f"SRS list empty while job {job} is proving",
                    "a proving job holds its parameters: the list is unreadable, not empty",
                    "allocations.srs uses try_lock on the SRS manager and returns [] while the "
                    "mutex is held, e.g. during a 30-90 s parameter load")]

    def _memory_and_counters(self, snapshot: PartialSnapshot) -> list[Lie]:
        lies = []
        memory = snapshot.get("memory", {})
        used, total = _n(memory.get("used_bytes")), _n(memory.get("total_bytes"))
        if used is not None and total is not None and not 0 <= used <= total:
            lies.append(Lie("memory", f"memory used {used:g} B is outside 0..{total:g} B",
                            "the budget figures are estimates that no longer add up",
                            "the memory budget is an estimate (not RSS); the pinned pool is not "
                            "charged to it, and a request larger than the total blocks forever"))
        counters = snapshot.get("counters", {})
        for total_key, by_kind_key in (("total_completed", "completed_by_kind"),
                                       ("total_failed", "failed_by_kind")):
            count, by_kind = _n(counters.get(total_key)), counters.get(by_kind_key)
            if count is None or not isinstance(by_kind, dict):
                continue
            summed = sum(v for v in map(_n, by_kind.values()) if v is not None)
            if count != summed:
                lies.append(Lie("counters-by-kind",
                                f"counters.{total_key} is {count:g} but {by_kind_key} sums to "
                                f"{summed:g}",
                                "one of the two counts misses jobs",
                                "upstream updates the total and the per-kind maps separately"))
        return lies

    # ---- jobs that stay -----------------------------------------------------------------

    def _settled_jobs(self, pipelines: list[PartialPipeline], now: float) -> list[Lie]:
        lies = []
        seen = set()
        for p in pipelines:
            job = p.get("job_id")
            parts = _partitions(p)
            failed = [pt.get("index") for pt in parts if pt.get("state") == "failed"]
            all_done = bool(parts) and all(pt.get("state") == "done" for pt in parts)
            done = sum(1 for pt in parts if pt.get("state") == "done")
            reported_done = _n(p.get("partitions_done"))
            if reported_done is not None and parts and reported_done != done:
                lies.append(Lie("partitions-done",
                                f"job {job}: partitions_done is {reported_done:g} but "
                                f"{done} partition(s) show done",
                                "the progress figure is wrong",
                                "partitions_done is counted apart from the partition states"))
            kind = "failed" if failed else "done" if all_done else None
            if kind is None:
                continue
            key = (job, kind)
            seen.add(key)
            since = self.settled_since.setdefault(key, now)
            listed = now - since
            if listed < self.stuck_after:
                continue
            if kind == "failed":
                lies.append(Lie(
                    "failed-listed",
                    f"job {job} failed {_ago(listed)} ago (partition {_list(failed)}) and is "
                    "still listed",
                    "the job is over; it is not running, and it is missing from "
                    "counters.total_failed",
                    "jobs that fail a partition never reach job_completed, so upstream never "
                    "garbage-collects them nor counts them as failed"))
            else:
                lies.append(Lie(
                    "done-never-completed",
                    f"job {job}: all {len(parts)} partitions have shown done for {_ago(listed)}, "
                    "yet the job never completed",
                    "at least one partition failed on the GPU: the job failed, it did not finish",
                    "partition_gpu_end marks a partition done before the GPU result is checked, "
                    "and a failed job never reaches job_completed (a completed job leaves the "
                    "list after 30 s)"))
        for key in list(self.settled_since):
            if key not in seen:
                del self.settled_since[key]
        return lies


    # ---- the gRPC API's status, and where it and /status disagree -----------------------

    def _daemon(self, snapshot: PartialSnapshot, pipelines: list[PartialPipeline]) -> list[Lie]:
        lies = []
        synthesis_max = _n(snapshot.get("synthesis", {}).get("max_concurrent"))
        if synthesis_max is not None and synthesis_max > MAX_PARALLEL_SYNTHESIS:
            lies.append(Lie(
                "synthesis-max-uncapped",
                f"synthesis.max_concurrent is {synthesis_max:g}, above max_parallel_synthesis "
                f"(default {MAX_PARALLEL_SYNTHESIS})",
                f"at most max_parallel_synthesis ({MAX_PARALLEL_SYNTHESIS} unless configured) "
                "partitions synthesize at once: capacity looks larger than it is",
                "max_concurrent is the memory budget divided by one SnapDeals partition's size; "
                "the max_parallel_synthesis cap is not applied to it"))
        if "daemon" not in snapshot:
            return lies
        daemon = snapshot["daemon"]
        for gpu in daemon.get("gpus", []):
            if gpu.get("entries", 1) > 1:
                lies.append(Lie(
                    "gpus-per-worker",
                    f"GetStatus lists GPU {gpu.get('ordinal')} {gpu.get('entries')} times",
                    "it is one device: upstream writes one entry per GPU worker; counted here "
                    "once, with every worker's job",
                    "get_status builds one GPUStatus per worker (gpu_workers_per_device, "
                    "default 2), each with the device's name and VRAM"))
        unmeasured = [row.get("circuit_id") for row in daemon.get("loaded_srs", [])
                      if "size_bytes" not in row]
        if unmeasured:
            lies.append(Lie(
                "srs-hardcoded",
                f"GetStatus says {_list(unmeasured)} {'is' if len(unmeasured) == 1 else 'are'} "
                "HOT with 0 bytes and 0 users",
                "the tier, size and in-use count of a loaded SRS are not measured: shown as not "
                "reported",
                "service.rs hard-codes tier HOT, size_bytes 0 and ref_count 0 (a TODO)"))
        if "pinned_memory_limit_bytes" not in daemon:
            lies.append(Lie(
                "pinned-unreported", "GetStatus says pinned memory 0 of 0 bytes",
                "the CUDA pinned-memory pool is in use but not reported: shown as not reported",
                "service.rs hard-codes pinned_memory_bytes and pinned_memory_limit_bytes to 0"))
        on_gpu = {job["job_id"]: gpu.get("ordinal") for gpu in daemon.get("gpus", [])
                  for job in gpu.get("jobs", [])}
        for job_id in sorted(self.unassigned & set(on_gpu)):
            lies.append(Lie(
                "assigned-gpu-empty",
                f"SubmitProof answered assigned_gpu \"\" for job {job_id}, now on GPU "
                f"{on_gpu[job_id]}",
                "the daemon never says where a job will run; GetStatus shows it once it runs",
                "service.rs always answers assigned_gpu with an empty string"))
        for job_id in sorted(self.not_running & set(on_gpu)):
            lies.append(Lie(
                "cancel-noop",
                f"CancelProof answered was_running=false for job {job_id}, which is on GPU "
                f"{on_gpu[job_id]}",
                "the proof was not cancelled and runs on: upstream cannot stop a proof",
                "CancelProof is not implemented: it logs a warning and answers "
                "was_running=false"))
        listed = {row.get("circuit_id", "") for row in daemon.get("loaded_srs", [])}
        circuits = {kind: sorted(c for c in listed if c.startswith(prefix + "-"))
                    for kind, prefix in CIRCUIT_PREFIX.items()}
        named = [f"{kind} is {_list(ids)} in loaded_srs and {METRIC_LABEL[kind]} in the metrics"
                 for kind, ids in circuits.items() if ids]
        if named:
            lies.append(Lie(
                "kind-names", "; ".join(named),
                "one proof kind each: this page shows them under the status' name (the SRS id "
                "adds the sector size); a dashboard joining upstream's metrics to its status by "
                "kind must map the names the same way",
                "upstream names a kind three ways: ProofKind's Display in /status and "
                "GetStatus, metric_label in the metrics, the SRS registry's circuit ids"))
        proving_kinds = {job["proof_kind"] for gpu in daemon.get("gpus", [])
                         for job in gpu.get("jobs", [])}
        for kind in sorted(proving_kinds):
            prefix = CIRCUIT_PREFIX.get(kind)
            if prefix and not any(c.startswith(prefix + "-") for c in listed):
                lies.append(Lie(
                    "srs-unlisted",
                    f"a {kind} proof is on a GPU but loaded_srs lists no {prefix}-* SRS",
                    "its parameters are loaded (a proof cannot run without them); GetStatus "
                    "does not list them",
                    "loaded_srs lists only SRS loaded through PreloadSRS; one loaded on demand "
                    "for a proof is never listed"))
        in_memory = [row.get("circuit_id") for row in
                     snapshot.get("allocations", {}).get("srs", []) or []]
        missing = sorted(c for c in in_memory if c and c not in listed)
        if missing:
            lies.append(Lie(
                "srs-unlisted",
                f"/status holds {_list(missing)} in memory but loaded_srs does not list "
                f"{'it' if len(missing) == 1 else 'them'}",
                "the SRS is loaded; GetStatus does not list it",
                "loaded_srs lists only SRS loaded through PreloadSRS; one loaded on demand "
                "for a proof is never listed"))
        if pipelines:
            pending = {q["proof_kind"]: q["pending"] for q in daemon.get("queues", [])}
            waiting: dict[str, int] = {}
            for p in pipelines:
                count = sum(1 for pt in _partitions(p)
                            if pt.get("state") in ("pending", "synth_done"))
                if count and p.get("proof_kind"):
                    kind = str(p.get("proof_kind"))
                    waiting[kind] = waiting.get(kind, 0) + count
            for kind, count in sorted(waiting.items()):
                if not pending.get(kind):
                    lies.append(Lie(
                        "queue-hides-partitions",
                        f"GetStatus queues show 0 {kind} pending while {count} partition(s) "
                        "wait for synthesis or a GPU",
                        "work is waiting: the queue figures count whole jobs not yet started, "
                        "not partitions",
                        "queue_depth and queues[].pending count only the job-level scheduler "
                        "heap, not the synthesis and GPU queues"))
        counters = snapshot.get("counters", {})
        for http_key, grpc_key, word in (
                ("total_completed", "total_proofs_completed", "completed"),
                ("total_failed", "total_proofs_failed", "failed")):
            http_count = _n(counters.get(http_key))
            grpc_count = _n(daemon.get(grpc_key))
            if http_count is not None and grpc_count is not None and http_count < grpc_count:
                lies.append(Lie(
                    "counters-undercount",
                    f"/status counts {http_count:g} {word}, GetStatus {grpc_count:g}",
                    "GetStatus' totals are the daemon's; /status misses proofs",
                    "/status counts only jobs through the partition assembler "
                    "(StatusTracker.job_completed); the gRPC totals count every path (PoSt, "
                    "monolithic, failed before assembly)"))
        return lies


def _partitions(pipeline: PartialPipeline) -> list[PartialPartition]:
    return pipeline.get("partitions", [])


def _phase_counts(pipelines: list[PartialPipeline]) -> dict[str, int]:
    counts = dict.fromkeys(PARTITION_PHASES, 0)
    for p in pipelines:
        for pt in _partitions(p):
            state = pt.get("state")
            if state in counts:
                counts[state] += 1
    return counts


def _ws(ids) -> str:
    return ", ".join(f"W{i}" for i in ids)


def _list(items) -> str:
    return ", ".join(str(i) for i in items)


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
