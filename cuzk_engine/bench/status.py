"""Snapshot build time for many pipelines, and how long readers hold writers up.

Every number is what a real reader gets: snapshots carry freshly computed elapsed times for the
running phases (a third of the benchmark's partitions are mid-synthesis), and the JSON figure is
the ``/status`` path (``to_json`` then ``json.dumps``).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

from cuzk_engine.engine.snapshot import snapshot_violations
from cuzk_engine.engine.status import DeviceInfo, StatusTracker

_KIND = "snap-update"


def _populate(t: StatusTracker, pipelines: int, partitions: int) -> None:
    for j in range(pipelines):
        jid = f"job-{j}"
        t.register_job(jid, kind=_KIND, profile="small", circuit_id="snap-update.small",
                       priority="normal", partitions=partitions)
        t.job_started(jid)
        for i in range(partitions // 2):  # a realistic mix of phases, some with running timers
            t.synth_start(jid, i)
            if i % 3:
                t.synth_end(jid, i)


def _ms_stats(samples: list[float], name: str) -> dict:
    if not samples:
        return {f"{name}_count": 0}
    s = sorted(samples)
    return {
        f"{name}_count": len(s),
        f"{name}_ms_median": round(statistics.median(s), 4),
        f"{name}_ms_p99": round(s[max(int(len(s) * 0.99) - 1, 0)], 4),
        f"{name}_ms_max": round(s[-1], 4),
    }


class _MeasuredLock:
    """Stands in for the tracker's lock: records how long the reader thread holds it and how
    long writers wait when they find it taken (a wait that starts while a reader holds the lock
    also includes getting the GIL back from that reader)."""

    def __init__(self, reader_ident: int):
        self._lock = threading.Lock()
        self._reader = reader_ident
        self._taken = 0.0
        self.reader_holds: list[float] = []
        self.writer_waits: list[float] = []

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            t0 = time.perf_counter()
            self._lock.acquire()
            if threading.get_ident() != self._reader:
                self.writer_waits.append((time.perf_counter() - t0) * 1000.0)
        self._taken = time.perf_counter()
        return self

    def __exit__(self, *exc):
        held = (time.perf_counter() - self._taken) * 1000.0
        if threading.get_ident() == self._reader:
            self.reader_holds.append(held)
        self._lock.release()


def _writer_round(t: StatusTracker, n: int) -> None:
    """One single-partition job through every phase: seven writes, as the engine does them."""
    jid = f"w-{n}"
    t.register_job(jid, kind=_KIND, profile="small", circuit_id="snap-update.small",
                   priority="normal", partitions=1)
    t.job_started(jid)
    t.synth_start(jid, 0)
    t.synth_end(jid, 0)
    token = t.worker_pickup(0, jid, 0)
    assert token is not None, "a live job's partition is always picked up"
    t.device_done(token)
    t.finalize_done(jid, 0, token)
    t.job_done(jid)


def run_status_bench(pipelines: int = 100, partitions: int = 16, rounds: int = 300,
                     writer_jobs: int = 1000) -> dict:
    # retention 0: finished writer jobs leave at the next snapshot, so the size stays as asked
    t = StatusTracker([DeviceInfo(0, "cpu", "cpu", "bench")], 2, retention=0.0)
    _populate(t, pipelines, partitions)
    first = t.snapshot()
    assert snapshot_violations(first) == []
    timed = sum(1 for p in first.pipelines for pt in p.partitions
                if pt.state in ("synthesizing", "gpu", "finalizing"))
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

    # writers against a reader snapshotting in a tight loop (the worst case)
    stop = threading.Event()
    started = threading.Event()
    idents: list[int] = []

    def reader():
        idents.append(threading.get_ident())
        started.wait()
        while not stop.is_set():
            t.snapshot()

    th = threading.Thread(target=reader)
    th.start()
    while not idents:
        time.sleep(0.001)
    original = t._lock
    measured = _MeasuredLock(idents[0])
    t._lock = measured  # type: ignore[assignment]  # stands in for the tracker's lock
    started.set()
    try:
        for n in range(writer_jobs):
            _writer_round(t, n)
    finally:
        stop.set()
        th.join()
        t._lock = original
    return {
        "pipelines": pipelines,
        "partitions": partitions,
        "running_timers": timed,
        "snapshot_ms_median": round(statistics.median(times), 3),
        "snapshot_ms_p99": round(sorted(times)[int(len(times) * 0.99) - 1], 3),
        "snapshot_plus_json_ms_median": round(statistics.median(json_times), 3),
        "writes": writer_jobs * 7,
        **_ms_stats(measured.reader_holds, "reader_lock_hold"),
        **_ms_stats(measured.writer_waits, "writer_blocked"),
        "gil_switch_interval_ms": round(sys.getswitchinterval() * 1000.0, 3),
    }


def print_report(report: dict, *, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for k, v in report.items():
        print(f"{k:32} {v}")
