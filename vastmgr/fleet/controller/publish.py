"""Getting rendered fragments from the controller process to every browser.

With Redis (scale-out) the controller writes to the shared channel layer directly. In the
embedded mode the channel layer is in-memory and lives inside the daphne process, so the
controller hands its batches to daphne over a websocket (`/ws/relay/`) that only a holder of
the relay token (derived from SECRET_KEY, which both processes share) may open.

The other direction, viewers announcing what they watch (see `viewers`), reaches the
controller through its own channel on the shared layer, or back over the relay socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
from channels.layers import get_channel_layer
from django.conf import settings

from .viewers import CONTROLLER_GROUP

log = logging.getLogger(__name__)

Message = tuple[str, str]  # (group, html)
OnWatch = Callable[[dict], None]
# Channel-layer group membership expires (a day by default); re-join well before that.
REJOIN_EVERY = 3600.0
RELAY_RETRY = 1.0
# daphne closes a websocket whose message exceeds 1 MiB (its default), so a batch for a large
# fleet goes as several relay messages below that.
RELAY_MESSAGE_BYTES = 512 * 1024


def relay_token() -> str:
    return hmac.new(settings.SECRET_KEY.encode(), b"vastmgr fragment relay",
                    hashlib.sha256).hexdigest()


def fragment_event(html: str) -> dict:
    return {"type": "fragment", "html": html}


def relay_batches(messages: list[Message], limit: int = RELAY_MESSAGE_BYTES) -> list[str]:
    """The relay messages carrying `messages` in order, each under `limit` bytes unless one
    fragment alone is larger (the margin to daphne's limit covers JSON escaping)."""
    batches: list[str] = []
    batch: list[Message] = []
    size = 0
    for group, html in messages:
        cost = len(group) + len(html.encode()) + 16
        if batch and size + cost > limit:
            batches.append(json.dumps({"messages": batch}, ensure_ascii=False))
            batch, size = [], 0
        batch.append((group, html))
        size += cost
    if batch:
        batches.append(json.dumps({"messages": batch}, ensure_ascii=False))
    return batches


class LayerPublisher:
    """Sends straight into the configured channel layer (shared Redis, or in-process)."""

    def __init__(self, layer=None):
        self.layer = layer or get_channel_layer()
        self.reconnected = False

    async def send(self, messages: list[Message]) -> bool:
        for group, html in messages:
            await self.layer.group_send(group, fragment_event(html))
        return True

    async def listen(self, on_watch: OnWatch) -> None:
        """Feed consumers' watch announcements to `on_watch` until cancelled."""
        channel = await self.layer.new_channel()

        async def rejoin():
            while True:
                await self.layer.group_add(CONTROLLER_GROUP, channel)
                await asyncio.sleep(REJOIN_EVERY)

        keeper = asyncio.create_task(rejoin())
        try:
            while True:
                event = await self.layer.receive(channel)
                if event.get("type") == "watch":
                    on_watch(event)
        finally:
            keeper.cancel()
            await self.layer.group_discard(CONTROLLER_GROUP, channel)

    async def close(self) -> None:
        return None


class RelayPublisher:
    """Sends batches to a daphne process's relay socket; reconnects on the next batch."""

    def __init__(self, dashboard_url: str, session: aiohttp.ClientSession):
        parts = urlsplit(dashboard_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        self.url = f"{scheme}://{parts.netloc}/ws/relay/"
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.session = session
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        # Set when a new connection replaced a lost one: the caller then resends full state,
        # because whatever was pushed while the relay was down never reached a browser.
        self.reconnected = False
        self._had_connection = False
        self._connecting = asyncio.Lock()

    async def _connection(self) -> aiohttp.ClientWebSocketResponse:
        async with self._connecting:
            if self.ws is None or self.ws.closed:
                self.ws = await self.session.ws_connect(
                    self.url, headers={"Authorization": f"Bearer {relay_token()}",
                                       "Origin": self.origin}, heartbeat=20)
                self.reconnected = self._had_connection
                self._had_connection = True
            return self.ws

    async def send(self, messages: list[Message]) -> bool:
        if not messages:
            return True
        try:
            ws = await self._connection()
            for batch in relay_batches(messages):
                await ws.send_str(batch)
            return True
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("fragment relay to %s failed: %s", self.url, exc)
            self.ws = None
            return False

    async def listen(self, on_watch: OnWatch) -> None:
        """Read the watch announcements daphne forwards on the relay socket; keep it open."""
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
                log.info("fragment relay to %s is down: %s", self.url, exc)
            await asyncio.sleep(RELAY_RETRY)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
