"""Which pages have viewers right now, so the controller renders only what someone will see.

Fleet and host consumers announce the group they joined to the controller (through the channel
layer, or through the push socket in embedded mode) and renew that announcement every
`RENEW_EVERY` seconds; a lease that is not renewed lapses after `LEASE` seconds. Whenever the
controller may have missed announcements (it just started, or the push socket reconnected) it asks
every viewer to announce itself again at once (`ASK_EVENT`, sent to `VIEWERS_GROUP`), so no page
waits for its next renewal to be served.

A newly announced viewer, or one that re-rendered its page from the database (a resync, or an
answer to the controller's ask), marks its group `fresh`: the controller then pushes that
group's full state once, so an update persisted while the viewer was rendering cannot be
skipped because the controller did not know about the viewer yet, and a row the database had
older than what was pushed is not left showing.

A fleet page's viewer watches one page of the table: its announcement carries the page's query
(`query`: filter, sort, page number). The controller works the page's rows out from it each
tick, pushes only those rows (with the fleet totals) to that page's group, and pushes the whole
page when its rows changed (a host added, removed, or moved by the sort or filter).
"""

from __future__ import annotations

from collections.abc import Callable

CONTROLLER_GROUP = "fleet.controller"
# Every fleet and host page's socket: where the controller asks them to announce themselves.
VIEWERS_GROUP = "fleet.viewers"
ASK_EVENT = {"type": "watch.ask"}
RENEW_EVERY = 5.0
LEASE = 3 * RENEW_EVERY


def watch_event(group: str, channel: str, watching: bool, query: str | None = None,
                fresh: bool = False) -> dict:
    """`fresh`: the viewer has just rendered its page from the database (send it whole)."""
    event = {"type": "watch", "group": group, "channel": channel, "watching": watching,
             "fresh": fresh}
    if query is not None:
        event["query"] = query
    return event


class ViewerRegistry:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.leases: dict[str, dict[str, float]] = {}  # group -> viewer channel -> expiry
        self.queries: dict[str, str] = {}  # fleet page group -> its table query
        self.fresh: set[str] = set()

    def note(self, event: dict) -> None:
        group, channel = event.get("group"), event.get("channel")
        if not isinstance(group, str) or not isinstance(channel, str):
            return
        viewers = self.leases.setdefault(group, {})
        if event.get("watching"):
            if channel not in viewers or event.get("fresh"):
                self.fresh.add(group)
            viewers[channel] = self.clock() + LEASE
            query = event.get("query")
            if isinstance(query, str):
                self.queries[group] = query
        else:
            viewers.pop(channel, None)

    def watched(self, group: str) -> bool:
        viewers = self.leases.get(group)
        if not viewers:
            return False
        now = self.clock()
        for channel in [c for c, expiry in viewers.items() if expiry <= now]:
            del viewers[channel]
        return bool(viewers)

    def pages(self) -> dict[str, str]:
        """Every watched fleet page group and its table query."""
        pages = {}
        for group in list(self.queries):
            if self.watched(group):
                pages[group] = self.queries[group]
            else:
                del self.queries[group]
        return pages

    def take_fresh(self) -> set[str]:
        fresh, self.fresh = self.fresh, set()
        return fresh


# The channel-layer groups of the pages: the fleet page, one page of its table, a host panel.
def fleet_group() -> str:
    return "fleet"


def fleet_page_group(page_key: str) -> str:
    """The viewers of one page of the fleet table (see `table.FleetTableForm.page_key`)."""
    return f"fleet.page.{page_key}"


def machine_group(machine_id: int) -> str:
    return f"host.{machine_id}"
