"""Getting rendered fragments from the controller process to every browser.

With Redis (scale-out) the controller writes to the shared channel layer directly. In the
embedded mode the channel layer is in-memory and lives inside the daphne process, so the
controller hands its batches to daphne over a websocket (`/ws/push/`) that only a holder of
the push token (derived from SECRET_KEY, which both processes share) may open.

The other direction, viewers announcing what they watch (see `viewers`), reaches the
controller through its own channel on the shared layer, or back over the push socket. Each
time the controller (re)joins that channel it asks every viewer to announce itself (a page
whose announcement it missed would otherwise wait for its next renewal).

Nothing here may lose a page's last update without the page finding out. A channel layer drops
messages for a consumer whose queue is full (in-memory and Redis alike, silently), so every
fragment carries its group's sequence number from this publisher, and for a while after a
group's last fragment the publisher repeats that number (`sync`). A consumer that sees a number
jump, or a sync ahead of what it got, has missed something and resends its page's whole current
state: a viewer that falls behind is shed by coalescing (it gets the latest state once), never
left on an old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import aiohttp
from channels.layers import get_channel_layer
from django.conf import settings

from vastmgr.front.viewers import ASK_EVENT, CONTROLLER_GROUP, VIEWERS_GROUP

log = logging.getLogger(__name__)

Message = tuple[str, str]  # (group, html)
Numbered = tuple[str, str, int]  # (group, html, the group's sequence number)
OnWatch = Callable[[dict], None]
# The controller's group membership is renewed this often: it expires (a day by default), and a
# restarted Redis forgets it without any error reaching a receiver that reconnected.
REJOIN_EVERY = 10.0
# After the layer failed, listening starts again this much later.
RELISTEN_AFTER = 1.0
PUSH_RETRY = 1.0
# daphne closes a websocket whose message exceeds 1 MiB (its default), so a batch for a large
# fleet goes as several push messages below that.
PUSH_MESSAGE_BYTES = 512 * 1024
# How often a group's last sequence number is repeated, and for how long after its last
# fragment: a lost update is noticed within SYNC_EVERY (plus the push latency).
SYNC_EVERY = 2.0
SYNC_KEEP = 60.0


def push_token() -> str:
    return hmac.new(settings.SECRET_KEY.encode(), b"vastmgr fragment push",
                    hashlib.sha256).hexdigest()


def fragment_event(html: str, source: str = "", seq: int | None = None, group: str = "") -> dict:
    """`group`: where it was sent; numbers run per publisher and group, and a consumer may
    be in several groups (a fleet page's rows, and the fleet-wide notices)."""
    return {"type": "fragment", "html": html, "source": source, "seq": seq, "group": group}


def sync_event(source: str, seq: int, group: str = "") -> dict:
    """The last sequence number `source` used in `group` (handled by `fragment_sync`)."""
    return {"type": "fragment.sync", "source": source, "seq": seq, "group": group}


class Sequencer:
    """Numbers each group's fragments, and says which groups' last numbers to repeat now."""

    def __init__(self, clock=time.monotonic):
        self.source = secrets.token_hex(8)  # this publisher; numbers are per source and group
        self.clock = clock
        self.seqs: dict[str, int] = {}
        self.last_sent: dict[str, float] = {}
        self.synced = float("-inf")

    def number(self, messages: list[Message]) -> list[Numbered]:
        now = self.clock()
        numbered = []
        for group, html in messages:
            seq = self.seqs[group] = self.seqs.get(group, 0) + 1
            self.last_sent[group] = now
            numbered.append((group, html, seq))
        return numbered

    def due(self) -> list[tuple[str, int]]:
        """(group, last seq) of every group that had a fragment within SYNC_KEEP, once every
        SYNC_EVERY; an empty list in between."""
        now = self.clock()
        if now - self.synced < SYNC_EVERY:
            return []
        self.synced = now
        for group in [g for g, at in self.last_sent.items() if now - at > SYNC_KEEP]:
            del self.last_sent[group]
        return [(group, self.seqs[group]) for group in self.last_sent]


def push_batches(messages: list[Numbered], source: str, syncs: Sequence[tuple[str, int]] = (),
                  limit: int = PUSH_MESSAGE_BYTES) -> list[str]:
    """The push messages carrying `messages` in order (then `syncs`), each under `limit` bytes
    unless one fragment alone is larger (the margin to daphne's limit covers JSON escaping)."""
    batches: list[str] = []
    batch: list[Numbered] = []
    size = 0

    def close(syncs_here: Sequence[tuple[str, int]] = ()) -> None:
        batches.append(json.dumps({"source": source, "messages": batch,
                                   "syncs": list(syncs_here)}, ensure_ascii=False))

    for group, html, seq in messages:
        cost = len(group) + len(html.encode()) + 24
        if batch and size + cost > limit:
            close()
            batch, size = [], 0
        batch.append((group, html, seq))
        size += cost
    if batch or syncs:
        close(syncs)
    return batches


class LayerPublisher:
    """Sends straight into the configured channel layer (shared Redis, or in-process)."""

    def __init__(self, layer=None):
        self.layer = layer or get_channel_layer()
        self.reconnected = False
        self.sequencer = Sequencer()

    async def send(self, messages: list[Message]) -> bool:
        source = self.sequencer.source
        for group, html, seq in self.sequencer.number(messages):
            await self.layer.group_send(group, fragment_event(html, source, seq, group))
        return True

    async def sync(self) -> None:
        for group, seq in self.sequencer.due():
            await self.layer.group_send(group, sync_event(self.sequencer.source, seq, group))

    async def listen(self, on_watch: OnWatch) -> None:
        """Feed consumers' watch announcements to `on_watch` until cancelled. A failing layer
        (Redis restarted, forgetting every group and queued message) is waited out: once it
        answers, the controller joins its group again and asks every page to announce itself,
        so pages that were open through the restart are rendered for again."""
        channel = await self.layer.new_channel()
        while True:
            try:
                await self._listen_on(channel, on_watch)
            except Exception as exc:  # noqa: BLE001 - redis-py's errors are not OSErrors
                log.warning("listening for pages failed (%s: %s); listening again in %g s",
                            type(exc).__name__, exc, RELISTEN_AFTER)
                await asyncio.sleep(RELISTEN_AFTER)

    async def _listen_on(self, channel: str, on_watch: OnWatch) -> None:
        await self.layer.group_add(CONTROLLER_GROUP, channel)
        await self.layer.group_send(VIEWERS_GROUP, ASK_EVENT)

        async def stay_joined():
            while True:
                await asyncio.sleep(REJOIN_EVERY)
                await self.layer.group_add(CONTROLLER_GROUP, channel)

        keeper = asyncio.create_task(stay_joined())
        try:
            while True:
                if keeper.done():  # its failure is the layer's: listen again from the start
                    keeper.result()
                event = await self.layer.receive(channel)
                if event.get("type") == "watch":
                    on_watch(event)
        finally:
            keeper.cancel()
            with contextlib.suppress(Exception):  # a layer that is down forgot us anyway
                await self.layer.group_discard(CONTROLLER_GROUP, channel)

    async def close(self) -> None:
        return None


class SocketPublisher:
    """Sends batches to a daphne process's push socket; reconnects on the next batch."""

    def __init__(self, dashboard_url: str, session: aiohttp.ClientSession):
        parts = urlsplit(dashboard_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        self.url = f"{scheme}://{parts.netloc}/ws/push/"
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.session = session
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        # Set when a new connection replaced a lost one: the caller then resends full state,
        # because whatever was pushed while the push socket was down never reached a browser.
        self.reconnected = False
        self._had_connection = False
        self._connecting = asyncio.Lock()
        self.sequencer = Sequencer()

    async def _connection(self) -> aiohttp.ClientWebSocketResponse:
        async with self._connecting:
            if self.ws is None or self.ws.closed:
                self.ws = await self.session.ws_connect(
                    self.url, headers={"Authorization": f"Bearer {push_token()}",
                                       "Origin": self.origin}, heartbeat=20)
                self.reconnected = self._had_connection
                self._had_connection = True
                # Announcements made while no push socket was open went nowhere.
                await self.ws.send_str(json.dumps({"source": self.sequencer.source,
                                                   "messages": [], "ask": True}))
            return self.ws

    async def send(self, messages: list[Message]) -> bool:
        if not messages:
            return True
        return await self._send_batches(push_batches(self.sequencer.number(messages),
                                               self.sequencer.source))

    async def sync(self) -> None:
        due = self.sequencer.due()
        if due:
            await self._send_batches(push_batches([], self.sequencer.source, due))

    async def _send_batches(self, batches: list[str]) -> bool:
        try:
            ws = await self._connection()
            for batch in batches:
                await ws.send_str(batch)
            return True
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("fragment push to %s failed: %s", self.url, exc)
            self.ws = None
            return False

    async def listen(self, on_watch: OnWatch) -> None:
        """Read the watch announcements daphne forwards on the push socket; keep it open."""
        while True:
            try:
                ws = await self._connection()
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        continue
                    try:
                        event = json.loads(message.data)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(event, dict) and event.get("type") == "watch":
                        on_watch(event)
            except (aiohttp.ClientError, OSError) as exc:
                log.info("fragment push to %s is down: %s", self.url, exc)
            await asyncio.sleep(PUSH_RETRY)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
