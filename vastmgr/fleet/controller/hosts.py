"""Everything the controller keeps about one watched host, in one object: forgetting the host
(it was disabled, killed, or leased to another controller) drops all of it at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from vastmgr.fleet.models import HostStatus

from .watcher import HostLive


@dataclass
class HostState:
    live: HostLive  # what the watcher knows of the engine
    watcher: asyncio.Task | None = field(default=None, repr=False)  # None: no transport yet
    pushed_state: str | None = None  # the connection state last pushed
    pushed_seen: float = float("-inf")  # the last_seen last pushed and written
    status: HostStatus | None = None  # the status row last pushed and written
    stored_snapshot: object = None  # the snapshot (JSON) that row's last write stored
    idle_since: float | None = None  # a worker idle while synthesized work waits, since
    sampled_at: float | None = None  # its last history sample from this controller
