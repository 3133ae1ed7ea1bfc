"""A proof's panel (status, partitions, timeline, proof bytes), rendered for the first page load,
the polling fallback and the controller's websocket pushes alike."""

from __future__ import annotations

import time

from django.template.loader import render_to_string
from django.urls import reverse

from cuzk_engine.groth16 import PROOF_BYTES
from cuzk_engine.vocabulary import PARTITION_PHASES
from vastmgr.front import proof_table
from vastmgr.front.fragments import render_toast
from vastmgr.front.readmodel import load_machines
from vastmgr.front.viewers import fleet_group, machine_group
from vastmgr.proofs.models import ProofJob
from vastmgr.proofs.progress import (
    ETA_MIN_RUNS,
    JOB_WAIT_LABELS,
    JobProgress,
    job_waits,
    partition_title,
    segments,
)


def phase_legend() -> list[tuple[str, str]]:
    """(phase, label) of every partition phase, in pipeline order: the cells' colour key on
    the proof page and the machine panel alike."""
    return [(phase, PHASE_LABELS[phase]) for phase in PARTITION_PHASES]


# The partition legend, in the order a partition lives through them.
PHASE_LABELS = {
    "pending": "pending",
    "synthesizing": "synthesizing",
    "synth_done": "synthesized, waiting for GPU",
    "gpu": "on GPU",
    "finalizing": "finalizing",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}


def proof_group(job_id) -> str:
    return f"proof.{job_id}"


def proof_failed_notices(job: ProofJob) -> list[tuple[str, str]]:
    where = f" on {job.machine.name}" if job.machine else ""
    html = render_toast("error", f"Proof {str(job.pk)[:8]} ({job.kind}/{job.profile}) failed"
                                 f"{where}: {job.error}", reverse("proof", args=[job.pk]))
    groups = [fleet_group(), proof_group(job.pk)]
    if job.machine_id:
        groups.append(machine_group(job.machine_id))
    return [(group, html) for group in groups]


def gantt(progress: JobProgress, duration_ms: float | None = None,
          timings: dict | None = None) -> dict:
    """The job's own waits (in the engine's queue, for its parameters: `job_waits`), then each
    partition's synthesis, wait for a device, device time and finalization, as labelled bars on
    one time axis (offsets from the job's submission on its engine). An ended job's axis is its
    duration (`ProofJob.engine_duration`), and a partition that never reached a device shows
    its wait until then."""
    waits = job_waits(progress, timings)
    bars: list[dict] = []
    end = duration_ms or 1.0
    for _, start, length in waits:
        end = max(end, start + length)
    for p in progress.partitions:
        stages = segments(p, duration_ms)
        for _, start, length in stages:
            end = max(end, start + length)
        bars.append({"index": p.index, "state": p.state, "segments": stages,
                     "title": partition_title(p)})

    def placed(phase: str, start: float, length: float) -> dict:
        return {"phase": phase, "left": round(100 * start / end, 2),
                "width": max(round(100 * length / end, 2), 0.3), "ms": round(length)}

    for bar in bars:
        bar["segments"] = [placed(*stage) for stage in bar["segments"]]
    job = [{**placed(*wait), "label": JOB_WAIT_LABELS[wait[0]]} for wait in waits]
    return {"job": job, "bars": bars, "total_ms": round(end),
            "drawn": bool(job) or any(bar["segments"] for bar in bars)}  # else nothing yet


# Engine timings as the page labels them: which are sums over partitions, which spans.
TIMING_LABELS = {
    "queue_ms": "waiting in the engine's queue",
    "srs_load_ms": "loading or generating parameters",
    "synthesis_ms": "synthesis, summed over partitions",
    "gpu_ms": "on a device, summed over partitions (with waits for the device lock)",
    "finalize_ms": "finalizing, summed over partitions",
    "total_ms": "submission to end on the engine (wall clock)",
}


def timing_rows(timings: dict) -> list[dict]:
    return [{"key": key, "label": TIMING_LABELS.get(key, key), "ms": value}
            for key, value in timings.items()]


def proof_context(job: ProofJob, now: float | None = None) -> dict:
    proof = bytes(job.proof) if job.proof else b""
    progress = job.engine_progress
    now = now or time.time()
    host = None
    if job.machine_id is not None and not job.is_final:
        host = next(iter(load_machines(now, [job.machine_id])), None)
    return {
        "job": job,
        "host": host,
        "engine_progress": progress,
        "progress_age": None if progress.as_of is None else max(now - progress.as_of, 0.0),
        "timing_rows": timing_rows(job.timings or {}),
        "status_id": f"proof-{job.pk}-status",
        "cells": progress.cells(),
        "done": progress.count("done"),
        "phases": phase_legend(),
        "gantt": gantt(progress, None if job.engine_duration is None
                       else job.engine_duration.total_seconds() * 1000, job.timings),
        "proof_chunks": [proof[i:i + PROOF_BYTES].hex() for i in range(0, len(proof), PROOF_BYTES)],
        "proof_len": len(proof),
        "progress": job.progress_summary(),
        "eta_min_runs": ETA_MIN_RUNS,
    }


def render_proof(job: ProofJob) -> str:
    return render_to_string("proofs/fragments/proof_detail.html", proof_context(job))


def proof_updates(job: ProofJob) -> list[tuple[str, str]]:
    """What a change of `job` pushes: its panel to its page, its row to the Proofs list."""
    return [(proof_group(job.pk), render_proof(job)), *proof_table.row_updates(job)]
