"""Continuous load in pipelined and monolithic modes with the real prover.

Prints proofs/min, device busy fraction, the pipelined/monolithic speedup, and the ideal speedup.

The ideal comes from two lower bounds on a pipelined partition, both measured in the monolithic
run (where nothing overlaps): the CPU seconds a partition costs (engine process plus synthesis
processes) spread over the machine's measured parallel capacity, and prove_start's wall time,
which the device lock serialises. Wall-clock stage times alone would overstate it: prove_start
already runs its MSMs on every core. The capacity (two CPU-bound processes do not always run
twice as fast as one on a shared machine) is measured before and after both modes, and their
mean is used.
"""

from __future__ import annotations

import asyncio
import copy
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

from cuzk_engine.config import EngineConfig
from cuzk_engine.engine.orchestrator import Engine


def _burn(kind: str, profile: str) -> float:
    from cuzk_engine.engine.stages import synthesize

    t0 = time.perf_counter()
    synthesize(kind, profile, 1, 0)
    return time.perf_counter() - t0


def measure_parallel_capacity(kind: str, profile: str) -> float:
    """How many CPU-bound processes' worth of work the machine really does at once (of 2)."""
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        list(pool.map(_burn, [kind] * 2, [profile] * 2))  # warm both processes
        t0 = time.perf_counter()
        pool.submit(_burn, kind, profile).result()
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(_burn, [kind] * 2, [profile] * 2))
        two = time.perf_counter() - t0
    return round(min(2.0, 2 * one / two), 3)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(engine: Engine) -> float:
    """CPU time so far of this process (every thread) and of the engine's synthesis processes."""
    total = time.process_time()
    for pid in getattr(engine._synth_executor, "_processes", {}):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


async def _run_mode(cfg: EngineConfig, kind: str, profile: str, jobs: int) -> dict:
    engine = Engine(cfg)
    await engine.start()
    try:
        circuit = engine.stages.circuit_id(kind, profile)
        await engine.preload(circuit)
        warm, _, _ = engine.submit(kind, profile, 10**6)  # warms the synthesis processes
        await warm.ended.wait()
        busy0 = engine.tracker.busy_fraction()
        up0 = engine.snapshot().uptime_secs
        cpu0 = _cpu_seconds(engine)
        t0 = time.perf_counter()
        submitted = [engine.submit(kind, profile, s)[0] for s in range(jobs)]
        for j in submitted:
            await j.ended.wait()
        wall = time.perf_counter() - t0
        cpu = _cpu_seconds(engine) - cpu0
        busy1 = engine.tracker.busy_fraction()
        up1 = engine.snapshot().uptime_secs
        ok = all(j.status == "done" and j.verified for j in submitted)
        parts = sum(j.partitions for j in submitted)
        busy_secs = sum(busy1[w] * up1 - busy0[w] * up0 for w in busy1)
        return {
            "wall_s": round(wall, 3),
            "proofs_per_min": round(jobs * 60.0 / wall, 3),
            "all_verified": ok,
            # the share of the run a device lock was held (prove_start), per device
            "device_busy_fraction": round(
                sum(j.device_lock_ms for j in submitted) / 1000.0 / wall / len(engine.devices),
                3),
            # workers count as busy from pickup to handing off, lock waits included
            "worker_busy_fraction": round(busy_secs / wall / len(busy1), 3),
            "per_partition_ms": {
                "synthesis": round(sum(j.synthesis_ms for j in submitted) / parts, 1),
                "gpu": round(sum(j.gpu_ms for j in submitted) / parts, 1),
                "device_lock": round(sum(j.device_lock_ms for j in submitted) / parts, 1),
                "finalize": round(sum(j.finalize_ms for j in submitted) / parts, 1),
                "cpu": round(cpu * 1000.0 / parts, 1),
                "wall": round(wall * 1000.0 / parts, 1),
            },
        }
    finally:
        await engine.stop()


async def run_pipeline_bench(cfg: EngineConfig, kind: str, profile: str, jobs: int) -> dict:
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    loop = asyncio.get_running_loop()
    cap_before = await loop.run_in_executor(None, measure_parallel_capacity, kind, profile)
    piped = copy.deepcopy(cfg)
    piped.devices = ["cpu"] if cfg.devices == ["auto"] else cfg.devices
    piped.pipeline.enabled = True
    mono = copy.deepcopy(piped)
    mono.pipeline.enabled = False
    p = await _run_mode(piped, kind, profile, jobs)
    m = await _run_mode(mono, kind, profile, jobs)
    cap_after = await loop.run_in_executor(None, measure_parallel_capacity, kind, profile)
    capacity = (cap_before + cap_after) / 2
    st = m["per_partition_ms"]
    ideal_per_part = max(st["cpu"] / capacity, st["device_lock"])
    ideal = st["wall"] / ideal_per_part
    speedup = m["wall_s"] / p["wall_s"]
    return {
        "kind": kind, "profile": profile, "jobs": jobs,
        "parallel_capacity": round(capacity, 3),
        "parallel_capacity_before_after": [cap_before, cap_after],
        "pipelined": p, "monolithic": m,
        "ideal_bound": "cpu" if st["cpu"] / capacity >= st["device_lock"] else "device lock",
        "speedup": round(speedup, 3),
        "ideal_speedup": round(ideal, 3),
        "fraction_of_ideal": round(speedup / ideal, 3),
    }


def print_report(report: dict, *, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    before, after = report["parallel_capacity_before_after"]
    print(f"{report['kind']}.{report['profile']} x {report['jobs']} jobs; measured parallel "
          f"capacity {report['parallel_capacity']} of 2 processes (before {before}, "
          f"after {after})")
    print(f"{'mode':12} {'wall s':>8} {'proofs/min':>11} {'device busy':>11} "
          f"{'worker busy':>11}  per-partition ms")
    for mode in ("pipelined", "monolithic"):
        r = report[mode]
        print(f"{mode:12} {r['wall_s']:8.2f} {r['proofs_per_min']:11.2f} "
              f"{r['device_busy_fraction']:11.2f} {r['worker_busy_fraction']:11.2f}  "
              f"{r['per_partition_ms']}")
    print(f"speedup {report['speedup']}  ideal {report['ideal_speedup']} "
          f"(bound: {report['ideal_bound']})  = {report['fraction_of_ideal']} of ideal")
