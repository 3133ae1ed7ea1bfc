"""HTML fragments shared by the first page render, the polling fallback and the websocket pushes.

Every fragment is one top-level element with a stable id, so the htmx ws extension (and app.js
when polling) swaps it in place. All of them are rendered from database rows, with the
connection state judged against `now`, so every dashboard process renders the same truth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

from django.db.models import Count, Q
from django.template.loader import render_to_string
from django.utils import timezone

from vastmgr.fleet.models import HostSample, HostStatus, Machine
from vastmgr.proofs.models import ProofJob

from .liveness import LIVE, OFFLINE, connection_state

PHASES = ("pending", "synthesizing", "synth_done", "gpu", "finalizing", "done", "failed",
          "cancelled")
CHART_WINDOW = timedelta(hours=1)
RECENT_PROOFS = 10


def fleet_group() -> str:
    return "fleet"


def host_group(machine_id: int) -> str:
    return f"host.{machine_id}"


def proof_group(job_id) -> str:
    return f"proof.{job_id}"


@dataclass
class HostView:
    """One host as the fleet row and panel show it; the derived values are computed once per
    render (templates ask for them several times, for hundreds of rows a tick)."""

    machine: Machine
    status: HostStatus | None
    now: float
    done_24h: int = 0
    failed_24h: int = 0

    @cached_property
    def snapshot(self) -> dict:
        return (self.status.snapshot if self.status else None) or {}

    @cached_property
    def last_seen_ts(self) -> float | None:
        return self.machine.last_seen.timestamp() if self.machine.last_seen else None

    @cached_property
    def connection(self) -> str:
        if self.status is None or not self.machine.enabled:
            return OFFLINE
        return connection_state(self.status.connected, self.last_seen_ts, self.status.interval,
                                self.now)

    @property
    def seen_ago(self) -> int | None:
        return None if self.last_seen_ts is None else max(0, int(self.now - self.last_seen_ts))

    @cached_property
    def workers(self) -> list[dict]:
        return self.snapshot.get("gpu_workers") or []

    @cached_property
    def busy_workers(self) -> int:
        return sum(1 for w in self.workers if w.get("state") == "proving")

    @property
    def idle_workers(self) -> int:
        return len(self.workers) - self.busy_workers

    @property
    def devices(self) -> list[dict]:
        return self.snapshot.get("devices") or []

    @property
    def queue_depth(self) -> int:
        return (self.snapshot.get("counters") or {}).get("queue_depth", 0)

    @cached_property
    def memory(self) -> dict:
        memory = self.snapshot.get("memory") or {}
        total = memory.get("total_bytes") or 0
        used = memory.get("used_bytes") or 0
        percent = round(100 * used / total, 1) if total else 0
        level = "bad" if percent > 85 else "warn" if percent > 60 else "ok"
        return {"used": used, "total": total, "percent": percent, "level": level}

    @property
    def gpu_idle_while_waiting(self) -> bool:
        # Synthesized partitions waiting for a device while a worker sits idle: a real loss.
        waiting = (self.snapshot.get("buffers") or {}).get("pending_handles", 0)
        return self.connection == LIVE and self.idle_workers > 0 and waiting > 0

    @property
    def cost_per_proof(self):
        price, rate = self.machine.price_per_hour, self.machine.bench_rate
        if price is None or not rate:
            return None
        return float(price) / rate


def load_hosts(now: float, machine_ids=None) -> list[HostView]:
    machines = Machine.objects.select_related("live").exclude(state=Machine.State.KILLED)
    if machine_ids is not None:
        machines = machines.filter(pk__in=machine_ids)
    machines = list(machines)
    return host_views(machines, {m.pk: getattr(m, "live", None) for m in machines}, now)


def host_views(machines: list[Machine], statuses: dict[int, HostStatus | None],
               now: float) -> list[HostView]:
    """Views of `machines` with the given live status rows (the fleet controller passes the
    state it holds in memory, which is what it writes to the database)."""
    since = timezone.now() - timedelta(hours=24)
    counts = {
        row["machine"]: row
        for row in ProofJob.objects.filter(finished_at__gte=since, machine__isnull=False)
        .values("machine")
        .annotate(done=Count("id", filter=Q(status=ProofJob.Status.DONE)),
                  failed=Count("id", filter=Q(status=ProofJob.Status.FAILED)))
    }
    views = []
    for machine in machines:
        row = counts.get(machine.pk, {})
        views.append(HostView(machine, statuses.get(machine.pk), now,
                              row.get("done", 0), row.get("failed", 0)))
    return views


def fleet_totals(hosts: list[HostView]) -> dict:
    queued = ProofJob.objects.filter(status=ProofJob.Status.QUEUED).count()
    live = [h for h in hosts if h.connection == LIVE]
    return {
        "hosts": len(hosts),
        "live": len(live),
        "stale": sum(1 for h in hosts if h.connection == "stale"),
        "offline": sum(1 for h in hosts if h.connection == OFFLINE),
        "busy": sum(h.busy_workers for h in live),
        "workers": sum(len(h.workers) for h in live),
        "queue_depth": sum(h.queue_depth for h in live),
        "queued_jobs": queued,
        "done_24h": sum(h.done_24h for h in hosts),
        "failed_24h": sum(h.failed_24h for h in hosts),
        "dph": sum(float(h.machine.price_per_hour or 0) for h in hosts
                   if h.machine.state == Machine.State.RUNNING),
        "idle_while_waiting": any(h.gpu_idle_while_waiting for h in hosts)
        or (queued > 0 and any(h.idle_workers and not h.queue_depth for h in live)),
    }


def render_fleet_row(host: HostView) -> str:
    return render_to_string("fragments/fleet_row.html", {"h": host})


def render_fleet_totals(hosts: list[HostView]) -> str:
    return render_to_string("fragments/fleet_totals.html", {"t": fleet_totals(hosts)})


def render_fleet(now: float | None = None) -> str:
    """The whole fleet table body and totals: first render, reconnects and polling."""
    hosts = load_hosts(now or time.time())
    return render_to_string("fragments/fleet_body.html", {"hosts": hosts}) + \
        render_fleet_totals(hosts)


def pipeline_rows(snapshot: dict) -> list[dict]:
    rows = []
    for pipeline in snapshot.get("pipelines") or []:
        partitions = pipeline.get("partitions") or []
        rows.append({
            **pipeline,
            "job_short": (pipeline.get("request_id") or pipeline.get("job_id") or "")[:16],
            "cells": [{**p, "title": _partition_title(p)} for p in partitions],
        })
    return rows


def _partition_title(p: dict) -> str:
    parts = [f"P{p.get('index')} {p.get('state')}"]
    for key, label in (("synth_ms", "synth"), ("gpu_ms", "gpu"), ("finalize_ms", "finalize")):
        if p.get(key) is not None:
            parts.append(f"{label} {p[key]:.0f} ms")
    return " · ".join(parts)


def host_context(machine: Machine, now: float, host: HostView | None = None) -> dict:
    if host is None:
        (host,) = load_hosts(now, [machine.pk]) or [HostView(machine, None, now)]
    snapshot = host.snapshot
    allocations = snapshot.get("allocations") or {}
    return {
        "h": host,
        "s": snapshot,
        "pipelines": pipeline_rows(snapshot),
        "srs": allocations.get("srs") or [],
        "counters": snapshot.get("counters") or {},
        "kinds": _counter_rows(snapshot.get("counters") or {}),
        "recent": ProofJob.objects.filter(machine=machine)[:RECENT_PROOFS],
    }


def _counter_rows(counters: dict) -> list[dict]:
    kinds = set()
    for key in ("completed_by_kind", "failed_by_kind", "cancelled_by_kind", "queue_depth_by_kind"):
        kinds.update((counters.get(key) or {}).keys())
    return [{
        "kind": kind,
        "done": (counters.get("completed_by_kind") or {}).get(kind, 0),
        "failed": (counters.get("failed_by_kind") or {}).get(kind, 0),
        "cancelled": (counters.get("cancelled_by_kind") or {}).get(kind, 0),
        "queued": (counters.get("queue_depth_by_kind") or {}).get(kind, 0),
    } for kind in sorted(kinds)]


def render_host_panel(machine: Machine, now: float | None = None,
                      host: HostView | None = None) -> str:
    """`host`: the machine's view when the caller has loaded it already (saves two queries)."""
    return render_to_string("fragments/host_panel.html",
                            host_context(machine, now or time.time(), host))


