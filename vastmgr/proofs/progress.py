"""A proof job's progress on its engine: the part of the engine's pipeline snapshot that the
dashboard follows (status, error, partitions). `ProofJob.progress` stores it as JSON; the
engine's snapshots carry it in each pipeline."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cuzk_engine.engine.snapshot import PartitionSnapshot, PipelineSnapshot
from cuzk_engine.vocabulary import PARAMETER_PHASES, SETTLED_PHASES
from vastmgr.fleet.partial_snapshot import PartialPipeline

# A pipeline that has something on a device, finalizing or done has started proving.
STARTED_PHASES = frozenset({"gpu", "finalizing", "done"})
# The engine's job phases a page shows as they are (vocabulary.JOB_PHASES); for the others
# the partitions say more (see `phase`).
_SHOWN_ENGINE_PHASES = PARAMETER_PHASES | {"cancelling", "failing"}

# What a job is doing, in the operator's words: the words pages show (and `data-phase`).
PHASE_LABELS = {
    "queued": "queued",
    "generating_parameters": "generating parameters",
    "loading_parameters": "loading parameters",
    "pending": "waiting to synthesize",
    "synthesizing": "synthesizing",
    "waiting": "waiting for a device",
    "running": "running",
    "cancelling": "cancelling",
    "failing": "failing",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}
PHASE_TITLES = {
    "generating_parameters": "First use of this circuit: the engine runs the (test) setup "
                             "that creates its parameters",
    "loading_parameters": "The engine reads this circuit's parameters into memory",
    "pending": "Parameters in hand; no partition has started synthesis yet (synthesis "
               "slots or memory are busy)",
    "synthesizing": "Partitions are being synthesized; none is ready for a device yet",
    "waiting": "Synthesized partitions wait for a free device worker; none has reached a "
               "device yet",
    "cancelling": "Cancelled; partitions still on a device or finalizing settle when the "
                  "device lets go",
    "failing": "Failed; partitions still on a device or finalizing settle when the device "
               "lets go",
}
# An ETA from earlier jobs needs this many finished runs of the same kind and profile.
ETA_MIN_RUNS = 3
# Phases of a job on an engine that no device has touched yet.
NOT_STARTED = frozenset({"queued", *PARAMETER_PHASES, "pending", "synthesizing", "waiting"})


def partition_from_json(raw: Mapping) -> PartitionSnapshot:
    """A partition as the engine sent it; a timing it left out (an older engine, a record
    written before the field existed) reads as None."""
    return PartitionSnapshot._make(map(raw.get, PartitionSnapshot._fields))


def phase(status: str, partition_states: Iterable[str | None],
          engine_phase: str | None = None) -> str:
    """What a job is doing, in the operator's words (PHASE_LABELS): the engine's phase while
    it waits for parameters or lets go after a cancel or failure; a running job none of whose
    partitions has reached a device is `waiting` (some are synthesized), `synthesizing` or
    `pending`; else the engine's status. (A partition's state may be unreported: that is not a
    started one.)"""
    if engine_phase in _SHOWN_ENGINE_PHASES:
        return engine_phase
    if status != "running":
        return status
    states = set(partition_states)
    if states & STARTED_PHASES:
        return "running"
    if "synth_done" in states:
        return "waiting"
    return "synthesizing" if "synthesizing" in states else "pending"


def pipeline_phase(pipeline: PartialPipeline) -> str | None:
    """`phase` of a snapshot's pipeline, reading no more than the states: the fleet page asks
    it of every pipeline of every host whenever it renders its totals. None when the engine did
    not report the pipeline's status."""
    status = pipeline.get("status")
    if status is None:
        return None
    return phase(status, (p.get("state") for p in pipeline.get("partitions", [])),
                 pipeline.get("phase"))


