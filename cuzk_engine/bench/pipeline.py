"""Continuous load in pipelined and monolithic modes with the real prover.

Prints proofs/min, device busy fraction, the pipelined/monolithic speedup, and the ideal speedup
from the measured stage times and the machine's measured parallel capacity (two CPU-bound
processes do not always run twice as fast as one on a shared machine).
"""

from __future__ import annotations

import asyncio
import copy
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

from cuzk_engine.config import EngineConfig
from cuzk_engine.engine.orchestrator import Engine


def _burn(kind: str, profile: str) -> float:
    from cuzk_engine.groth16 import synthesize

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
        t0 = time.perf_counter()
        submitted = [engine.submit(kind, profile, s)[0] for s in range(jobs)]
        for j in submitted:
            await j.ended.wait()
        wall = time.perf_counter() - t0
        busy1 = engine.tracker.busy_fraction()
        up1 = engine.snapshot().uptime_secs
        ok = all(j.status == "done" and j.verified for j in submitted)
        parts = sum(j.partitions for j in submitted)
        busy_secs = sum(busy1[w] * up1 - busy0[w] * up0 for w in busy1)
        return {
            "wall_s": round(wall, 3),
            "proofs_per_min": round(jobs * 60.0 / wall, 3),
            "all_verified": ok,
            "device_busy_fraction": round(min(busy_secs / wall, 1.0 * len(busy1)), 3),
            "per_partition_ms": {
                "synthesis": round(sum(j.synthesis_ms for j in submitted) / parts, 1),
                "gpu": round(sum(j.gpu_ms for j in submitted) / parts, 1),
                "finalize": round(sum(j.finalize_ms for j in submitted) / parts, 1),
            },
        }
    finally:
        await engine.stop()


async def run_pipeline_bench(cfg: EngineConfig, kind: str, profile: str, jobs: int) -> dict:
    capacity = await asyncio.get_running_loop().run_in_executor(
        None, measure_parallel_capacity, kind, profile)
    piped = copy.deepcopy(cfg)
    piped.devices = ["cpu"] if cfg.devices == ["auto"] else cfg.devices
    piped.pipeline.enabled = True
    mono = copy.deepcopy(piped)
    mono.pipeline.enabled = False
    p = await _run_mode(piped, kind, profile, jobs)
    m = await _run_mode(mono, kind, profile, jobs)
    # Ideal: monolithic does S + G + F per partition one after another; a perfect pipeline is
    # bound by the total CPU work spread over the measured capacity, or by the device step.
    st = m["per_partition_ms"]
    serial = st["synthesis"] + st["gpu"] + st["finalize"]
    ideal_per_part = max(serial / capacity, st["gpu"] / 2)
    ideal = serial / ideal_per_part
    speedup = m["wall_s"] / p["wall_s"]
    return {
        "kind": kind, "profile": profile, "jobs": jobs,
        "parallel_capacity": capacity,
        "pipelined": p, "monolithic": m,
        "speedup": round(speedup, 3),
        "ideal_speedup": round(ideal, 3),
        "fraction_of_ideal": round(speedup / ideal, 3),
    }


def print_report(report: dict, *, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['kind']}.{report['profile']} x {report['jobs']} jobs; measured parallel "
          f"capacity {report['parallel_capacity']} of 2 processes")
    print(f"{'mode':12} {'wall s':>8} {'proofs/min':>11} {'busy':>6}  per-partition ms")
    for mode in ("pipelined", "monolithic"):
        r = report[mode]
        print(f"{mode:12} {r['wall_s']:8.2f} {r['proofs_per_min']:11.2f} "
              f"{r['device_busy_fraction']:6.2f}  {r['per_partition_ms']}")
    print(f"speedup {report['speedup']}  ideal {report['ideal_speedup']}  "
          f"= {report['fraction_of_ideal']} of ideal")