def chart_series(machine: Machine, now: float) -> dict:
    """Busy % and proofs/min over the last hour, as SVG polyline points (600 x 100 box)."""
    start = now - CHART_WINDOW.total_seconds()
    samples = list(HostSample.objects.filter(
        machine=machine, time__gte=timezone.now() - CHART_WINDOW - timedelta(minutes=1)
    ).values_list("time", "busy_fraction", "proofs_completed"))
    busy, rate = [], []
    previous = None
    for when, fraction, completed in samples:
        t = when.timestamp()
        x = round(600 * (t - start) / CHART_WINDOW.total_seconds(), 1)
        if x < 0:
            previous = (t, completed)
            continue
        busy.append((x, fraction * 100))
        if previous is not None and completed >= previous[1] and t > previous[0]:
            rate.append((x, 60 * (completed - previous[1]) / (t - previous[0])))
        previous = (t, completed)
    peak = max([r for _, r in rate] + [1.0])
    return {
        "busy_points": " ".join(f"{x},{100 - y:.1f}" for x, y in busy),
        "rate_points": " ".join(f"{x},{100 - 100 * y / peak:.1f}" for x, y in rate),
        "rate_peak": round(peak, 1),
        # The headline numbers are the newest sample's, labelled with its age: between samples
        # an engine can have gone idle, and an unlabelled "busy 100%" would then be a lie.
        "sample_ago": round(now - samples[-1][0].timestamp()) if busy else None,
        "busy_now": round(busy[-1][1]) if busy else None,
        "rate_now": round(rate[-1][1], 1) if rate else None,
        "samples": len(busy),
    }


