"""Snapshot build time for many pipelines, and how long writers wait while readers snapshot."""

from __future__ import annotations

import json
import statistics
import threading
import time

from cuzk_engine.status import DeviceInfo, StatusTracker, snapshot_violations

_KIND = "snap-update"


def _populate(t: StatusTracker, pipelines: int, partitions: int) -> None:
    for j in range(pipelines):
        jid = f"job-{j}"
        t.register_job(jid, kind=_KIND, profile="small", circuit_id="snap-update.small",
                       priority="normal", partitions=partitions)
        t.job_started(jid)
        for i in range(partitions // 2):  # a realistic mix of phases
            t.synth_start(jid, i)
            if i % 3:
                t.synth_end(jid, i)


def run_status_bench(pipelines: int = 100, partitions: int = 16, rounds: int = 300) -> dict:
    t = StatusTracker([DeviceInfo(0, "cpu", "cpu", "bench")], 2, retention=3600.0)
    _populate(t, pipelines, partitions)
    assert snapshot_violations(t.snapshot()) == []
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        t.snapshot()
        times.append((time.perf_counter() - t0) * 1000.0)
    json_times = []
    for _ in range(50):
        t0 = time.perf_counter()
        json.dumps(t.snapshot().to_json())
        json_times.append((time.perf_counter() - t0) * 1000.0)

    # writers against a reader snapshotting in a tight loop
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            t.snapshot()

    th = threading.Thread(target=reader)
    th.start()
    waits = []
    try:
        for n in range(2000):
            jid = f"w-{n}"
            t0 = time.perf_counter()
            with t._lock:  # the time a writer waits for the lock is what readers cost it
                pass
            waits.append((time.perf_counter() - t0) * 1000.0)
            t.register_job(jid, kind=_KIND, profile="small", circuit_id="snap-update.small",
                           priority="normal", partitions=1)
            t.job_cancelled(jid)
    finally:
        stop.set()
        th.join()
    waits.sort()
    return {
        "pipelines": pipelines,
        "partitions": partitions,
        "snapshot_ms_median": round(statistics.median(times), 3),
        "snapshot_ms_p99": round(sorted(times)[int(len(times) * 0.99) - 1], 3),
        "snapshot_plus_json_ms_median": round(statistics.median(json_times), 3),
        "writer_lock_wait_ms_p99": round(waits[int(len(waits) * 0.99) - 1], 4),
        "writer_lock_wait_ms_max": round(waits[-1], 4),
    }


def print_report(report: dict, *, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for k, v in report.items():
        print(f"{k:32} {v}")
