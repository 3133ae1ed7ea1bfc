"""What each fleet page was last sent, so a row goes out only when a value shown in it changed.

A row carries values that move on every engine update without changing what a person reads:
the engine's seq and the snapshot's receipt time (machine-readable attributes), and the clocks
and money figures the browser runs forward itself (uptime, "data N s old", spend). The first
are left out of the comparison; a running figure is compared by its origin (when its clock
read zero, what the spend would be at the epoch), which stays put while it runs and moves when
the figure itself changes (an engine restart resets its uptime, a price changes). "Last seen"
counts up in the browser from the last push, so a row is also re-sent every `refresh` seconds:
its "last seen" never counts past what the stale threshold allows, and the attributes come
current again.

Records are kept per page: a page pushed whole (new viewer, rows changed) got the rows as they
are now, which another page may not have; its records are dropped, so each of its rows is sent
again with its next change rather than compared against what some other page was sent.
"""

from __future__ import annotations

import re

# The render time a clock carries (for the browser's delay estimate) moves with every render.
TICK = re.compile(r'<span class="tick( age)?" data-tick-base="([-\d.]+)" '
                  r'data-tick-age="([-\d.]+)" data-tick-rendered="[\d.]+" '
                  r'data-tick-digits="(\d+)"( data-tick-down="1")?>[^<]*')
MONEY = re.compile(r'<span class="money" data-amount="([-\d.]+)" data-per-hour="([-\d.]+)">'
                   r'\$[\d.,]+')
# Machine-readable values that move with every update, and the "last seen" count.
MOVING = re.compile(r' data-(?:seq|snapshot-at|ago)="[^"]*"|last seen \d+ s ago')


def shown_values(html: str, now: float) -> str:
    """What `html`, rendered at `now`, shows, in a form that stays the same while only its
    running clocks and spend run on."""
    def tick(match: re.Match) -> str:
        kind, base, age, digits, down = match[1], float(match[2]), float(match[3]), \
            int(match[4]), match[5]
        origin = now + base - age if down else now - base - age
        return f'<span class="tick{kind or ""}" origin="{round(origin, digits)}"{down or ""}>'

    def money(match: re.Match) -> str:
        amount, per_hour = float(match[1]), float(match[2])
        return f'<span class="money" origin="{amount - per_hour * now / 3600:.2f}" ' \
               f'per-hour="{match[2]}">'

    return MOVING.sub("", MONEY.sub(money, TICK.sub(tick, html)))


class ShownRows:
    def __init__(self, refresh: float):
        self.refresh = refresh
        # page group -> machine id -> (shown values, sent at)
        self.rows: dict[str, dict[int, tuple[str, float]]] = {}
        self.totals: dict[str, str] = {}  # page group -> the totals' shown values

    def row_moved(self, group: str, machine_id: int, values: str, now: float) -> bool:
        """Whether the row (its `shown_values`) must be sent to the page; if so, remember it
        as sent at `now`."""
        sent = self.rows.setdefault(group, {})
        last = sent.get(machine_id)
        if last is not None and last[0] == values and now - last[1] < self.refresh:
            return False
        sent[machine_id] = (values, now)
        return True

    def totals_moved(self, group: str, values: str) -> bool:
        if self.totals.get(group) == values:
            return False
        self.totals[group] = values
        return True

    def sent_whole(self, group: str, totals: str) -> None:
        """The page was sent whole, with these totals' shown values."""
        self.rows[group] = {}
        self.totals[group] = totals

    def keep(self, groups) -> None:
        """Drop what was kept for pages nobody watches any more."""
        for group in self.rows.keys() - set(groups):
            del self.rows[group]
        for group in self.totals.keys() - set(groups):
            del self.totals[group]

    def forget(self) -> None:
        """What was sent may not have arrived: send everything again."""
        self.rows.clear()
        self.totals.clear()