def segments(partition: PartitionSnapshot,
             end_ms: float | None = None) -> list[tuple[str, float, float]]:
    """A partition's stages on the job's time axis (milliseconds from its submission on the
    engine): (`synth` | `queue` | `gpu` | `finalize`, start, length). `queue` is the wait of a
    synthesized partition for a device: until it got one, or, for one that never did (the job
    was cancelled or failed first), until the job's end `end_ms` when that is known."""
    stages: list[tuple[str, float, float]] = []
    p = partition
    if p.synth_start_ms is not None and p.synth_ms is not None:
        synth_end = p.synth_start_ms + p.synth_ms
        stages.append(("synth", p.synth_start_ms, p.synth_ms))
        waited_until = p.gpu_start_ms if p.gpu_start_ms is not None else end_ms
        if waited_until is not None and waited_until > synth_end:
            stages.append(("queue", synth_end, waited_until - synth_end))
    if p.gpu_start_ms is not None and p.gpu_ms is not None:
        stages.append(("gpu", p.gpu_start_ms, p.gpu_ms))
    if p.finalize_start_ms is not None and p.finalize_ms is not None:
        stages.append(("finalize", p.finalize_start_ms, p.finalize_ms))
    return stages


# The job's own waits before its partitions, as its timeline labels them.
JOB_WAIT_LABELS = {"engine_queue": "waiting in the engine's queue",
                   "generating_parameters": "generating parameters",
                   "loading_parameters": "loading parameters",
                   "parameters": "loading or generating parameters"}


def job_waits(progress: JobProgress, timings: Mapping | None) -> list[tuple[str, float, float]]:
    """The job's waits before any partition could start, on its time axis (milliseconds from
    its submission on the engine): (`engine_queue` | a JOB_WAIT_LABELS parameter key, start,
    length). An ended job's come from the engine's timings; a running one's from its pipeline:
    a first use of a circuit generates its parameters, which can be most of the job's time."""
    if timings and timings.get("total_ms") is not None:
        queued, params, key = timings.get("queue_ms") or 0.0, timings.get("srs_load_ms"), \
            "parameters"
    else:
        if progress.queued_ms is None or progress.elapsed_s is None:
            return []
        queued, key = progress.queued_ms, "parameters"
        if progress.engine_phase in PARAMETER_PHASES:
            key = progress.engine_phase
            params = progress.elapsed_s * 1000.0 - queued  # still waiting, as of the snapshot
        else:
            ready = progress.ready_s
            params = None if ready is None else ready * 1000.0 - queued
    waits = [("engine_queue", 0.0, queued)] if queued >= 1.0 else []
    if params is not None and params >= 1.0:
        waits.append((key, queued, params))
    return waits


def proof_duration_ms(partitions: Iterable[PartitionSnapshot],
                      total_ms: float | None) -> float | None:
    """A proof's duration, the one definition every page, the API and /metrics show: from its
    submission on the engine until nothing of it ran any more. That is the engine's own end
    (`timings.total_ms`), or later for a job cancelled or failed while partitions were on a
    device, which settle after it: when the last of them did. None without the engine's end."""
    if total_ms is None:
        return None
    ends = [start + length for p in partitions for _, start, length in segments(p)]
    return max([float(total_ms), *ends])


def partition_title(partition: PartitionSnapshot) -> str:
    """The tooltip of a partition's cell: its phase and the time each stage took."""
    parts = [f"P{partition.index} {partition.state}"]
    for label, ms in (("synth", partition.synth_ms), ("gpu", partition.gpu_ms),
                      ("finalize", partition.finalize_ms)):
        if ms is not None:
            parts.append(f"{label} {ms:.0f} ms")
    return " · ".join(parts)


def partition_end_ms(partition: PartitionSnapshot) -> float | None:
    """When a finished partition's finalization ended, on the job's time axis."""
    if partition.finalize_start_ms is None or partition.finalize_ms is None:
        return None
    return partition.finalize_start_ms + partition.finalize_ms


