"""A proof job's progress on its engine: the part of the engine's pipeline snapshot that the
dashboard follows (status, error, partitions). `ProofJob.progress` stores it as JSON; the
engine's snapshots carry it in each pipeline."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cuzk_engine.engine.snapshot import PartitionSnapshot, PipelineSnapshot
from vastmgr.fleet.partial_snapshot import PartialPipeline

# A pipeline that has nothing on a device, finalizing or done is waiting for a device.
STARTED_PHASES = frozenset({"gpu", "finalizing", "done"})


def partition_from_json(raw: Mapping) -> PartitionSnapshot:
    """A partition as the engine sent it; a timing it left out (an older engine, a record
    written before the field existed) reads as None."""
    return PartitionSnapshot._make(map(raw.get, PartitionSnapshot._fields))


def phase(status: str, partition_states: Iterable[str | None]) -> str:
    """What a job is doing, in the operator's words: `queued` (not admitted to synthesis),
    `waiting` (admitted, none of its partitions on a device yet), else the engine's status.
    (A partition's state may be unreported: that is not a started one.)"""
    if status == "running" and not any(state in STARTED_PHASES for state in partition_states):
        return "waiting"
    return status


def pipeline_phase(pipeline: PartialPipeline) -> str | None:
    """`phase` of a snapshot's pipeline, reading no more than the states: the fleet page asks
    it of every pipeline of every host whenever it renders its totals. None when the engine did
    not report the pipeline's status."""
    status = pipeline.get("status")
    if status is None:
        return None
    return phase(status, (p.get("state") for p in pipeline.get("partitions", [])))


def partition_title(partition: PartitionSnapshot) -> str:
    """The tooltip of a partition's cell: its phase and the time each stage took."""
    parts = [f"P{partition.index} {partition.state}"]
    for label, ms in (("synth", partition.synth_ms), ("gpu", partition.gpu_ms),
                      ("finalize", partition.finalize_ms)):
        if ms is not None:
            parts.append(f"{label} {ms:.0f} ms")
    return " · ".join(parts)


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's pipeline as last seen on its engine: `status` is the engine's (queued, running,
    done, failed, cancelled), not the dashboard's."""

    status: str | None = None
    error: str | None = None
    partitions: tuple[PartitionSnapshot, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping | None) -> JobProgress:
        """From a stored `ProofJob.progress` (None: nothing seen yet) or from a snapshot's
        pipeline, whose other fields are not read."""
        if data is None:
            return cls()
        return cls(data.get("status"), data.get("error"),
                   tuple(partition_from_json(p) for p in data.get("partitions", ())))

    @classmethod
    def of_pipeline(cls, pipeline: PipelineSnapshot) -> JobProgress:
        """From our engine's typed pipeline."""
        return cls(pipeline.status, pipeline.error, tuple(pipeline.partitions))

    def to_json(self) -> dict:
        return {"status": self.status, "error": self.error,
                "partitions": [p._asdict() for p in self.partitions]}

    def count(self, phase: str) -> int:
        return sum(1 for p in self.partitions if p.state == phase)

    @property
    def phase(self) -> str | None:
        """None while the engine has not been seen with the job."""
        return None if self.status is None else phase(self.status, (p.state for p in self.partitions))

    def cells(self) -> list[dict]:
        """The partitions as the page's cells show them (partition_cells.html)."""
        return [{"index": p.index, "state": p.state, "title": partition_title(p)}
                for p in self.partitions]
