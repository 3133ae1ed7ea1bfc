"""Which pages have viewers right now, so the controller renders only what someone will see.

Fleet and host consumers announce the group they joined to the controller (through the channel
layer, or through the relay socket in embedded mode) and renew that announcement every
`RENEW_EVERY` seconds; a lease that is not renewed lapses after `LEASE` seconds. Whenever the
controller may have missed announcements (it just started, or the relay reconnected) it treats
every group as watched until every live consumer has had time to renew.

A newly announced viewer also marks its group `fresh`: the controller then pushes that group's
full state once, so an update persisted while the viewer was rendering its first snapshot
cannot be skipped because the controller did not know about the viewer yet.

A fleet page's viewer watches one page of the table: its announcement names the machines whose
rows that page shows (`rows`), and the controller renders and pushes only those rows (with the
fleet totals) to that page's group.
"""

from __future__ import annotations

from collections.abc import Callable

CONTROLLER_GROUP = "fleet.controller"
RENEW_EVERY = 5.0
LEASE = 3 * RENEW_EVERY
# Announcements travel in well under a second; the margin covers a busy channel layer.
BLIND_SLACK = 2.0


def watch_event(group: str, channel: str, watching: bool, rows: list[int] | None = None) -> dict:
    event = {"type": "watch", "group": group, "channel": channel, "watching": watching}
    if rows is not None:
        event["rows"] = rows
    return event


class ViewerRegistry:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.leases: dict[str, dict[str, float]] = {}  # group -> viewer channel -> expiry
        self.rows: dict[str, dict[str, frozenset[int]]] = {}  # page group -> channel -> rows
        self.fresh: set[str] = set()
        self.blind_until = 0.0
        self.forget()

    def forget(self) -> None:
        """Announcements may have been lost: assume every group is watched for a while."""
        self.blind_until = self.clock() + RENEW_EVERY + BLIND_SLACK

    def note(self, event: dict) -> None:
        group, channel = event.get("group"), event.get("channel")
        if not isinstance(group, str) or not isinstance(channel, str):
            return
        viewers = self.leases.setdefault(group, {})
        rows = event.get("rows")
        if event.get("watching"):
            if channel not in viewers:
                self.fresh.add(group)
            viewers[channel] = self.clock() + LEASE
            if isinstance(rows, list):
                self.rows.setdefault(group, {})[channel] = frozenset(
                    row for row in rows if isinstance(row, int))
        else:
            viewers.pop(channel, None)
            self.rows.get(group, {}).pop(channel, None)

    def watched(self, group: str) -> bool:
        now = self.clock()
        if now < self.blind_until:
            return True
        viewers = self.leases.get(group)
        if not viewers:
            return False
        for channel in [c for c, expiry in viewers.items() if expiry <= now]:
            del viewers[channel]
            self.rows.get(group, {}).pop(channel, None)
        return bool(viewers)

    def pages(self) -> dict[str, frozenset[int]]:
        """Every watched page group and the machines whose rows its viewers show."""
        pages = {}
        for group in list(self.rows):
            if self.watched(group) and self.rows[group]:
                pages[group] = frozenset().union(*self.rows[group].values())
            elif not self.leases.get(group):
                del self.rows[group]
        return pages

    def take_fresh(self) -> set[str]:
        fresh, self.fresh = self.fresh, set()
        return fresh
