"""WebSocket consumers: each joins a group, sends the full current state, then forwards the
controller's `fragment` messages (htmx OOB swaps by element id)."""

import abc
import asyncio
import contextlib
import hmac
import json
import logging
import time
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from vastmgr.fleet.models import Machine
from vastmgr.front import fragments, viewers
from vastmgr.front.fleet_table import fleet_table
from vastmgr.front.publish import fragment_event, push_token, sync_event
from vastmgr.front.viewers import (
    ASK_EVENT,
    CONTROLLER_GROUP,
    RENEW_EVERY,
    VIEWERS_GROUP,
    watch_event,
)

log = logging.getLogger(__name__)

# Close codes in the application range: 4403 mirrors HTTP 403 (not logged in), 4404 a page
# whose object does not exist. Neither is retried by the browser.
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# A consumer that keeps missing fragments (its channel-layer queue overflows) resends the full
# state at most this often; the misses in between are caught up by the next resend.
RESYNC_AT_MOST_EVERY = 1.0


class SameOriginValidator:
    """Lets a websocket through only from a page of this very site: its Origin must equal the
    request's own scheme, host and port (or be listed in CSRF_TRUSTED_ORIGINS), and its Host
    must be allowed. channels' AllowedHostsOriginValidator compares the host alone, so a page
    served by another port of the same host (another app, another user's server) passed."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not same_origin(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def same_origin(scope) -> bool:
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin", b"").decode("latin-1")
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _ = split_domain_port(host)
    if not origin or not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    forwarded = headers.get(b"x-forwarded-proto", b"").decode("latin-1").split(",")[0].strip()
    secure = scope.get("scheme") == "wss" or (
        settings.SECURE_PROXY_SSL_HEADER is not None and forwarded == "https")
    expected = _scheme_host_port(f"{'https' if secure else 'http'}://{host}")
    return expected is not None and _scheme_host_port(origin) == expected


def _scheme_host_port(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None if malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is not a number, or out of range
        return None
    if not parts.hostname or port is None:
        return None
    return parts.scheme, parts.hostname, port


async def refuse(consumer: AsyncWebsocketConsumer, code: int) -> None:
    """Complete the handshake, then close with `code`: closing before accepting makes the
    server reject the handshake with HTTP 403, and the browser would never see the code."""
    await consumer.accept()
    await consumer.close(code=code)


class NoSuchSocket(AsyncWebsocketConsumer):
    """A socket for a path no page opens (a mistyped address, a page from an older version):
    closed with 4404, which the browser does not retry. Channels' router would fail the
    handshake with a 500."""

    async def connect(self):
        await refuse(self, CLOSE_NOT_FOUND)


class FragmentConsumer(AsyncWebsocketConsumer, abc.ABC):
    """Joins one channel-layer group and forwards `fragment` messages."""

    group = ""
    # Fleet and host pages are rendered only while someone watches them, so their consumers
    # tell the controller; proof updates are rare and always pushed.
    announces = False
    renewal: asyncio.Task | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # (publisher, group) -> the last sequence number it sent here
        self.seen: dict[tuple[str, str], int] = {}
        self.behind = False  # something was missed and not yet resent
        self.resynced_at = float("-inf")

    def get_group(self) -> str:
        return self.group

    def other_groups(self) -> list[str]:
        """Groups joined besides the page's own (whose viewers the controller counts)."""
        return [VIEWERS_GROUP] if self.announces else []

    def watched_query(self) -> str | None:
        """The fleet table query this page shows, announced with its group (None: not a
        fleet page)."""
        return None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await refuse(self, CLOSE_FORBIDDEN)
            return
        if not await self.exists():
            await refuse(self, CLOSE_NOT_FOUND)
            return
        self.group = self.get_group()
        # Join before rendering, so an update published meanwhile is delivered after the
        # snapshot instead of falling between the two.
        for group in [self.group, *self.other_groups()]:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        # What the controller pushes after the announcement is handled after this first state.
        state = await database_sync_to_async(self.current_state)()
        if self.announces:
            await self.announce(True)
            self.renewal = asyncio.create_task(self.keep_announcing())
        await self.send(text_data=state)

    async def disconnect(self, code):
        if self.renewal is not None:
            self.renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.renewal
            await self.announce(False)
        if self.group and self.channel_layer is not None:
            for group in [self.group, *self.other_groups()]:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def announce(self, watching: bool, fresh: bool = False) -> None:
        await self.channel_layer.group_send(
            CONTROLLER_GROUP, watch_event(self.group, self.channel_name, watching,
                                          self.watched_query(), fresh))

    async def keep_announcing(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY)
            await self.announce(True)

    async def watch_ask(self, event):
        """A controller (re)started listening: announce at once, and have the whole page sent,
        since what it pushed before may never have reached this page."""
        if self.renewal is not None:
            await self.announce(True, fresh=True)

    async def receive(self, text_data=None, bytes_data=None):
        # The browser asks again after it re-opens a socket or wakes from sleep.
        try:
            message = json.loads(text_data or "{}")
        except json.JSONDecodeError:
            return
        if isinstance(message, dict) and message.get("type") == "request_current_state":
            await self.send_current_state()

    async def send_current_state(self):
        await self.send(text_data=await database_sync_to_async(self.current_state)())
        if self.renewal is not None:
            # The database is written after the push: the state just sent may be older than
            # what the controller last pushed, and it pushes again only what changes from
            # there. It sends the whole page instead.
            await self.announce(True, fresh=True)

    async def fragment(self, event):
        self.note_seq(event.get("source"), event.get("group"), event.get("seq"), sync=False)
        await self.resync_if_behind()
        await self.send(text_data=event["html"])

    async def fragment_sync(self, event):
        """The publisher's last sequence number for this group: ahead of ours means a fragment
        never arrived (a full channel-layer queue drops it), so the page is resent whole."""
        self.note_seq(event.get("source"), event.get("group"), event.get("seq"), sync=True)
        await self.resync_if_behind()

    def note_seq(self, source, group, seq, sync: bool) -> None:
        if not isinstance(source, str) or not isinstance(seq, int):
            return  # an unnumbered fragment (a toast from the dashboard itself)
        key = (source, group if isinstance(group, str) else "")
        last = self.seen.get(key)
        # A fresh consumer starts from the first number it gets: its first state was rendered
        # after it joined the group, and nothing was dropped from its queue before that.
        if last is not None and seq > last + (0 if sync else 1):
            self.behind = True
        if last is None or seq > last:
            self.seen[key] = seq

    async def resync_if_behind(self) -> None:
        now = time.monotonic()
        if self.behind and now - self.resynced_at >= RESYNC_AT_MOST_EVERY:
            self.behind = False
            self.resynced_at = now
            await self.send_current_state()

    async def exists(self) -> bool:
        return True

    @abc.abstractmethod
    def current_state(self) -> str:
        """The full HTML state of the page, sent first on every (re)connect."""


