"""Getting rendered fragments from the controller process to every browser.

With Redis (scale-out) the controller writes to the shared channel layer directly. In the
embedded mode the channel layer is in-memory and lives inside the daphne process, so the
controller hands its batches to daphne over a websocket (`/ws/relay/`) that only a holder of
the relay token (derived from SECRET_KEY, which both processes share) may open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from urllib.parse import urlsplit

import aiohttp
from channels.layers import get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)

Message = tuple[str, str]  # (group, html)


def relay_token() -> str:
    return hmac.new(settings.SECRET_KEY.encode(), b"vastmgr fragment relay",
                    hashlib.sha256).hexdigest()


def fragment_event(html: str) -> dict:
    return {"type": "fragment", "html": html}


class LayerPublisher:
    """Sends straight into the configured channel layer (shared Redis, or in-process)."""

    def __init__(self, layer=None):
        self.layer = layer or get_channel_layer()
        self.reconnected = False

    async def send(self, messages: list[Message]) -> bool:
        for group, html in messages:
            await self.layer.group_send(group, fragment_event(html))
        return True

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
        self.ws = None
        # Set when a new connection replaced a lost one: the caller then resends full state,
        # because whatever was pushed while the relay was down never reached a browser.
        self.reconnected = False
        self._had_connection = False

    async def send(self, messages: list[Message]) -> bool:
        if not messages:
            return True
        try:
            if self.ws is None or self.ws.closed:
                self.ws = await self.session.ws_connect(
                    self.url, headers={"Authorization": f"Bearer {relay_token()}",
                                       "Origin": self.origin}, heartbeat=20)
                self.reconnected = self._had_connection
                self._had_connection = True
            await self.ws.send_str(json.dumps({"messages": messages}))
            return True
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("fragment relay to %s failed: %s", self.url, exc)
            self.ws = None
            return False

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
