"""The engine's two waiting lines: jobs waiting to start, and synthesized partitions waiting
for a device worker. Both are priority queues; the decisions of what to take live in the
orchestrator.

Keys are always unique: each entry carries a tiebreak from a counter, so two entries can never
overwrite each other (cuzk's BTreeMap keyed (job_seq, partition) silently replaced entries that
shared a key, and every monolithic job used (0, 0)).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from cuzk_engine.vocabulary import PRIORITY_RANK


def priority_rank(priority: str) -> int:
    try:
        return PRIORITY_RANK[priority]
    except KeyError:
        raise ValueError(
            f"unknown priority {priority!r} (use one of {', '.join(PRIORITY_RANK)})"
        ) from None


@dataclass(order=True)
class _Entry:
    key: tuple
    value: Any = field(compare=False)
    job_id: str = field(compare=False)
    removed: bool = field(compare=False, default=False)


class JobQueue:
    """Jobs waiting to start: higher priority first, FIFO within a priority."""

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._by_id: dict[str, _Entry] = {}
        self._fifo = itertools.count()

    def push(self, job_id: str, priority: str) -> int:
        """Queue a job; returns its position (how many queued jobs will start before it)."""
        if job_id in self._by_id:
            raise ValueError(f"job {job_id!r} is already queued")
        entry = _Entry((priority_rank(priority), next(self._fifo)), job_id, job_id)
        heapq.heappush(self._heap, entry)
        self._by_id[job_id] = entry
        return self.position(job_id)

    def position(self, job_id: str) -> int:
        entry = self._by_id[job_id]
        return sum(1 for e in self._by_id.values() if e.key < entry.key)

    def pop(self) -> str | None:
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not entry.removed:
                del self._by_id[entry.job_id]
                return entry.job_id
        return None

    def remove(self, job_id: str) -> bool:
        entry = self._by_id.pop(job_id, None)
        if entry is None:
            return False
        entry.removed = True
        return True

    def ids(self) -> list[str]:
        return list(self._by_id)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)


class PartitionQueue:
    """Ready partitions: by priority, then the lowest partition of the oldest pipeline first."""

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._by_job: dict[str, list[_Entry]] = {}
        self._tiebreak = itertools.count()
        self._live = 0

    def push(self, item: Any, *, job_id: str, rank: int, job_seq: int, partition: int) -> None:
        entry = _Entry((rank, job_seq, partition, next(self._tiebreak)), item, job_id)
        heapq.heappush(self._heap, entry)
        self._by_job.setdefault(job_id, []).append(entry)
        self._live += 1

    def pop(self) -> Any | None:
        while self._heap:
            entry = heapq.heappop(self._heap)
            if not entry.removed:
                entry.removed = True
                self._live -= 1
                bucket = self._by_job[entry.job_id]
                bucket.remove(entry)
                if not bucket:
                    del self._by_job[entry.job_id]
                return entry.value
        return None

    def remove_job(self, job_id: str) -> list[Any]:
        """Take every queued partition of a job out (cancellation, failure); returns them."""
        out = []
        for entry in self._by_job.pop(job_id, []):
            entry.removed = True
            self._live -= 1
            out.append(entry.value)
        return out

    def __len__(self) -> int:
        return self._live
