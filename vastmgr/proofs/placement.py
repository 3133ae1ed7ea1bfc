"""Which waiting jobs go to which engine now: one policy, used by the fleet controller's
dispatcher and by the autopilot's simulated day alike (pure: no database, no clock).

An engine is given only what it can start soon: one job per device worker plus a small
look-ahead, so a worker that frees up finds its next job already there. Everything else stays
queued in the dashboard, where a host that becomes running takes its share at once; queued
inside an old engine, a backlog could only wait for that engine.

Urgent jobs (critical and high: WinningPoSt, WindowPoSt) go at once, past the room limit, to
the engine with the most room: the engine starts them before its normal work, and since an
engine holds no more than it can start soon, they never wait behind a backlog.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cuzk_engine.vocabulary import PRIORITY_RANK

LOOK_AHEAD = 1  # jobs an engine holds beyond one per device worker
URGENT_RANK = PRIORITY_RANK["high"]  # this rank and more urgent never wait for room

J = TypeVar("J", bound=Hashable)  # the caller's handle for a job
E = TypeVar("E", bound=Hashable)  # the caller's handle for an engine


def is_urgent(priority: str) -> bool:
    return PRIORITY_RANK.get(priority, len(PRIORITY_RANK)) <= URGENT_RANK


@dataclass(frozen=True)
class Waiting(Generic[J, E]):
    """A job waiting in the dashboard's queue."""

    key: J
    priority: str
    pinned_to: E | None = None  # the only engine it may run on (its user chose it)


@dataclass(frozen=True)
class Engine(Generic[E]):
    """An engine that takes work now, and how much it holds (its unfinished jobs)."""

    key: E
    workers: int  # device workers, as its status reports them
    holding: int

    @property
    def capacity(self) -> int:
        return max(self.workers, 1) + LOOK_AHEAD


@dataclass(frozen=True)
class Placement(Generic[J, E]):
    job: J
    engine: E


def place(waiting: Iterable[Waiting[J, E]], engines: Sequence[Engine[E]]
          ) -> list[Placement[J, E]]:
    """Placements for now. `waiting` must come most urgent first (oldest first within a
    priority): it is read only as far as something can still be placed, so a long queue
    costs nothing while every engine is full."""
    holding = {engine.key: engine.holding for engine in engines}
    capacity = {engine.key: engine.capacity for engine in engines}
    order = {engine.key: i for i, engine in enumerate(engines)}  # ties: the first given
    placements: list[Placement[J, E]] = []
    for job in waiting:
        urgent = is_urgent(job.priority)
        if not urgent and all(holding[key] >= capacity[key] for key in holding):
            break  # every job after this one is no more urgent: none can go either
        candidates = [key for key in holding if job.pinned_to in (None, key)
                      and (urgent or holding[key] < capacity[key])]
        if not candidates:
            continue  # pinned to a full (or absent) engine: it waits, the others go on
        target = max(candidates, key=lambda key: (capacity[key] - holding[key], -order[key]))
        holding[target] += 1
        placements.append(Placement(job.key, target))
    return placements