def render_host_charts(machine: Machine, now: float | None = None) -> str:
    return render_to_string("fragments/host_charts.html",
                            {"m": machine, "c": chart_series(machine, now or time.time())})


def gantt(job: ProofJob) -> dict:
    partitions = (job.progress or {}).get("partitions") or []
    bars, end = [], 1.0
    for p in partitions:
        segments = []
        synth_start, synth = p.get("synth_start_ms"), p.get("synth_ms")
        gpu_start, gpu_ms = p.get("gpu_start_ms"), p.get("gpu_ms")
        fin_start, fin = p.get("finalize_start_ms"), p.get("finalize_ms")
        if synth_start is not None and synth is not None:
            segments.append(("synth", synth_start, synth))
            if gpu_start is not None and gpu_start > synth_start + synth:
                segments.append(("queue", synth_start + synth, gpu_start - synth_start - synth))
        if gpu_start is not None and gpu_ms is not None:
            segments.append(("gpu", gpu_start, gpu_ms))
        if fin_start is not None and fin is not None:
            segments.append(("finalize", fin_start, fin))
        for _, start, length in segments:
            end = max(end, start + length)
        bars.append({"index": p.get("index"), "state": p.get("state"), "segments": segments,
                     "title": _partition_title(p)})
    for bar in bars:
        bar["segments"] = [
            {"phase": phase, "left": round(100 * start / end, 2),
             "width": max(round(100 * length / end, 2), 0.3), "ms": round(length)}
            for phase, start, length in bar["segments"]
        ]
    return {"bars": bars, "total_ms": round(end)}


def proof_context(job: ProofJob) -> dict:
    proof = bytes(job.proof) if job.proof else b""
    partitions = (job.progress or {}).get("partitions") or []
    return {
        "job": job,
        "cells": [{**p, "title": _partition_title(p)} for p in partitions],
        "done": sum(1 for p in partitions if p.get("state") == "done"),
        "gantt": gantt(job),
        "proof_chunks": [proof[i:i + 192].hex() for i in range(0, len(proof), 192)],
        "proof_len": len(proof),
    }


def render_proof(job: ProofJob) -> str:
    return render_to_string("fragments/proof_detail.html", proof_context(job))
