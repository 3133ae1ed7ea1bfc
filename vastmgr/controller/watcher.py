"""One task per machine keeping the freshest engine snapshot: the status stream when it works,
polling GET /status when it does not, and an honest `connected` flag either way. A snapshot
that does not have the snapshot's shape takes the host down with that reason, like an
engine that does not answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self, cast

import aiohttp
import ujson

from cuzk_engine.daemon.client import EngineClient, StreamedSnapshot
from cuzk_engine.engine.snapshot import EngineSnapshot, StreamHeartbeat
from cuzk_engine.errors import EngineError, SnapshotFormatError
from vastmgr.controller.row_writer import StoredJSON
from vastmgr.fleet.faults import FaultRecorder
from vastmgr.fleet.lie_detector import LieDetector
from vastmgr.fleet.partial_snapshot import PartialSnapshot
from vastmgr.fleet.transport import EngineEndpoint, EngineTransport
from vastmgr.lib.errors import TransportError
from vastmgr.remote.cuzk_grpc.client import CuzkClient

log = logging.getLogger(__name__)

# After the stream fails, poll this many times before trying the stream again.
POLLS_BEFORE_STREAM_RETRY = 5
# Retries of an engine that is down: an attempt costs one request over a path that stays open
# (a TCP handshake, or a channel on the host's one SSH connection, whose own reconnects back
# off far longer; see vastmgr/remote/ssh.py), and an engine that comes back must be shown live
# within about two seconds.
MAX_BACKOFF = 2.0
# A request may take this many intervals: a busy controller (hundreds of hosts on a loaded
# machine) answering late is no reason to drop a working stream; staleness is judged from
# last_seen, not from this.
REQUEST_INTERVALS = 2.0
# Heartbeats are asked for at this share of the quiet time after which a stream is checked with
# GET /status, so one sent on time arrives well before the check even on a late event loop.
HEARTBEAT_SHARE = 0.5


@dataclass
class MachineLive:
    """What the controller knows about one engine, updated by its watcher. `snapshot` is our
    engine's (typed and complete; from the stream, as the JSON it came as, checked but read
    into the typed form only when `engine_snapshot` is asked for) or an upstream daemon's
    (partial, already JSON)."""

    machine_id: int
    snapshot: EngineSnapshot | StreamedSnapshot | PartialSnapshot | None = None
    seq: int | None = None
    last_seen: float | None = None
    snapshot_at: float | None = None  # when the kept snapshot arrived (its times are relative)
    connected: bool = False
    down_since: float | None = None
    via: str = ""
    error: str = ""
    changed: bool = True
    client: EngineClient | None = field(default=None, repr=False)
    # An upstream daemon's gRPC API while its watcher holds a channel to it: SRS actions,
    # benchmark proofs and the metrics relay use it; dispatch never does.
    daemon: CuzkClient | None = field(default=None, repr=False)
    # An upstream daemon's lie detector, told what the daemon answered to our calls.
    detector: LieDetector | None = field(default=None, repr=False)
    # The snapshot as JSON, and the snapshot it was made from.
    _json: tuple[object, PartialSnapshot | None] = field(default=(None, None), repr=False)

    def seen(self, via: str, now: float) -> None:
        """The engine answered, with nothing newer than the kept snapshot."""
        self.last_seen = now
        self.via = via
        self.error = ""
        if not self.connected:
            self.connected = True
            self.down_since = None
            self.changed = True

    def accept(self, snapshot: EngineSnapshot | StreamedSnapshot | PartialSnapshot, via: str,
               now: float) -> None:
        self.seen(via, now)
        seq = (snapshot.seq if isinstance(snapshot, EngineSnapshot | StreamedSnapshot)
               else snapshot.get("seq"))
        if seq != self.seq or self.snapshot is None:
            self.snapshot = snapshot
            self.snapshot_at = now
            self.seq = seq
            self.changed = True

    def engine_snapshot(self) -> EngineSnapshot | None:
        """The kept snapshot in our engine's typed form; None without one, or for an upstream
        daemon's."""
        if isinstance(self.snapshot, StreamedSnapshot):
            return self.snapshot.snapshot
        return self.snapshot if isinstance(self.snapshot, EngineSnapshot) else None

    def snapshot_json(self) -> PartialSnapshot | None:
        """The kept snapshot as stored and rendered (converted once per snapshot). The stream's
        is its JSON as the engine sent it, stored as that text (not converted and encoded
        again)."""
        source, converted = self._json
        if source is not self.snapshot:
            if isinstance(self.snapshot, StreamedSnapshot):
                converted = cast(PartialSnapshot, StoredJSON(self.snapshot.data,
                                                             self.snapshot.text))
            elif isinstance(self.snapshot, EngineSnapshot):
                # A complete snapshot's JSON has every key a partial one may have.
                converted = cast(PartialSnapshot, self.snapshot.to_json())
            else:
                converted = self.snapshot
            self._json = (self.snapshot, converted)
        return converted

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
        self.held: asyncio.Semaphore | None = None  # the slots acquired, until released

    async def __aenter__(self) -> Self:
        if self.slots is not None:
            await self.slots.acquire()
            self.held = self.slots
        return self

    def release(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            held.release()

    async def __aexit__(self, *exc) -> None:
        self.release()


class MachineWatcher:
    def __init__(self, live: MachineLive, transport: EngineTransport,
                 session: aiohttp.ClientSession, clock: Callable[[], float],
                 interval: float, *, connect_slots: asyncio.Semaphore | None = None):
        self.live = live
        self.transport = transport
        self.session = session
        self.clock = clock
        self.interval = interval
        self.faults = FaultRecorder("engine watcher")
        self.connect_slots = connect_slots

    async def run(self) -> None:
        backoff = self.interval
        try:
            while True:
                seen = self.live.last_seen
                try:
                    backoff = await self._watch_once(backoff, seen)
                except Exception as exc:  # noqa: BLE001 - e.g. a malformed snapshot: keep watching
                    await self.faults.record(exc, self.live.machine_id)
                    backoff = await self._down(f"watcher error: {type(exc).__name__}: {exc}",
                                               backoff, seen)
        finally:
            await self.transport.close()

    async def _watch_once(self, backoff: float, seen: float | None) -> float:
        """One connection, followed until it fails; returns the next backoff. `seen` is the
        host's last_seen before this connection, to tell whether it worked."""
        async with RampSlot(self.connect_slots) as slot:
            try:
                endpoint = await self.transport.connect()
                await self._follow(endpoint, slot)
            except TransportError as exc:
                slot.release()
                return await self._down(str(exc), backoff, seen)
            except (EngineError, SnapshotFormatError) as exc:
                # Unreachable, refusing us (a wrong token), or answering with something that is
                # not a snapshot: either way no live data.
                # The path to it (an SSH link) stays: closing it would cost the host a login
                # at every retry.
                slot.release()
                reason = (f"malformed snapshot: {exc}" if isinstance(exc, SnapshotFormatError)
                          else str(exc))
                return await self._down(reason, backoff, seen)
        return self.interval

    async def _follow(self, endpoint: EngineEndpoint, slot: RampSlot) -> None:
        """The stream while it works, then a few polls; the slot is released once the first
        snapshot is in. Raises EngineError when the engine is unreachable or refuses us."""
        client = EngineClient(endpoint.base_url, token=endpoint.token,
                              timeout=REQUEST_INTERVALS * max(self.interval, 1.0),
                              session=self.session)
        self.live.client = client
        try:
            await self._stream(client, slot)
        except EngineError as exc:
            # Only the stream may be broken (a proxy dropping websockets): polling decides
            # whether the engine itself is down.
            log.info("machine %s: stream down (%s); polling", self.live.machine_id, exc)
        slot.release()
        await self._poll(client)

    async def _down(self, reason: str, backoff: float, seen_before: float | None) -> float:
        if self.live.last_seen != seen_before:
            backoff = self.interval  # this connection worked: start the backoff over
        self.live.lost(reason, self.clock())
        await asyncio.sleep(backoff)
        return min(backoff * 2, MAX_BACKOFF)

    async def _stream(self, client: EngineClient, slot: RampSlot) -> None:
        # A quiet engine sends a heartbeat with its seq every half `idle`; one that sends
        # nothing for `idle` (hung, or too old to know heartbeats) is asked with GET /status,
        # so an idle engine's last_seen keeps up with the clock either way.
        idle = max(self.interval, 1.0)
        # Decoded with ujson: at a thousand snapshots a second the standard library's decoder
        # was the controller's largest cost (18 % of its interpreter time); ujson reads the same
        # values (floats exactly) in 60 % of the time.
        async for message in client.stream_status(idle=idle, heartbeat=idle * HEARTBEAT_SHARE,
                                                  keep_json=True, loads=ujson.loads):
            slot.release()
            if isinstance(message, StreamedSnapshot):
                self.live.accept(message, "stream", self.clock())
            elif (isinstance(message, StreamHeartbeat) and self.live.snapshot is not None
                    and message.seq == self.live.seq):
                self.live.seen("stream", self.clock())  # alive, and nothing we do not have
            else:
                await self._check(client)

    async def _check(self, client: EngineClient) -> None:
        """Silence, or a heartbeat with a seq we have no snapshot for (one missed): ask the
        engine directly. The answer is decoded only if it is news."""
        status = await client.status()
        if (self.live.snapshot is not None and isinstance(status, dict)
                and status.get("seq") == self.live.seq):
            self.live.seen("stream", self.clock())
        else:
            self.live.accept(EngineSnapshot.from_json(status), "stream", self.clock())

    async def _poll(self, client: EngineClient) -> None:
        for _ in range(POLLS_BEFORE_STREAM_RETRY):
            self.live.accept(await client.snapshot(), "poll", self.clock())
            await asyncio.sleep(self.interval)

