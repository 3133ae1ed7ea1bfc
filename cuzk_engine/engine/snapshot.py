"""The engine's status as plain data: what ``StatusTracker.snapshot()`` returns, what
``GET /status`` and the live stream send (``to_json``), and what every reader (the client, the
dashboard, the tests) turns that JSON back into (``EngineSnapshot.from_json``).

``snapshot_violations`` lists every way a snapshot contradicts the status model; the tests and
the engine's own checks use it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, NamedTuple

from cuzk_engine.errors import SnapshotFormatError
from cuzk_engine.vocabulary import (
    PARAMETER_PHASES,
    PARTITION_PHASES,
    SETTLED_PHASES,
    UNFINISHED_STATUSES,
    WAITING_PHASES,
)

# The phases a job of each status can be in; which of them is decided by its partitions
# (settled or not) and its parameters (in hand or not).
_PHASES_OF_STATUS = {
    "queued": {"queued"},
    "running": {"generating_parameters", "loading_parameters", "running"},
    "done": {"done"},
    "failed": {"failing", "failed"},
    "cancelled": {"cancelling", "cancelled"},
}
_UNSETTLED_PHASES = frozenset({"cancelling", "failing"})


@dataclass(slots=True)
class MemorySnapshot:
    total_bytes: int
    used_bytes: int
    available_bytes: int


@dataclass(slots=True)
class SynthesisSnapshot:
    max_concurrent: int
    active: int


@dataclass(slots=True)
class CpuSnapshot:
    """How the engine shares the CPU: synthesis processes against the threads of each MSM
    that proving workers (device workers on the CPU backend, finalizers' G2 MSMs) run."""

    cores: int
    synthesis_processes: int  # = synthesis.max_concurrent
    msm_threads: int  # threads per MSM call
    provers: int  # workers that may each run MSMs at once


class PartitionSnapshot(NamedTuple):
    """Immutable, so an unchanged partition's object is shared between snapshots; a tuple
    because a frozen dataclass costs ~15x more to build and running timers rebuild some of these
    on every snapshot."""

    index: int  # type: ignore[assignment]  # a JSON key; it hides tuple.index, unused here
    state: str
    synth_ms: float | None
    gpu_ms: float | None
    finalize_ms: float | None
    synth_start_ms: float | None  # offsets from the pipeline's submission, for a timeline
    gpu_start_ms: float | None
    finalize_start_ms: float | None
    worker_id: int | None


@dataclass(slots=True)
class PipelineSnapshot:
    job_id: str
    request_id: str | None
    proof_kind: str
    kind: str
    profile: str
    circuit_id: str
    priority: str
    status: str
    error: str | None
    started_secs_ago: float
    queued_ms: float | None
    srs_load_ms: float | None
    total_partitions: int
    partitions_done: int
    partitions: list[PartitionSnapshot]
    # The job as a whole (vocabulary.JOB_PHASES) and for how long it has been in that phase;
    # while it waits for parameters, the set's size in memory so far and (when generated)
    # the share of the setup done. None from an engine too old to say.
    phase: str | None = None
    phase_secs: float | None = None
    params_bytes: int | None = None
    params_progress: float | None = None


@dataclass(slots=True)
class WorkerSnapshot:
    worker_id: int
    gpu_ordinal: int
    state: str
    current_job: str | None
    current_partition: int | None
    busy_secs: float | None
    busy_total_secs: float


@dataclass(slots=True)
class DeviceSnapshot:
    ordinal: int
    name: str
    backend: str
    description: str
    workers: list[int]


@dataclass(slots=True)
class AllocationSnapshot:
    circuit_id: str
    bytes: int
    state: str
    in_use: int
    last_used_secs_ago: float
    evictable: bool
    state_secs: float | None  # how long it has been in `state` (None: an older engine)
    progress: float | None  # generating: the share of the setup done


@dataclass(slots=True)
class CountersSnapshot:
    total_completed: int
    total_failed: int
    total_cancelled: int
    completed_by_kind: dict[str, int]
    failed_by_kind: dict[str, int]
    cancelled_by_kind: dict[str, int]
    queue_depth: int
    queue_depth_by_kind: dict[str, int]


@dataclass(slots=True)
class BuffersSnapshot:
    synth_in_flight: int  # partitions being synthesized
    pending_handles: int  # synthesized partitions waiting for a worker
    provers_in_flight: int  # partitions on a device
    aux_in_flight: int  # partitions being finalized


@dataclass(frozen=True, slots=True)
class StreamHeartbeat:
    """What the status stream sends, to a client that asked for heartbeats, after that long
    with nothing to send: the engine is alive and its seq is `seq` now. It carries no snapshot
    key but `seq`, so a reader that does not know it cannot take it for a snapshot
    (``EngineSnapshot.from_json`` refuses it)."""

    seq: int

    # The intervals a stream may ask for: more often would cost more than it proves.
    SHORTEST: ClassVar[float] = 0.05
    LONGEST: ClassVar[float] = 300.0

    @classmethod
    def interval(cls, raw: str) -> float:
        """The interval a stream asked for (``?heartbeat=S``); ValueError saying why not."""
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(f"heartbeat must be a number of seconds, got {raw!r}") from None
        if not math.isfinite(seconds) or not cls.SHORTEST <= seconds <= cls.LONGEST:
            raise ValueError(f"heartbeat must be between {cls.SHORTEST:g} and "
                             f"{cls.LONGEST:g} seconds")
        return seconds

    def to_json(self) -> dict:
        return {"heartbeat": True, "seq": self.seq}

    @classmethod
    def from_json(cls, data: object) -> StreamHeartbeat | None:
        """The heartbeat this message is, or None when it is not one (a snapshot)."""
        if not isinstance(data, dict) or data.get("heartbeat") is not True:
            return None
        seq = data.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise SnapshotFormatError(f"heartbeat: seq must be an integer, got {seq!r}")
        return cls(seq)


@dataclass(slots=True)
class EngineSnapshot:
    seq: int
    version: str
    uptime_secs: float
    accepting: bool
    memory: MemorySnapshot
    synthesis: SynthesisSnapshot
    pipelines: list[PipelineSnapshot]
    gpu_workers: list[WorkerSnapshot]
    devices: list[DeviceSnapshot]
    allocations: dict[str, list[AllocationSnapshot]]
    counters: CountersSnapshot
    buffers: BuffersSnapshot
    cpu: CpuSnapshot | None = None  # None: an engine too old to say

    def to_json(self) -> dict:
        """Plain JSON-ready dicts, built directly: ``dataclasses.asdict`` deep-copies every
        value and took ~25x longer for 100 pipelines x 16 partitions, all on the event loop."""
        part_names = PartitionSnapshot._fields
        pipelines = []
        for p in self.pipelines:
            d = _as_dict(p)
            d["partitions"] = [dict(zip(part_names, pt)) for pt in p.partitions]
            pipelines.append(d)
        counters = _as_dict(self.counters)
        for key in ("completed_by_kind", "failed_by_kind", "cancelled_by_kind",
                    "queue_depth_by_kind"):
            counters[key] = dict(counters[key])
        return {
            "seq": self.seq,
            "version": self.version,
            "uptime_secs": self.uptime_secs,
            "accepting": self.accepting,
            "memory": _as_dict(self.memory),
            "synthesis": _as_dict(self.synthesis),
            "pipelines": pipelines,
            "gpu_workers": [_as_dict(w) for w in self.gpu_workers],
            "devices": [{**_as_dict(d), "workers": list(d.workers)} for d in self.devices],
            "allocations": {kind: [_as_dict(a) for a in allocs]
                            for kind, allocs in self.allocations.items()},
            "counters": counters,
            "buffers": _as_dict(self.buffers),
            "cpu": None if self.cpu is None else _as_dict(self.cpu),
        }

    @classmethod
    def from_json(cls, data: object) -> EngineSnapshot:
        """The inverse of ``to_json``; raises ``SnapshotFormatError`` naming the first part that
        is missing or of the wrong shape. Keys it does not know are ignored, so an older reader
        accepts a newer engine's snapshot. (The controller reads hundreds of these a second:
        where a part is named is worked out only when one is wrong.)"""
        d = _object(data, ())
        pipelines = []
        for i, raw in enumerate(_list(d, "pipelines", ())):
            where = ("pipelines", i)
            raw = _object(raw, where)  # before its partitions are looked up in it
            parts = [PartitionSnapshot(*_values(PartitionSnapshot, pt, where + ("partitions", j)))
                     for j, pt in enumerate(_list(raw, "partitions", where))]
            names, _ = _plain_fields(PipelineSnapshot)
            pipelines.append(PipelineSnapshot(
                partitions=parts, **dict(zip(names, _values(PipelineSnapshot, raw, where)))))
        by_kind = _object(d.get("allocations"), ("allocations",))
        seq, version, uptime_secs, accepting = _values(EngineSnapshot, d, ())
        return cls(
            seq=seq, version=version, uptime_secs=uptime_secs, accepting=accepting,
            memory=MemorySnapshot(*_values(MemorySnapshot, d.get("memory"), ("memory",))),
            synthesis=SynthesisSnapshot(*_values(SynthesisSnapshot, d.get("synthesis"),
                                                 ("synthesis",))),
            pipelines=pipelines,
            gpu_workers=[WorkerSnapshot(*_values(WorkerSnapshot, w, ("gpu_workers", i)))
                         for i, w in enumerate(_list(d, "gpu_workers", ()))],
            devices=[DeviceSnapshot(*_values(DeviceSnapshot, raw, ("devices", i)))
                     for i, raw in enumerate(_list(d, "devices", ()))],
            allocations={
                kind: [AllocationSnapshot(*_values(AllocationSnapshot, a, ("allocations", kind, i)))
                       for i, a in enumerate(_list(by_kind, kind, ("allocations",)))]
                for kind in by_kind},
            counters=CountersSnapshot(*_values(CountersSnapshot, d.get("counters"),
                                               ("counters",))),
            buffers=BuffersSnapshot(*_values(BuffersSnapshot, d.get("buffers"), ("buffers",))),
            cpu=None if d.get("cpu") is None else CpuSnapshot(
                *_values(CpuSnapshot, d["cpu"], ("cpu",))),
        )


    @classmethod
    def check_json(cls, data: object) -> None:
        """Raise ``SnapshotFormatError`` wherever ``from_json`` would, without building the
        snapshot: for a reader that keeps the JSON and decodes it only when it needs the typed
        form (the fleet controller receives a thousand a second and stores and renders their
        JSON). A quick look first; only a snapshot that fails it is decoded, to name the part
        that is wrong with ``from_json``'s own message."""
        if not _has_shape(data):
            cls.from_json(data)


def _has_shape(data: object) -> bool:
    """Whether every part ``from_json`` reads is an object with the keys it needs, or a list
    of such objects: then it reads ``data`` without an error (nothing else in it can make it
    raise). Comparisons of each object's keys with a set, instead of the objects built from
    them, written out in loops: helper calls and generators cost as much as the checks."""
    (snapshot, memory, synthesis, counters, buffers, cpu, pipeline, partition, worker, device,
     allocation) = _required_keys()
    if type(data) is not dict or not data.keys() >= snapshot:
        return False
    for part, keys in ((data.get("memory"), memory), (data.get("synthesis"), synthesis),
                       (data.get("counters"), counters), (data.get("buffers"), buffers)):
        if type(part) is not dict or not part.keys() >= keys:
            return False
    part = data.get("cpu")
    if part is not None and (type(part) is not dict or not part.keys() >= cpu):
        return False
    pipelines, workers, devices = data.get("pipelines"), data.get("gpu_workers"), data.get("devices")
    by_kind = data.get("allocations")
    if type(pipelines) is not list or type(workers) is not list or type(devices) is not list \
            or type(by_kind) is not dict:
        return False
    lists: list[tuple[object, frozenset[str]]] = [(workers, worker), (devices, device)]
    for p in pipelines:
        if type(p) is not dict or not p.keys() >= pipeline:
            return False
        lists.append((p.get("partitions"), partition))
    lists.extend((allocs, allocation) for allocs in by_kind.values())
    for items, keys in lists:
        if type(items) is not list:
            return False
        for item in items:
            if type(item) is not dict or not item.keys() >= keys:
                return False
    return True


@functools.cache
def _required_keys() -> tuple[frozenset[str], ...]:
    """The keys `_has_shape` requires of each part, in the order it unpacks them: a class's
    plain fields less those an older engine did not send."""
    return tuple(frozenset(_plain_fields(cls)[0]).difference(_OPTIONAL.get(cls, ()))
                 for cls in (EngineSnapshot, MemorySnapshot, SynthesisSnapshot, CountersSnapshot,
                             BuffersSnapshot, CpuSnapshot, PipelineSnapshot, PartitionSnapshot,
                             WorkerSnapshot, DeviceSnapshot, AllocationSnapshot))


@functools.cache
def _field_reader(cls: type) -> tuple[tuple[str, ...], Callable[[object], tuple]]:
    names = tuple(f.name for f in fields(cls))
    return names, attrgetter(*names)


def _as_dict(obj: object) -> dict[str, Any]:
    """A flat dataclass as a dict (one level: nested values are handled by the caller)."""
    # a class is hashable; mypy reads type[object].__hash__ as the unbound method
    names, get = _field_reader(type(obj))  # type: ignore[arg-type]
    return dict(zip(names, get(obj)))


# Fields an older engine did not send: read as None when absent.
_OPTIONAL = {
    PipelineSnapshot: ("phase", "phase_secs", "params_bytes", "params_progress"),
    AllocationSnapshot: ("state_secs", "progress"),
}

# Fields read from JSON as they are; the others are built from nested JSON by from_json.
_NESTED = {
    PipelineSnapshot: ("partitions",),
    EngineSnapshot: ("memory", "synthesis", "pipelines", "gpu_workers", "devices",
                     "allocations", "counters", "buffers", "cpu"),
}


@functools.cache
def _plain_fields(cls: type) -> tuple[tuple[str, ...], Callable[[dict[str, Any]], tuple]]:
    """A snapshot class's plain fields in order, and a getter of their values from a dict
    (every class has at least two, so the getter returns a tuple). The nested fields are
    passed by keyword."""
    names: tuple[str, ...] = getattr(cls, "_fields", ()) or tuple(f.name for f in fields(cls))
    plain = tuple(n for n in names if n not in _NESTED.get(cls, ()))
    return plain, itemgetter(*plain)


def _path(where: tuple[str | int, ...]) -> str:
    text = "snapshot"
    for part in where:
        text = f"{text}[{part}]" if isinstance(part, int) else f"{text}.{part}"
    return text.removeprefix("snapshot.")


def _object(value: object, where: tuple[str | int, ...]) -> dict[str, Any]:
    if type(value) is not dict:
        raise SnapshotFormatError(f"{_path(where)}: expected an object, "
                                  f"got {type(value).__name__}")
    return value


def _list(source: dict[str, Any], key: str, where: tuple[str | int, ...]) -> list[Any]:
    value = source.get(key)
    if type(value) is not list:
        raise SnapshotFormatError(f"{_path((*where, key))}: expected a list, "
                                  f"got {type(value).__name__}")
    return value


def _values(cls: type, raw: object, where: tuple[str | int, ...]) -> Any:
    """The plain fields of ``cls`` from its JSON object, in order: a tuple to spread into the
    constructor (``Any``, since its length is the class's and no static type can say so)."""
    d = _object(raw, where)
    plain, get = _plain_fields(cls)
    try:
        return get(d)
    except KeyError:
        optional = _OPTIONAL.get(cls, ())
        missing = ", ".join(n for n in plain if n not in d and n not in optional)
        if missing:
            raise SnapshotFormatError(f"{_path(where)}: missing {missing}") from None
        return tuple(d.get(n) for n in plain)


def snapshot_violations(snap: EngineSnapshot) -> list[str]:
    """Every way a snapshot can contradict the status model; empty when it tells the truth."""
    bad: list[str] = []
    holders: dict[tuple[str, int], list[int]] = {}
    for w in snap.gpu_workers:
        if w.state == "proving":
            if w.current_job is None or w.current_partition is None or w.busy_secs is None:
                bad.append(f"worker {w.worker_id} proving without a job/partition/busy time")
                continue
            holders.setdefault((w.current_job, w.current_partition), []).append(w.worker_id)
        elif w.current_job is not None or w.current_partition is not None or w.busy_secs is not None:
            bad.append(f"idle worker {w.worker_id} still names {w.current_job}/{w.current_partition}")
    counts = dict.fromkeys(PARTITION_PHASES, 0)
    generating = {a.circuit_id for a in snap.allocations.get("srs", ()) if a.state == "generating"}
    seen: set[tuple[str, int]] = set()
    queued = 0
    for p in snap.pipelines:
        states = [pt.state for pt in p.partitions]
        for pt in p.partitions:
            counts[pt.state] += 1
            key = (p.job_id, pt.index)
            if pt.state == "gpu":
                seen.add(key)
                ws = holders.get(key, [])
                if len(ws) != 1:
                    bad.append(f"{p.job_id}/{pt.index} in gpu held by workers {ws}")
                elif pt.worker_id != ws[0]:
                    bad.append(f"{p.job_id}/{pt.index} names worker {pt.worker_id}, held by {ws}")
        if p.partitions_done != states.count("done"):
            bad.append(f"{p.job_id}: partitions_done {p.partitions_done} != {states.count('done')}")
        if p.status == "queued":
            queued += 1
            if any(s != "pending" for s in states):
                bad.append(f"{p.job_id}: queued with partitions {states}")
        if p.status == "done" and any(s != "done" for s in states):
            bad.append(f"{p.job_id}: done with partitions {states}")
        if p.status in ("failed", "cancelled") and any(s in WAITING_PHASES for s in states):
            bad.append(f"{p.job_id}: {p.status} but partitions still waiting: {states}")
        if p.status in UNFINISHED_STATUSES and any(s in ("failed", "cancelled")
                                                   for s in states):
            bad.append(f"{p.job_id}: {p.status} with settled-bad partitions {states}")
        if p.status == "failed" and not p.error:
            bad.append(f"{p.job_id}: failed without a reason")
        if p.phase is not None:
            bad.extend(_phase_violations(p, states, generating))
    for key, ws in holders.items():
        if key not in seen:
            bad.append(f"workers {ws} prove {key[0]}/{key[1]} which is not in gpu")
    if snap.synthesis.active != counts["synthesizing"]:
        bad.append(f"synthesis.active {snap.synthesis.active} != {counts['synthesizing']}")
    b = snap.buffers
    if (b.synth_in_flight, b.pending_handles, b.provers_in_flight, b.aux_in_flight) != (
        counts["synthesizing"], counts["synth_done"], counts["gpu"], counts["finalizing"]
    ):
        bad.append(f"buffers {b} disagree with partition phases {counts}")
    if snap.cpu is not None:
        cpu = snap.cpu
        if cpu.synthesis_processes != snap.synthesis.max_concurrent:
            bad.append(f"cpu.synthesis_processes {cpu.synthesis_processes} != "
                       f"synthesis.max_concurrent {snap.synthesis.max_concurrent}")
        if min(cpu.cores, cpu.msm_threads, cpu.provers) < 1:
            bad.append(f"cpu split {cpu} has a count below 1")
    m = snap.memory
    if not 0 <= m.used_bytes <= m.total_bytes:
        bad.append(f"memory used {m.used_bytes} outside 0..{m.total_bytes}")
    c = snap.counters
    for total, by_kind, name in ((c.total_completed, c.completed_by_kind, "completed"),
                                 (c.total_failed, c.failed_by_kind, "failed"),
                                 (c.total_cancelled, c.cancelled_by_kind, "cancelled"),
                                 (c.queue_depth, c.queue_depth_by_kind, "queue_depth")):
        if total != sum(by_kind.values()):
            bad.append(f"counters.{name} {total} != sum by kind {by_kind}")
    if c.queue_depth != queued:
        bad.append(f"queue_depth {c.queue_depth} != queued pipelines {queued}")
    return bad


def _phase_violations(p: PipelineSnapshot, states: list[str], generating: set[str]) -> list[str]:
    """Where a pipeline's phase contradicts its status, its partitions or the SRS list."""
    if p.phase not in _PHASES_OF_STATUS.get(p.status, ()):
        return [f"{p.job_id}: phase {p.phase} with status {p.status}"]
    bad = []
    if p.phase in PARAMETER_PHASES and any(s != "pending" for s in states):
        bad.append(f"{p.job_id}: {p.phase} with partitions {states}")
    if (p.phase == "generating_parameters") != (p.circuit_id in generating) and \
            p.phase in PARAMETER_PHASES:
        bad.append(f"{p.job_id}: {p.phase} but the SRS list says {p.circuit_id} is "
                   f"{'' if p.circuit_id in generating else 'not '}being generated")
    unsettled = any(s not in SETTLED_PHASES for s in states)
    if p.status in ("failed", "cancelled") and unsettled != (p.phase in _UNSETTLED_PHASES):
        bad.append(f"{p.job_id}: phase {p.phase} with partitions {states}")
    return bad