def remaining_s(progress: JobProgress, now: float, earlier_spans_s: Sequence[float]) -> float | None:
    """The time a running job still needs, estimated at `now` (epoch seconds); None when there
    is no basis for a number yet (pages say "estimating").

    A pipeline finishes its partitions one after another at the pace its devices allow, and
    only the first also carries the pipeline's latency (synthesis, a device, finalization):
    a pace measured from the job's start over one finished partition multiplies that latency
    by every partition left (the "68 s left at 1/10, done 14 s later" of issue 39). So the
    pace is measured between finished partitions, from two on, on the engine's own clock;
    before that, from `earlier_spans_s`, how long recent jobs of the same kind and profile
    took once their parameters were in hand (at least ETA_MIN_RUNS of them), counted from
    when this job had its own."""
    engine_now = progress.engine_now(now)
    if engine_now is None:
        return None
    ends = sorted(end for p in progress.partitions
                  if p.state == "done" and (end := partition_end_ms(p)) is not None)
    if len(ends) >= 2:
        pace_s = (ends[-1] - ends[0]) / 1000.0 / (len(ends) - 1)
        left = len(progress.partitions) - progress.count("done")
        return max(pace_s * left - (engine_now - ends[-1] / 1000.0), 0.0)
    ready = progress.ready_s
    if ready is not None and len(earlier_spans_s) >= ETA_MIN_RUNS:
        return max(statistics.median(earlier_spans_s) - (engine_now - ready), 0.0)
    return None


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's pipeline as last seen on its engine: `status` is the engine's (queued, running,
    done, failed, cancelled), not the dashboard's; `engine_phase` its job phase, held for
    `phase_secs` when seen; `elapsed_s` the time since its submission there (the engine's
    `started_secs_ago`), `queued_ms` its wait in the engine's queue; `as_of` when it was seen
    (seconds since the epoch)."""

    status: str | None = None
    error: str | None = None
    partitions: tuple[PartitionSnapshot, ...] = ()
    engine_phase: str | None = None
    phase_secs: float | None = None
    params_progress: float | None = None
    as_of: float | None = None
    elapsed_s: float | None = None
    queued_ms: float | None = None

    @classmethod
    def from_json(cls, data: Mapping | None, as_of: float | None = None) -> JobProgress:
        """From a stored `ProofJob.progress` (None: nothing seen yet) or from a snapshot's
        pipeline (seen at `as_of`), whose other fields are not read."""
        if data is None:
            return cls()
        return cls(data.get("status"), data.get("error"),
                   tuple(partition_from_json(p) for p in data.get("partitions", ())),
                   data.get("phase"), data.get("phase_secs"), data.get("params_progress"),
                   data.get("as_of", as_of), data.get("started_secs_ago"),
                   data.get("queued_ms"))

    @classmethod
    def of_pipeline(cls, pipeline: PipelineSnapshot, as_of: float | None = None) -> JobProgress:
        """From our engine's typed pipeline."""
        return cls(pipeline.status, pipeline.error, tuple(pipeline.partitions), pipeline.phase,
                   pipeline.phase_secs, pipeline.params_progress, as_of,
                   pipeline.started_secs_ago, pipeline.queued_ms)

    def to_json(self) -> dict:
        return {"status": self.status, "error": self.error,
                "partitions": [p._asdict() for p in self.partitions],
                "phase": self.engine_phase, "phase_secs": self.phase_secs,
                "params_progress": self.params_progress, "as_of": self.as_of,
                "started_secs_ago": self.elapsed_s, "queued_ms": self.queued_ms}

    def engine_now(self, now: float) -> float | None:
        """`now` (epoch seconds) on the job's time axis: seconds since its submission on the
        engine. None from an engine too old to say how long ago that was."""
        if self.elapsed_s is None or self.as_of is None:
            return None
        return self.elapsed_s + max(now - self.as_of, 0.0)

    @property
    def ready_s(self) -> float | None:
        """When the job had its parameters, on its time axis (seconds), once it is running."""
        if self.engine_phase != "running" or self.elapsed_s is None or self.phase_secs is None:
            return None
        return self.elapsed_s - self.phase_secs

    def count(self, phase: str) -> int:
        return sum(1 for p in self.partitions if p.state == phase)

    @property
    def settled(self) -> bool:
        """No partition is still in flight (also true before the engine reported any)."""
        return all(p.state in SETTLED_PHASES for p in self.partitions)

    @property
    def phase(self) -> str | None:
        """None while the engine has not been seen with the job."""
        if self.status is None:
            return None
        return phase(self.status, (p.state for p in self.partitions), self.engine_phase)

    def cells(self) -> list[dict]:
        """The partitions as the page's cells show them (partition_cells.html)."""
        return [{"index": p.index, "state": p.state, "title": partition_title(p)}
                for p in self.partitions]
