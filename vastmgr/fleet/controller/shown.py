"""What the fleet pages were last sent, so a row goes out only when a value shown in it changed.

A row carries values that move on every engine update without changing what a person reads:
the engine's seq and the snapshot's receipt time (machine-readable attributes), and the bases of
the clocks and money figures the browser runs forward itself (uptime, "last seen", spend). Those
are left out of the comparison. A row is still re-sent every `refresh` seconds, so its "last
seen" never counts up in the browser past what the stale threshold allows, and the attributes
come current again.
"""

from __future__ import annotations

import re

# Values that move without changing what is read (see the module docstring): pattern, kept.
MOVING = [
    (re.compile(r' data-(?:seq|snapshot-at|tick-base|tick-age|ago|amount)="[^"]*"'), ""),
    (re.compile(r'(<span class="tick"[^>]*>)[^<]*'), r"\1"),
    (re.compile(r'(<span class="money"[^>]*>)\$[\d.,]+'), r"\1"),
    (re.compile(r"last seen \d+ s ago"), ""),
]


def shown_values(html: str) -> str:
    """`html` without the values that move on their own."""
    for pattern, kept in MOVING:
        html = pattern.sub(kept, html)
    return html


class ShownRows:
    def __init__(self, refresh: float):
        self.refresh = refresh
        self.rows: dict[int, tuple[str, float]] = {}  # machine id -> (shown values, sent at)
        self.totals = ""

    def row_moved(self, machine_id: int, html: str, now: float) -> bool:
        """Whether the row must be sent (and, if so, remember it as sent at `now`)."""
        values = shown_values(html)
        last = self.rows.get(machine_id)
        if last is not None and last[0] == values and now - last[1] < self.refresh:
            return False
        self.rows[machine_id] = (values, now)
        return True

    def totals_moved(self, html: str) -> bool:
        values = shown_values(html)
        if values == self.totals:
            return False
        self.totals = values
        return True

    def forget(self) -> None:
        """What was sent may not have arrived: send everything again."""
        self.rows.clear()
        self.totals = ""
