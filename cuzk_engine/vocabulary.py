"""The engine's words, defined once: proof kinds, size profiles, priorities, job statuses and
partition phases. The engine, its HTTP API, the dashboard's models and its pages all import these;
nothing else spells them out.
"""

from __future__ import annotations

KINDS: tuple[str, ...] = ("winning-post", "window-post", "snap-update", "porep-c2")
PROFILES: tuple[str, ...] = ("tiny", "small", "medium", "large")

# Most urgent first; a priority's rank is its index here.
PRIORITIES: tuple[str, ...] = ("critical", "high", "normal", "low")
PRIORITY_RANK: dict[str, int] = {name: rank for rank, name in enumerate(PRIORITIES)}
# PoSt misses a deadline if it waits; sealing work can.
DEFAULT_PRIORITIES: dict[str, str] = {
    "winning-post": "critical",
    "window-post": "high",
    "snap-update": "normal",
    "porep-c2": "normal",
}

JOB_STATUSES: tuple[str, ...] = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_STATUSES: frozenset[str] = frozenset({"done", "failed", "cancelled"})
UNFINISHED_STATUSES: frozenset[str] = frozenset(JOB_STATUSES) - TERMINAL_STATUSES

# A partition's life, in order: synthesized on the CPU, proved on a device, finalized.
PARTITION_PHASES: tuple[str, ...] = (
    "pending", "synthesizing", "synth_done", "gpu", "finalizing", "done", "failed", "cancelled",
)
IN_FLIGHT_PHASES: tuple[str, ...] = ("synthesizing", "synth_done", "gpu", "finalizing")
SETTLED_PHASES: frozenset[str] = frozenset({"done", "failed", "cancelled"})
# Phases in which nobody works on a partition: when its job ends, it is cancelled at once.
WAITING_PHASES: frozenset[str] = frozenset({"pending", "synth_done"})

WORKER_STATES: tuple[str, ...] = ("idle", "proving")