class FleetConsumer(FragmentConsumer):
    """One page of the fleet table (the page's query string: filter, sort, page number): its
    rows and the fleet totals, pushed to the page's group; fleet-wide notices come through the
    fleet group."""

    announces = True

    def get_group(self) -> str:
        self.table = fleet_table(self.scope.get("query_string", b""))
        return viewers.fleet_page_group(self.table.page_key())

    def other_groups(self) -> list[str]:
        return [*super().other_groups(), viewers.fleet_group()]

    def watched_query(self) -> str:
        return self.table.canonical_query()

    def current_state(self) -> str:
        now = time.time()
        return fragments.render_fleet(now, list(self.table.page_rows(now)),
                                      self.table.query_without("page"))


class MachineConsumer(FragmentConsumer):
    announces = True

    def get_group(self) -> str:
        return viewers.machine_group(self.scope["url_route"]["kwargs"]["machine_id"])

    @database_sync_to_async
    def exists(self) -> bool:
        return Machine.objects.filter(pk=self.scope["url_route"]["kwargs"]["machine_id"]).exists()

    def current_state(self) -> str:
        machine = Machine.objects.get(pk=self.scope["url_route"]["kwargs"]["machine_id"])
        now = time.time()
        return fragments.render_machine_panel(machine, now) + fragments.render_machine_charts(machine, now)


class PushConsumer(AsyncWebsocketConsumer):
    """Where the fleet controller hands in fragment batches when there is no shared Redis
    (embedded mode): only a holder of the push token may connect. The same socket carries the
    viewers' watch announcements back to the controller."""

    joined = False

    async def connect(self):
        headers = dict(self.scope.get("headers") or [])
        offered = headers.get(b"authorization", b"").decode("latin-1")
        if not hmac.compare_digest(offered, f"Bearer {push_token()}"):
            await refuse(self, CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(CONTROLLER_GROUP, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code):
        if self.joined:
            await self.channel_layer.group_discard(CONTROLLER_GROUP, self.channel_name)

    async def watch(self, event):
        await self.send(text_data=json.dumps(event))

    async def receive(self, text_data=None, bytes_data=None):
        try:
            batch = json.loads(text_data or "")
            source = str(batch["source"])
            messages = [(str(group), str(html), int(seq)) for group, html, seq in batch["messages"]]
            syncs = [(str(group), int(seq)) for group, seq in batch.get("syncs", [])]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("push socket: ignoring a malformed batch")
            return
        if batch.get("ask"):
            await self.channel_layer.group_send(VIEWERS_GROUP, ASK_EVENT)
        for group, html, seq in messages:
            await self.channel_layer.group_send(group, fragment_event(html, source, seq, group))
        for group, seq in syncs:
            await self.channel_layer.group_send(group, sync_event(source, seq, group))
