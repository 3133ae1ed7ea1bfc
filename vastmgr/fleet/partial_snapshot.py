"""A status snapshot in which any field may be missing: what the pages, the history and the lie
detector read.

Our engine's snapshot is complete (`cuzk_engine.engine.snapshot.EngineSnapshot`, checked on
arrival). An upstream cuzk daemon's is not: `controller.upstream.map_snapshot` keeps only what
it reported, so the panel can say "not reported" instead of showing a zero nobody measured.
Both are stored as JSON in `MachineStatus.snapshot` and read back through these TypedDicts (every
key optional, `total=False`), so a reader has to say what it does when a field is absent.
"""

from __future__ import annotations

from typing import TypedDict

Number = int | float


class PartialMemory(TypedDict, total=False):
    total_bytes: Number
    used_bytes: Number
    available_bytes: Number


class PartialSynthesis(TypedDict, total=False):
    max_concurrent: Number
    active: Number


class PartialCounters(TypedDict, total=False):
    total_completed: Number
    total_failed: Number
    total_cancelled: Number
    completed_by_kind: dict[str, Number]
    failed_by_kind: dict[str, Number]
    cancelled_by_kind: dict[str, Number]
    queue_depth: Number
    queue_depth_by_kind: dict[str, Number]


class PartialPartition(TypedDict, total=False):
    index: Number
    state: str
    synth_ms: Number | None
    gpu_ms: Number | None
    finalize_ms: Number | None


class PartialPipeline(TypedDict, total=False):
    job_id: str
    request_id: str | None
    proof_kind: str
    profile: str
    priority: str
    status: str
    error: str | None
    started_secs_ago: Number
    total_partitions: Number
    partitions_done: Number
    partitions: list[PartialPartition]
    circuit_id: str
    phase: str | None  # vocabulary.JOB_PHASES (our engine only)
    phase_secs: Number | None
    params_bytes: Number | None
    params_progress: Number | None


class PartialWorker(TypedDict, total=False):
    worker_id: Number
    gpu_ordinal: Number
    state: str
    current_job: str | None  # present but null: the worker holds no job
    current_partition: Number | None
    busy_secs: Number | None
    busy_total_secs: Number


class PartialAllocation(TypedDict, total=False):
    circuit_id: str
    bytes: Number
    state: str
    in_use: Number
    last_used_secs_ago: Number
    evictable: bool
    state_secs: Number | None
    progress: Number | None


class PartialAllocations(TypedDict, total=False):
    srs: list[PartialAllocation]
    pce: list[PartialAllocation]  # upstream only


class LieRow(TypedDict):
    code: str
    title: str
    meaning: str
    cause: str


class LieTallyRow(TypedDict):
    code: str
    title: str
    episodes: int
    snapshots: int
    first_seen: float
    last_seen: float
    present: bool


class DaemonJob(TypedDict):
    job_id: str
    proof_kind: str


class DaemonGPU(TypedDict, total=False):
    """One GPU as an upstream daemon's GetStatus lists it. Upstream sends one entry per GPU
    *worker* (two per device by default): `entries` counts them, `jobs` gathers their current
    jobs. `name` and the VRAM figures are absent when upstream fell back to "GPU N" and 0 bytes
    (nvidia-smi did not list the ordinal)."""
    ordinal: int
    name: str
    vram_total_bytes: int
    vram_free_bytes: int
    entries: int
    jobs: list[DaemonJob]


class DaemonSRS(TypedDict, total=False):
    """An SRS in GetStatus' loaded_srs. Upstream hard-codes tier HOT, size 0 and ref_count 0:
    a 0 is left out (not measured, so "not reported"), the tier is kept as sent."""
    circuit_id: str
    tier: str
    size_bytes: int
    ref_count: int


class DaemonQueue(TypedDict):
    proof_kind: str
    pending: int
    in_progress: int


class DaemonStatus(TypedDict, total=False):
    """An upstream daemon's gRPC GetStatus, mapped (vastmgr.controller.upstream). Pinned-memory
    figures are left out when 0: upstream always sends 0."""
    gpus: list[DaemonGPU]
    loaded_srs: list[DaemonSRS]
    queues: list[DaemonQueue]
    total_proofs_completed: int
    total_proofs_failed: int
    uptime_seconds: int
    pinned_memory_bytes: int
    pinned_memory_limit_bytes: int


class PartialSnapshot(TypedDict, total=False):
    seq: int
    flavour: str  # set for an upstream daemon's snapshot; our engine's has none
    version: str
    uptime_secs: Number
    accepting: bool
    memory: PartialMemory
    synthesis: PartialSynthesis
    counters: PartialCounters
    buffers: dict[str, Number]
    pipelines: list[PartialPipeline]
    gpu_workers: list[PartialWorker]
    devices: list[dict]
    allocations: PartialAllocations
    # Added by the upstream watcher: the lies in this snapshot, the tally since watching
    # started, and how often the daemon is polled.
    lies: list[LieRow]
    lie_tally: list[LieTallyRow]
    poll_interval: float
    # Added by the gRPC watcher: the daemon's GetStatus, and where each part of the snapshot
    # came from (part -> "GetStatus", "GET /status", or why it is missing).
    daemon: DaemonStatus
    sources: dict[str, str]


def pending_handles(snapshot: PartialSnapshot) -> Number:
    """Synthesized partitions waiting for a device (0 when not reported)."""
    return snapshot.get("buffers", {}).get("pending_handles", 0)


def idle_with_work_waiting(snapshot: PartialSnapshot | None) -> bool:
    """Synthesized partitions wait for a device while a GPU worker sits idle (a moment's view)."""
    if not snapshot:
        return False
    workers = snapshot.get("gpu_workers", [])
    return pending_handles(snapshot) > 0 and any(w.get("state") != "proving" for w in workers)
