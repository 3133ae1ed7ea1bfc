"""One task per machine keeping the freshest engine snapshot: the status stream when it works,
polling GET /status when it does not, and an honest `connected` flag either way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import aiohttp

from cuzk_engine.daemon.client import EngineClient, EngineError

from .transport import EngineTransport, TransportError

log = logging.getLogger(__name__)

# After the stream fails, poll this many times before trying the stream again.
POLLS_BEFORE_STREAM_RETRY = 5
MAX_BACKOFF = 10.0
# A request may take this many intervals: a busy controller (hundreds of hosts on a loaded
# machine) answering late is no reason to drop a working stream; staleness is judged from
# last_seen, not from this.
REQUEST_INTERVALS = 2.0


@dataclass
class HostLive:
    """What the controller knows about one engine, updated by its watcher."""

    machine_id: int
    snapshot: dict | None = None
    seq: int | None = None
    last_seen: float | None = None
    connected: bool = False
    down_since: float | None = None
    via: str = ""
    error: str = ""
    changed: bool = True
    client: EngineClient | None = field(default=None, repr=False)

    def accept(self, snapshot: dict, via: str, now: float) -> None:
        self.last_seen = now
        self.via = via
        self.error = ""
        if not self.connected:
            self.connected = True
            self.down_since = None
            self.changed = True
        if snapshot.get("seq") != self.seq or self.snapshot is None:
            self.snapshot = snapshot
            self.seq = snapshot.get("seq")
            self.changed = True

    def lost(self, error: str, now: float) -> None:
        if self.connected or self.error != error:
            self.changed = True
        if self.connected or self.down_since is None:
            self.down_since = now
        self.connected = False
        self.error = error


class RampSlot:
    """One of a bounded number of connections being set up at once (released early, once the
    first snapshot is in), so hundreds of watchers starting together do not all open tunnels
    and streams in the same second and time each other out."""

    def __init__(self, slots: asyncio.Semaphore | None):
        self.slots = slots
        self.held = False

    async def __aenter__(self) -> Self:
        if self.slots is not None:
            await self.slots.acquire()
            self.held = True
        return self

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()

    async def __aexit__(self, *exc) -> None:
        self.release()


class HostWatcher:
    def __init__(self, live: HostLive, transport: EngineTransport,
                 session: aiohttp.ClientSession, clock: Callable[[], float],
                 interval: float, on_update: Callable[[], None] = lambda: None, *,
                 connect_slots: asyncio.Semaphore | None = None):
        self.live = live
        self.transport = transport
        self.session = session
        self.clock = clock
        self.interval = interval
        self.on_update = on_update
        self.connect_slots = connect_slots

    async def run(self) -> None:
        backoff = self.interval
        try:
            while True:
                async with RampSlot(self.connect_slots) as slot:
                    try:
                        endpoint = await self.transport.connect()
                    except TransportError as exc:
                        slot.release()
                        backoff = await self._down(str(exc), backoff)
                        continue
                    client = EngineClient(endpoint.base_url, token=endpoint.token,
                                          timeout=REQUEST_INTERVALS * max(self.interval, 1.0),
                                          session=self.session)
                    self.live.client = client
                    try:
                        await self._stream(client, slot)
                    except EngineError as exc:
                        # Only the stream may be broken (a proxy dropping websockets): polling
                        # decides whether the engine itself is down.
                        log.info("machine %s: stream down (%s); polling",
                                 self.live.machine_id, exc)
                try:
                    await self._poll(client)
                    backoff = self.interval
                except EngineError as exc:
                    # Unreachable, or refusing us (a wrong token): either way no live data.
                    await self.transport.close()
                    backoff = await self._down(str(exc), backoff)
        finally:
            await self.transport.close()

    async def _down(self, reason: str, backoff: float) -> float:
        self.live.lost(reason, self.clock())
        self.on_update()
        await asyncio.sleep(backoff)
        return min(backoff * 2, MAX_BACKOFF)

    async def _stream(self, client: EngineClient, slot: RampSlot) -> None:
        # A stream quiet for an interval is checked with GET /status, so an idle engine's
        # last_seen keeps up with the clock.
        async for snapshot in client.stream_snapshots(idle=max(self.interval, 1.0)):
            slot.release()
            if snapshot is None:
                # A quiet stream is not proof of life: ask directly before trusting it.
                self.live.accept(await client.status(), "stream", self.clock())
            else:
                self.live.accept(snapshot, "stream", self.clock())
            self.on_update()

    async def _poll(self, client: EngineClient) -> None:
        for _ in range(POLLS_BEFORE_STREAM_RETRY):
            self.live.accept(await client.status(), "poll", self.clock())
            self.on_update()
            await asyncio.sleep(self.interval)

