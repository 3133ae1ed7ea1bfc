"""One memory budget for parameters and partition working sets.

Reservations are context managers with partial release. A request larger than the whole budget
fails at once (cuzk waited forever); otherwise the evictor (idle SRS entries, LRU) runs before
anyone waits. Releases may come from any thread; waiters are asyncio tasks on the engine loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Self

from cuzk_engine.errors import BudgetExceeded


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


class Reservation:
    """Bytes held against the budget until released; ``release(n)`` gives part back early."""

    __slots__ = ("_budget", "_lock", "remaining", "what")

    def __init__(self, budget: MemoryBudget, nbytes: int, what: str):
        self._budget = budget
        self._lock = threading.Lock()
        self.remaining = nbytes
        self.what = what

    def release(self, nbytes: int | None = None) -> None:
        with self._lock:
            n = self.remaining if nbytes is None else nbytes
            if not 0 <= n <= self.remaining:
                raise ValueError(f"{self.what}: release {n} of {self.remaining} reserved bytes")
            self.remaining -= n
        if n:
            self._budget._give_back(n)

    def shrink_to(self, nbytes: int) -> None:
        """Keep at most ``nbytes`` (e.g. the real size once known, or a pending proof's size)."""
        with self._lock:
            excess = max(self.remaining - nbytes, 0)
        self.release(excess)

    def close(self) -> None:
        self.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MemoryBudget:
    def __init__(self, total: int, evictor: Callable[[int], int] | None = None):
        if total <= 0:
            raise ValueError("memory budget must be positive")
        self.total = total
        self._used = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.evictor = evictor
        self.recheck_interval = 1.0

    @property
    def used(self) -> int:
        return self._used

    def usage(self) -> tuple[int, int]:
        with self._lock:
            return self.total, self._used

    def check_fits(self, nbytes: int, what: str) -> None:
        """Raise BudgetExceeded if ``nbytes`` could never fit, however much is freed."""
        if nbytes < 0:
            raise ValueError(f"{what}: negative reservation {nbytes}")
        if nbytes > self.total:
            raise BudgetExceeded(
                f"{what} needs {format_bytes(nbytes)} but the whole memory budget is "
                f"{format_bytes(self.total)}; raise memory.total_budget"
            )

    async def reserve(self, nbytes: int, what: str) -> Reservation:
        """Wait until ``nbytes`` fit, evicting idle parameters first; fails fast if they never
        can."""
        self.check_fits(nbytes, what)
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._used + nbytes <= self.total:
                    self._used += nbytes
                    return Reservation(self, nbytes, what)
                short = self._used + nbytes - self.total
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            if self.evictor is not None and self.evictor(short) > 0:
                self._drop_waiter(fut)
                continue
            try:
                # re-check now and then: idle entries become evictable as time passes
                await asyncio.wait({fut}, timeout=self.recheck_interval)
            finally:
                self._drop_waiter(fut)

    def _drop_waiter(self, fut: asyncio.Future) -> None:
        with self._lock:
            self._waiters = [(lp, f) for lp, f in self._waiters if f is not fut]

    def _give_back(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes
            if self._used < 0:
                raise AssertionError("memory budget released more than it reserved")
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, fut)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
