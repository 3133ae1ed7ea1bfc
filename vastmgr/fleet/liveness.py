"""Whether a host's engine data can be trusted right now: live, stale or offline."""

from __future__ import annotations

from datetime import UTC, datetime

LIVE, STALE, OFFLINE = "live", "stale", "offline"
# An interruptible machine Vast stopped for a higher bid: its engine is away, and why is known.
OUTBID = "outbid"
STALE_AFTER_INTERVALS = 3
# An idle engine answers without a new seq. Its stored last_seen is still rewritten (and its row
# re-pushed) this often, so a page rendered from the database, or a browser counting "last seen"
# up between pushes, never shows a live host as stale.
HEARTBEAT_INTERVALS = 1.5


def connection_state(connected: bool, last_seen: float | None, interval: float,
                     now: float) -> str:
    """`offline` when the link is down (or never came up); `stale` when it is up but nothing
    arrived for 3 expected intervals; otherwise `live`."""
    if not connected or last_seen is None:
        return OFFLINE
    if now - last_seen > STALE_AFTER_INTERVALS * interval:
        return STALE
    return LIVE


def machine_connection(enabled: bool, connected: bool | None, last_seen: datetime | None,
                       interval: float | None, now: float) -> str:
    """A machine's liveness as every surface states it: a disabled machine, or one the
    controller never looked at (`connected` None), is offline; otherwise `connection_state`."""
    if not enabled or connected is None or interval is None:
        return OFFLINE
    return connection_state(connected, None if last_seen is None else last_seen.timestamp(),
                            interval, now)


def seen_at(timestamp: float) -> datetime:
    """A time on the controller's clock (`time.time()`) as the database stores it."""
    return datetime.fromtimestamp(timestamp, UTC)
