"""Alerts that no other loop raises, checked by the notifier every few seconds: the fleet's $/h
over its budget, and an upstream daemon's status contradicting itself. Each becomes an alert
Event once per occurrence (so channels get it through the usual rules); the pages show both."""

from __future__ import annotations

import time

from django.conf import settings

from vastmgr.fleet.ledger import Reading
from vastmgr.fleet.models import Event
from vastmgr.front.readmodel import MachineView, load_machines

OVER_BUDGET = "over_budget"
UPSTREAM_LIE = "upstream_lie"


def check(now: float | None = None) -> list[Event]:
    hosts = load_machines(now or time.time())
    return [*_budget(hosts), *_lies(hosts)]


def _latest_budget_alert() -> Event | None:
    return (Event.objects.filter(kind="alert", data__alert=OVER_BUDGET)
            .order_by("-time", "-id").first())


def _budget(hosts: list[MachineView]) -> list[Event]:
    """One alert when the running $/h crosses the budget, one when it is back under."""
    budget = settings.VASTMGR_BUDGET_DOLLARS_PER_HOUR
    if budget is None:
        return []
    dph = Reading.load().dollars_per_hour()
    over = dph > budget
    latest = _latest_budget_alert()
    if over == bool(latest and latest.data.get("over")):
        return []  # no change since the last alert (or under budget and never over)
    message = (f"the fleet costs ${dph:.2f}/h, over its budget of ${budget:.2f}/h" if over
               else f"the fleet costs ${dph:.2f}/h, back within its budget of ${budget:.2f}/h")
    return [Event.record("alert", message,
                         level=Event.Level.WARNING if over else Event.Level.INFO,
                         data={"alert": OVER_BUDGET, "over": over, "dollars_per_hour": dph,
                               "budget": budget, Event.RECOVERS: not over})]


def _lies(hosts: list[MachineView]) -> list[Event]:
    """One alert per episode of each kind of lie on each host (an episode: it appeared)."""
    found = []
    for h in hosts:
        for row in h.snapshot.get("lie_tally", []):
            if not row["present"]:
                continue
            key = {"alert": UPSTREAM_LIE, "code": row["code"], "episode": row["episodes"]}
            if Event.objects.filter(kind="alert", machine=h.machine, data__alert=UPSTREAM_LIE,
                                    data__code=row["code"],
                                    data__episode=row["episodes"]).exists():
                continue
            found.append(Event.record(
                "alert", f"{h.machine.name}: the cuzk daemon's status shows {row['title']} "
                         f"({row['code']}; episode {row['episodes']})",
                machine=h.machine, level=Event.Level.WARNING, data=key))
    return found
