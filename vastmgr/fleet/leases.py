"""Which hosts this controller watches when several share a fleet (scale-out mode).

Every `period / RENEWALS_PER_PERIOD` seconds the controller announces itself
(ControllerHeartbeat) and renews, gives back or claims host leases (MachineLease.renew) so it
holds its fair share. A controller that dies stops renewing: its leases lapse after `period`
and the others claim them on their next renewal. A controller that cannot reach the database
stops watching its hosts once its own leases may have lapsed, so two controllers never keep
acting for one host.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from channels.db import database_sync_to_async
from django.db import DatabaseError

from vastmgr.fleet.models import ControllerHeartbeat, MachineLease

log = logging.getLogger(__name__)

RENEWALS_PER_PERIOD = 4


def controller_name() -> str:
    """Unique among running controllers; ends with the pid so an operator can find it."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Leases:
    def __init__(self, period: float, name: str | None = None):
        self.period = period
        self.name = name or controller_name()
        self.owned: set[int] = set()
        self.valid_until = 0.0  # time.monotonic() until which `owned` is certainly ours
        self.next_renewal = 0.0
        self.known: set[int] = set()  # the watchable machines at the last renewal

    async def refresh(self, watchable: set[int]) -> set[int]:
        """The machine ids this controller may watch now, of the `watchable` ones (renewing
        when it is time, or at once when a machine appeared, so a new host is watched within
        a tick as in the embedded mode)."""
        started = time.monotonic()
        if started >= self.next_renewal or not watchable <= self.known:
            self.known = watchable
            self.next_renewal = started + self.period / RENEWALS_PER_PERIOD
            try:
                self.owned = await database_sync_to_async(self._renew)()
                self.valid_until = started + self.period
            except DatabaseError as exc:
                log.warning("lease renewal failed: %s", exc)
        if time.monotonic() >= self.valid_until and self.owned:
            log.warning("leases of %s lapsed without renewal: watching nothing", self.name)
            self.owned = set()
        return self.owned

    def _renew(self) -> set[int]:
        controllers = ControllerHeartbeat.beat(self.name, self.period)
        if self.valid_until == 0.0 and controllers > 1:
            # Others are running: the first heartbeat only announces this controller, so that
            # controllers started together see each other before claiming, instead of one
            # claiming every host and handing half of them over a renewal later. Alone, it
            # claims at once.
            return set()
        return MachineLease.renew(self.name, self.period, controllers)

    async def release(self) -> None:
        """Hand every host back now (a clean stop), so the others need not wait a period."""
        self.owned = set()
        try:
            await database_sync_to_async(self._release)()
        except DatabaseError as exc:
            log.warning("could not release the leases of %s: %s", self.name, exc)

    def _release(self) -> None:
        MachineLease.release(self.name)
        ControllerHeartbeat.leave(self.name)
