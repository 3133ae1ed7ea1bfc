"""HTML fragments shared by the first page render, the polling fallback and the websocket pushes.

Every fragment is one top-level element with a stable id, so the htmx ws extension (and app.js
when polling) swaps it in place. All of them are rendered from the read model (`readmodel`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe

from vastmgr.fleet.models import Machine
from vastmgr.fleet.partial_snapshot import (
    PartialCounters,
    PartialSnapshot,
)
from vastmgr.front.fleet_row import render_fleet_row
from vastmgr.front.readmodel import (
    DEFAULT_WINDOW,
    MachineView,
    chart_series,
    fleet_totals,
    load_machines,
)
from vastmgr.front.viewers import fleet_group, machine_group
from vastmgr.proofs.models import BenchmarkProof, ProofJob
from vastmgr.proofs.progress import (
    PHASE_LABELS,
    PHASE_TITLES,
    JobProgress,
)

RECENT_PROOFS = 10


def render_fleet_totals(hosts: list[MachineView], now: float | None = None) -> str:
    return render_to_string("fleet/fragments/fleet_totals.html", {"t": fleet_totals(hosts, now)})


def render_fleet(now: float | None = None, rows: list[MachineView] | None = None,
                 query: str = "") -> str:
    """The whole fleet table body and totals: first render, reconnects and polling. `rows`:
    the body's rows when a filter or sort chose them (`query`, its parameters); the totals
    are always the whole fleet's."""
    hosts = load_machines(now or time.time())
    return render_fleet_rows(hosts if rows is None else rows, query) \
        + render_fleet_totals(hosts, now)


def render_fleet_rows(rows: list[MachineView], query: str = "",
                      rendered: Mapping[int, str] | None = None) -> str:
    """The table body: one page's rows (`query`: the filter and sort that chose them).
    `rendered`: rows already rendered for this moment, by machine id, used as they are (the
    controller renders a row once a tick, whichever pages show it)."""
    rendered = rendered or {}
    return render_to_string("fleet/fragments/fleet_body.html", {
        "rows": [mark_safe(rendered.get(host.machine.pk) or render_fleet_row(host))
                 for host in rows],
        "query": query})


def render_toast(level: str, text: str, url: str = "") -> str:
    """A notice appended to the page's toast area (an htmx out-of-band swap)."""
    return render_to_string("fleet/fragments/toast.html", {"level": level, "text": text, "url": url})


def machine_offline_notices(machine_id: int, name, error: str) -> list[tuple[str, str]]:
    html = render_toast("error", f"{name} went offline: {error or 'connection lost'}",
                        reverse("machine-panel", args=[machine_id]))
    return [(fleet_group(), html), (machine_group(machine_id), html)]


def pipeline_rows(snapshot: PartialSnapshot) -> list[dict]:
    rows = []
    for pipeline in snapshot.get("pipelines", []):
        progress = JobProgress.from_json(pipeline)
        shown = progress.phase
        rows.append({
            **pipeline,
            "phase": shown,
            "engine_phase": pipeline.get("phase"),
            "label": PHASE_LABELS.get(shown or "", shown),
            "title": PHASE_TITLES.get(shown or "", ""),
            "synthesized": progress.count("synth_done"),
            "job_short": (pipeline.get("request_id") or pipeline.get("job_id") or "")[:16],
            "cells": progress.cells(),
        })
    return rows


def machine_panel_context(machine: Machine, now: float, host: MachineView | None = None) -> dict:
    if host is None:
        (host,) = load_machines(now, [machine.pk]) or [MachineView(machine, None, now)]
    snapshot = host.snapshot
    counters = snapshot.get("counters", {})
    return {
        "h": host,
        "s": snapshot,
        "pipelines": pipeline_rows(snapshot),
        # "last used N s ago" as of the snapshot: the template's clock adds the snapshot's age
        # while the machine is live, and stops there when it is not.
        "srs": [{**a, "last_used_ago": a.get("last_used_secs_ago")}
                for a in snapshot.get("allocations", {}).get("srs", [])],
        "uptime": host.aged(snapshot.get("uptime_secs")),
        "counters": counters,
        "kinds": _counter_rows(counters),
        "recent": ProofJob.objects.filter(machine=machine)[:RECENT_PROOFS],
        "upstream": machine.is_upstream,
        "benchmarks": (BenchmarkProof.objects.filter(machine=machine).defer("input_bytes")
                       [:RECENT_PROOFS] if machine.speaks_grpc else []),
        "lies": snapshot.get("lies", []),
        "lie_tally": [{**row, "first_ago": max(0, round(now - row["first_seen"])),
                       "last_ago": max(0, round(now - row["last_seen"]))}
                      for row in snapshot.get("lie_tally", [])],
    }


def _counter_rows(counters: PartialCounters) -> list[dict]:
    # A map the engine did not send at all is "not reported" (None), not zero.
    maps = {"done": counters.get("completed_by_kind"), "failed": counters.get("failed_by_kind"),
            "cancelled": counters.get("cancelled_by_kind"),
            "queued": counters.get("queue_depth_by_kind")}
    kinds = sorted({kind for by_kind in maps.values() if by_kind for kind in by_kind})
    return [{"kind": kind, **{column: None if by_kind is None else by_kind.get(kind, 0)
                              for column, by_kind in maps.items()}}
            for kind in kinds]


def render_machine_panel(machine: Machine, now: float | None = None,
                      host: MachineView | None = None) -> str:
    """`host`: the machine's view when the caller has loaded it already (saves two queries)."""
    return render_to_string("fleet/fragments/machine_panel.html",
                            machine_panel_context(machine, now or time.time(), host))


def render_machine_charts(machine: Machine, now: float | None = None,
                       window: str = DEFAULT_WINDOW) -> str:
    return render_to_string("fleet/fragments/machine_charts.html",
                            {"m": machine, "c": chart_series(machine, now or time.time(), window)})
