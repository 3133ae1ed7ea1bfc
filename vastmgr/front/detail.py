"""A fleet row's inline detail (vast-manager's expanded row): the machine's facts, its live
engine panel and charts (the host page's own socket keeps them current: the detail renders
every part that socket pushes) and its pushed logs with one tab per source. Fetched when the
row's toggle is pressed; the logs part re-reads itself."""

import time

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from vastmgr.fleet import ledger
from vastmgr.fleet.models import Machine
from vastmgr.front import fragments
from vastmgr.instances.models import Instance, LogLine
from vastmgr.lib.http import AuthenticatedHttpRequest

LOG_LINES = 200  # per tab, the newest
LOG_POLL_S = 5
ALL = "all"


def row_detail(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    machine = get_object_or_404(Machine.objects.select_related("remote"), pk=machine_id)
    remote = getattr(machine, "remote", None)
    now = time.time()
    return render(request, "fleet/detail/row_detail.html", {
        "machine": machine, "remote": remote,
        "money": ledger.machine_money(machine.pk, now),
        "instance": machine.callhome_instances.order_by("-runner_id").first(),
        "panel_html": fragments.render_machine_panel(machine, now),
        "charts_html": fragments.render_machine_charts(machine, now),
        "logs": _logs(machine, ALL)})


def row_logs(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    """The logs part alone, on a tab (`?source=`) and every few seconds. A poll names the
    newest line it shows (`?after=`): with nothing newer it is answered 204, which htmx leaves
    in place, so a reader's scroll position and selection survive a quiet log."""
    machine = get_object_or_404(Machine, pk=machine_id)
    source = request.GET.get("source", ALL)[:64]
    after = request.GET.get("after", "")
    if after.isascii() and after.isdigit() and len(after) <= 18 and             not _machine_lines(machine).filter(id__gt=int(after)).exists():
        return HttpResponse(status=204)
    return render(request, "fleet/detail/row_logs.html",
                  {"machine": machine, "logs": _logs(machine, source)})


def _machine_lines(machine: Machine):
    uuids = list(Instance.objects.filter(machine=machine).values_list("uuid", flat=True))
    return LogLine.objects.filter(uuid__in=uuids)


def _logs(machine: Machine, source: str) -> dict:
    lines = _machine_lines(machine)
    sources = sorted(set(lines.values_list("source", flat=True)))
    if source != ALL and source not in sources:
        source = ALL
    shown = lines if source == ALL else lines.filter(source=source)
    url = reverse("fleet-row-logs", args=[machine.pk])
    return {"sources": [ALL, *sources] if sources else [], "source": source, "url": url,
            "lines": list(reversed(shown.order_by("-id")[:LOG_LINES])),
            # The newest line of any source: a new one may also bring a new tab.
            "last_id": lines.order_by("-id").values_list("id", flat=True).first() or 0,
            "poll_s": LOG_POLL_S}

