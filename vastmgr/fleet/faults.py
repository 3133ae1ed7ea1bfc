"""Long-running loops survive a failed step: log it, record an Event, go on.

An error that repeats every tick would flood the event log, so the same error (same place, type
and message) is recorded at most once per `every` seconds; the log gets every occurrence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from channels.db import database_sync_to_async

from vastmgr.fleet.models import Event, Machine

log = logging.getLogger("vastmgr.faults")


class FaultRecorder:
    def __init__(self, where: str, *, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.where = where
        self.every = every
        self.clock = clock
        self.last: dict[tuple[str, str], float] = {}

    async def record(self, exc: BaseException, machine_id: int | None = None) -> None:
        message = f"{self.where} failed ({type(exc).__name__}: {exc}); it carries on"
        log.error("%s", message, exc_info=exc)
        key = (type(exc).__name__, str(exc))
        now = self.clock()
        if now - self.last.get(key, float("-inf")) < self.every:
            return
        self.last[key] = now
        try:
            await database_sync_to_async(_record)(message, machine_id)
        except Exception as db_exc:  # noqa: BLE001 - the database may be what is failing
            log.warning("could not record the fault as an event: %s", db_exc)


def _record(message: str, machine_id: int | None) -> None:
    Event.record("fault", message, level=Event.Level.ERROR,
                 machine=Machine.objects.filter(pk=machine_id).first() if machine_id else None)
