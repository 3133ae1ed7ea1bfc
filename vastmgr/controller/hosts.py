"""Everything the controller keeps about one watched host, in one object: forgetting the host
(it was disabled, killed, or leased to another controller) drops all of it at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from cuzk_engine.daemon.client import EngineClient
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet.leases import Leases
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.front.publish import LayerPublisher


@dataclass
class WatchedMachine:
    live: MachineLive  # what the watcher knows of the engine
    watcher: asyncio.Task | None = field(default=None, repr=False)  # None: no transport yet
    pushed_state: str | None = None  # the connection state last pushed
    pushed_seen: float = float("-inf")  # the last_seen last pushed and written
    status: MachineStatus | None = None  # the status row last pushed and written
    stored_snapshot: object = None  # the snapshot (JSON) that row's last write stored
    idle_since: float | None = None  # a worker idle while synthesized work waits, since
    sampled_at: float | None = None  # its last history sample from this controller


@dataclass(frozen=True)
class ConnectedEngine:
    """A connected host spoken to through our engine API, with the client that reaches it
    (an upstream daemon's host has none: it is watched, never given work)."""

    live: MachineLive
    client: EngineClient

    @property
    def machine_id(self) -> int:
        return self.live.machine_id


class Controller(Protocol):
    """What the controller's parts (dispatch, the instrumentation) read of the controller that
    owns them. They are handed the controller as this type, so neither imports the service."""

    clock: Callable[[], float]
    interval: float
    grace: float
    hosts: dict[int, WatchedMachine]  # the hosts watched here
    machines: dict[int, Machine]  # every machine with a fleet row, fresh per tick
    leases: Leases | None
    publisher: LayerPublisher

    def machine_name(self, machine_id: int) -> str: ...

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None: ...

    def connected_engine(self, machine_id: int) -> ConnectedEngine | None: ...
