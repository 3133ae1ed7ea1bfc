"""The fleet table's query parameters: a state filter, a text filter and a sort by any column,
applied on the server to the rendered rows (their values are computed per render, from the
stored snapshot and the provider's record, so they are sorted here rather than in SQL).

Rows keep their element ids, so the controller's pushes still swap each one in place. The table
is paginated: a page's socket tells the controller which machines its rows show, and only those
rows are rendered and pushed to it (see `controller.viewers`)."""

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django import forms
from django.core.paginator import Page, Paginator
from django.http import QueryDict
from django.utils import timezone

from vastmgr.tables import TableForm

from .fragments import STATE_GROUPS, HostView, load_hosts
from .models import Machine

KILLED = "killed"

# Sort key → the value a row is sorted by (None: not reported, always last).
SORT_VALUES: dict[str, Callable[[HostView], Any]] = {
    "name": lambda h: h.machine.name,  # as the socket orders them (Machine.Meta)
    "state": lambda h: h.machine.state,
    "conn": lambda h: h.connection,
    "gpu": lambda h: (h.gpu_name.lower(), h.gpu_count or 0) if h.gpu_name else None,
    "gpu_util": lambda h: h.gpu_util,
    "temp": lambda h: h.gpu_temp,
    "ram": lambda h: h.ram["total_gb"] if h.ram else None,
    "uptime": lambda h: h.uptime,
    "rate": lambda h: h.machine.bench_rate,
    "dph": lambda h: h.machine.price_per_hour,
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

    def rows(self, now: float) -> list[HostView]:
        state = self.cleaned_data.get("state") or ""
        killed_since = timezone.now() - timedelta(hours=24) if state == KILLED else None
        hosts = load_hosts(now, killed_since=killed_since)
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

    def page_rows(self, now: float) -> Page:
        """The requested page of `rows` (a page past the end shows the last)."""
        return Paginator(self.rows(now), self.PER_PAGE).get_page(self.cleaned_data.get("page") or 1)

    def page_ids(self, now: float) -> list[int]:
        """The machines the requested page shows. The unfiltered table (by name) is paginated
        in SQL: a page's socket re-reads this every few seconds, and loading every host's
        snapshot for it would cost as much as the page itself."""
        if self.filtered:
            return [host.machine.pk for host in self.page_rows(now)]
        ids = Machine.objects.exclude(state=Machine.State.KILLED).order_by("name") \
            .values_list("pk", flat=True)
        return list(Paginator(ids, self.PER_PAGE).get_page(self.cleaned_data.get("page") or 1))

    def page_key(self) -> str:
        """The same for every viewer of the same page (filter, sort and page number)."""
        data = self.cleaned_data
        canonical = "&".join(f"{name}={data.get(name) or ''}" for name in ("state", "q", "sort"))
        return hashlib.sha256(f"{canonical}&page={data.get('page') or 1}".encode()).hexdigest()[:16]

    @property
    def filtered(self) -> bool:
        """Whether the rows differ from what the socket's full state shows (every live
        machine by name): then the page re-reads its own rows instead."""
        data = self.cleaned_data
        return bool(data.get("state") or data.get("q") or
                    (data.get("sort") or self.DEFAULT_SORT) != self.DEFAULT_SORT)

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
