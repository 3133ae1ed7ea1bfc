"""The data directory's disk, watched by the fleet controller: a full disk is told in an Event
when it starts and again when space is back.

With SQLite (the embedded mode) the database lives on that disk, so the first Event cannot be
written while it is full: the watch keeps trying every tick, and when space returns it writes
one error Event that says when the disk was full instead. Nothing else is lost meanwhile: a
form that cannot be saved says so (front/error_pages.py), and a result that cannot be written
stays in its engine until it can."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from channels.db import database_sync_to_async

from vastmgr.fleet.models import Event
from vastmgr.lib.storage import FULL_BELOW, free_bytes, full_message, size

log = logging.getLogger("vastmgr.data_disk")


class DataDiskWatch:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self.path = path
        self.clock = clock
        self.full_since: float | None = None
        self.told = False  # the Event saying it is full was written

    async def check(self) -> None:
        free = await asyncio.to_thread(free_bytes, self.path)
        if free < FULL_BELOW:
            if self.full_since is None:
                self.full_since = self.clock()
                log.error("%s", full_message(self.path))
            if not self.told:
                self.told = await self._record(full_message(self.path), Event.Level.ERROR)
            return
        if self.full_since is None:
            return
        lasted = f"{self.clock() - self.full_since:.0f} s"
        if self.told:
            message = (f"space is back in the data directory ({self.path}: {size(free)} free) "
                       f"after {lasted} full")
            level = Event.Level.INFO
        else:
            since = datetime.fromtimestamp(self.full_since, UTC).strftime("%H:%M:%S")
            message = (f"the data directory's disk was full ({self.path}) for {lasted} from "
                       f"{since} UTC: nothing could be saved meanwhile; space is back "
                       f"({size(free)} free)")
            level = Event.Level.ERROR
        if await self._record(message, level, recovers=self.told):
            self.full_since, self.told = None, False

    async def _record(self, message: str, level: str, *, recovers: bool = False) -> bool:
        try:
            await database_sync_to_async(Event.record)(
                "fault", message, level=level, data={Event.RECOVERS: True} if recovers else None)
        except Exception as exc:  # noqa: BLE001 - the full disk may hold the database
            log.warning("could not record an Event about the data directory: %s", exc)
            return False
        return True
