"""The fleet table's query parameters: a state filter, a text filter and a sort by any column,
applied on the server to the rendered rows (their values are computed per render, from the
stored snapshot and the provider's record, so they are sorted here rather than in SQL).

Rows keep their element ids, so the controller's pushes still swap each one in place. The table
is paginated: a page's socket tells the controller its query (`canonical_query`), the controller
works out the page's rows from the same filter and sort each tick, and renders and pushes only
those rows to it, or the whole page when its rows changed (see `controller.viewers`)."""

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.paginator import Page, Paginator
from django.http import QueryDict
from django.utils import timezone

from vastmgr.front.readmodel import STATE_GROUPS, MachineView, load_machines
from vastmgr.front.tables import TableForm

KILLED = "killed"

# Sort key → the value a row is sorted by (None: not reported, always last).
SORT_VALUES: dict[str, Callable[[MachineView], Any]] = {
    "name": lambda h: h.machine.name,  # as the socket orders them (Machine.Meta)
    "state": lambda h: h.machine.state,
    "conn": lambda h: h.connection,
    "gpu": lambda h: (h.gpu_name.lower(), h.gpu_count or 0) if h.gpu_name else None,
    "gpu_util": lambda h: h.gpu_util,
    "temp": lambda h: h.gpu_temp,
    "ram": lambda h: h.ram["total_gb"] if h.ram else None,
    "uptime": lambda h: h.uptime,
    "rate": lambda h: h.machine.bench_rate,
    # What bills now (the ledger's); a machine that bills nothing sorts after those that do.
    "dph": lambda h: h.running_dph if h.billing_active else None,
    "ppp": lambda h: h.cost_per_proof if h.cost_per_proof is not None
    else h.bench_cost_per_proof,
    "done": lambda h: h.done_24h,
    "waiting": lambda h: h.queue_depth,
}


class FleetTableForm(TableForm):
    """`state`: a summary card's group (or killed in the last 24 h); `q`: text in the name,
    host, provider or GPU; `sort`: any column, `-` for descending. Bad values answer 400."""

    SORTS = {key: key for key in SORT_VALUES}
    DEFAULT_SORT = "name"

    state = forms.ChoiceField(required=False, choices=[("", "all but killed")] + [
        (key, label) for key, (label, _) in STATE_GROUPS.items()] + [(KILLED, "killed (24 h)")])

    def rows(self, now: float) -> list[MachineView]:
        killed_since = timezone.now() - timedelta(hours=24) if self.shows_killed else None
        return self.arrange(load_machines(now, killed_since=killed_since))

    @property
    def shows_killed(self) -> bool:
        """Whether the rows are the recently killed machines (which no controller holds)."""
        return self.cleaned_data.get("state") == KILLED

    def arrange(self, hosts: list[MachineView]) -> list[MachineView]:
        """`hosts` filtered and sorted as this table asks."""
        state = self.cleaned_data.get("state") or ""
        if state == KILLED:
            hosts = [h for h in hosts if h.machine.state == KILLED]
        elif state:
            hosts = [h for h in hosts if h.machine.state in STATE_GROUPS[state][1]]
        text = (self.cleaned_data.get("q") or "").lower()
        if text:
            hosts = [h for h in hosts if any(text in field.lower() for field in (
                h.machine.name, h.machine.host, h.machine.provider, h.gpu_name))]
        sort = self.cleaned_data.get("sort") or self.DEFAULT_SORT
        value = SORT_VALUES[sort.lstrip("-")]
        known = [h for h in hosts if value(h) is not None]
        known.sort(key=value, reverse=sort.startswith("-"))
        return known + [h for h in hosts if value(h) is None]

    def arrangement(self) -> tuple[str, str, str]:
        """The filter and sort (not the page): every page of one arrangement is cut from the
        same arranged rows."""
        data = self.cleaned_data
        return (data.get("state") or "", (data.get("q") or "").lower(),
                data.get("sort") or self.DEFAULT_SORT)

    def page_rows(self, now: float) -> Page:
        """The requested page of `rows` (a page past the end shows the last)."""
        return self.page_of_machines(self.rows(now))

    def page_of_machines(self, hosts: list[MachineView]) -> Page:
        """The requested page of `hosts` (already arranged)."""
        return Paginator(hosts, self.PER_PAGE).get_page(self.cleaned_data.get("page") or 1)

    def canonical_query(self) -> str:
        """The query string of this page, the same for every way of writing it: what a page's
        socket tells the controller, which then works out the page's rows itself."""
        data = self.cleaned_data
        return urlencode([(name, data.get(name) or "") for name in ("state", "q", "sort")]
                         + [("page", data.get("page") or 1)])

    def page_key(self) -> str:
        """The same for every viewer of the same page (filter, sort and page number)."""
        return hashlib.sha256(self.canonical_query().encode()).hexdigest()[:16]

    def error_message(self) -> str:
        return "; ".join(f"{name}: {error}" for name, errors in self.errors.items()
                         for error in errors)


def fleet_table(query_string: bytes | str) -> FleetTableForm:
    """The table a socket's query string asks for; the whole fleet's first page when its
    parameters are bad (the page itself answered 400 for them)."""
    if isinstance(query_string, bytes):
        query_string = query_string.decode("latin-1")
    table = FleetTableForm(QueryDict(query_string))
    if not table.is_valid():
        table = FleetTableForm(QueryDict(""))
        table.is_valid()
    return table
