"""The Proofs list's table (`#proof-table`): rendered whole for the first page load, the
polling fallback and the list's socket (`/ws/proofs/?<the page's query>`), and row by row
(`<tr id="job-<id>">`) for the controller's pushes, which go to every list page at once, as a
proof's panel goes to its page: a row follows the engine as closely as the proof's own page.

A row that a push names but a page does not list (another filter, another page) is ignored
there. A job that joins the list (a test proof started, a retry) is no push of the
controller's: the view that makes it tells the list pages (`tell_list_pages`), which send
their table again."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.functions import Coalesce, Now
from django.http import QueryDict
from django.template.loader import render_to_string

from vastmgr.front.proof_forms import ProofListForm
from vastmgr.front.readmodel import MachineView, load_machines
from vastmgr.proofs.models import MAX_SEED, ProofJob

log = logging.getLogger(__name__)

PROOFS_GROUP = "proofs"
TABLE_CHANGED = {"type": "proofs.changed"}


def filtered_jobs(params: dict[str, Any]) -> QuerySet[ProofJob]:
    jobs = ProofJob.objects.select_related("machine").annotate(duration_sort=ExpressionWrapper(
        Coalesce(F("engine_duration"), Now() - F("started_at")), output_field=DurationField()))
    for name in ("status", "kind", "machine"):
        if params.get(name):
            jobs = jobs.filter(**{name: params[name]})
    if query := params.get("q"):
        match = Q(machine__name__icontains=query)
        if query.isdigit() and int(query) <= MAX_SEED:
            match |= Q(seed=int(query))
        if re.fullmatch(r"[0-9a-fA-F-]{4,36}", query):
            match |= Q(id__istartswith=query)
        jobs = jobs.filter(match)
    return jobs


def table_context(query: QueryDict) -> dict:
    """The list page's context for `query` (its GET parameters); `valid` False: the filters
    are wrong, and the page says which."""
    form = ProofListForm(query)
    context: dict[str, Any] = {
        "form": form, "sorts": form.sort_links(), "unfinished": ProofJob.unfinished_by_place(),
        "list_path": "?" + query.urlencode() if query else "", "valid": form.is_valid()}
    if context["valid"]:
        context["page"] = page = form.page_of(filtered_jobs(form.cleaned_data))
        hosts = _machine_views(list(page))
        context["rows"] = [(job, hosts.get(job.machine_id or 0)) for job in page]
        context["page_query"] = form.query_without("page")
    return context


def render_table(query: QueryDict) -> str:
    return render_to_string("proofs/fragments/proof_table.html", table_context(query))


def row_updates(job: ProofJob) -> list[tuple[str, str]]:
    """What a change of `job` pushes to the list pages: its row, and the places line above
    the table (a job that moved changes its counts). Two messages: a `<tr>` parses only where
    a message starts with it (the HTML parser drops one that follows a `<p>`)."""
    row = render_to_string("proofs/fragments/proof_row.html", {
        "j": job, "host": _machine_views([job]).get(job.machine_id or 0)})
    places = render_to_string("proofs/fragments/proof_places.html",
                              {"u": ProofJob.unfinished_by_place()})
    return [(PROOFS_GROUP, row), (PROOFS_GROUP, places)]


def tell_list_pages() -> None:
    """A job joined or left the list: every list page sends its table again. A channel layer
    that cannot be reached fails no action: the pages catch up at their next (re)connection."""
    try:
        async_to_sync(get_channel_layer().group_send)(PROOFS_GROUP, TABLE_CHANGED)
    except Exception as exc:  # noqa: BLE001 - whatever the layer raises, the action stands
        log.warning("could not tell the proof list pages: %s", exc)


def _machine_views(jobs: list[ProofJob]) -> dict[int, MachineView]:
    """The machines of the unfinished jobs, as pages show them: a clock of a job whose
    machine is not live stops and says as of when."""
    ids = {job.machine_id for job in jobs if job.machine_id is not None and not job.is_final}
    if not ids:
        return {}
    return {view.machine.pk: view for view in load_machines(time.time(), ids)}
