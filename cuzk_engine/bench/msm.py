"""G1 and G2 MSMs: the native multi-core Pippenger against py-arkworks' multiexp, same run.

Per group and size 2^k: the median wall time of each over `reps` alternating runs on the same
uniformly random scalars, and the median CPU seconds (this process, every thread: what the
work costs whatever else shares the machine) (the witness's 0/1 values would flatter the native side, which sums
them directly), the speedup, the threads used, and the group additions the native algorithm
needs (bucket additions for every nonzero signed digit, two per bucket in the reductions, the
doublings between windows) with the rate achieved. Bases are 4096 distinct points repeated:
the cost of an MSM does not depend on whether its bases repeat.
"""

from __future__ import annotations

import datetime
import os
import secrets
import statistics
import time

import numpy as np

from cuzk_engine.curve import G1Point, G2Point, Scalar
from cuzk_engine.field import MODULUS
from cuzk_engine.native import msm as native_msm

GROUPS: dict[str, type[G1Point | G2Point]] = {"g1": G1Point, "g2": G2Point}
DISTINCT_BASES = 4096
DEFAULT_LOG_SIZES = (12, 14, 16)


def _bases(point_type, n: int) -> tuple[list, bytes]:
    step = point_type() * Scalar(secrets.randbelow(MODULUS - 1) + 1)
    distinct = [step]
    for _ in range(min(n, DISTINCT_BASES) - 1):
        distinct.append(distinct[-1] + step)
    xy = b"".join(p.to_xy_bytes_le() for p in distinct)
    reps, rest = divmod(n, len(distinct))
    return distinct * reps + distinct[:rest], xy * reps + xy[:rest * len(xy) // len(distinct)]


def _scalars(n: int) -> tuple[np.ndarray, list]:
    values = [secrets.randbelow(MODULUS) for _ in range(n)]
    limbs = np.array([[(v >> (64 * i)) & (2**64 - 1) for i in range(4)] for v in values],
                     dtype=np.uint64).reshape(n, 4)
    return limbs, [Scalar(v) for v in values]


def measure(lib: native_msm.NativeMsm, group: str, log_n: int, reps: int,
            threads: int) -> dict:
    point_type = GROUPS[group]
    n = 1 << log_n
    points, xy = _bases(point_type, n)
    limbs, scalars = _scalars(n)
    ours_s, arkworks_s, ours_cpu, arkworks_cpu = [], [], [], []
    stats: dict[str, int] = {}
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        ours = lib.msm(group, xy, limbs, threads=threads, stats=stats)
        c1, t1 = time.process_time(), time.perf_counter()
        reference = point_type.multiexp_unchecked(points, scalars)
        c2, t2 = time.process_time(), time.perf_counter()
        if point_type.from_xy_bytes_unchecked_le(ours) != reference:
            raise ArithmeticError(f"native {group} MSM of 2^{log_n} disagrees with arkworks")
        ours_s.append(t1 - t0)
        arkworks_s.append(t2 - t1)
        ours_cpu.append(c1 - c0)
        arkworks_cpu.append(c2 - c1)
    ours_med, ark_med = statistics.median(ours_s), statistics.median(arkworks_s)
    ours_cpu_med, ark_cpu_med = statistics.median(ours_cpu), statistics.median(arkworks_cpu)
    additions = stats["bucket_additions"] + stats["reduction_additions"] + stats["doublings"]
    return {
        "group": group, "log_n": log_n, "n": n, "threads": threads,
        "ours_s": round(ours_med, 4), "arkworks_s": round(ark_med, 4),
        "speedup": round(ark_med / ours_med, 2),
        "ours_cpu_s": round(ours_cpu_med, 4), "arkworks_cpu_s": round(ark_cpu_med, 4),
        "cpu_ratio": round(ark_cpu_med / ours_cpu_med, 2),
        "window": stats["window"], "windows": stats["windows"],
        "bucket_additions": stats["bucket_additions"],
        "reduction_additions": stats["reduction_additions"], "doublings": stats["doublings"],
        "additions": additions, "additions_per_s": round(additions / ours_med),
    }


def run_msm_bench(log_sizes: tuple[int, ...] = DEFAULT_LOG_SIZES,
                  groups: tuple[str, ...] = tuple(GROUPS), reps: int = 3,
                  threads: int | None = None) -> dict:
    lib = native_msm.load()
    if lib is None:
        raise RuntimeError("the native MSM is not available (no C compiler, or "
                           f"{native_msm.DISABLE_ENV}=0)")
    threads = threads or native_msm.default_threads()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "reps": reps,
        "results": [measure(lib, g, k, reps, threads) for g in groups for k in log_sizes],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


COLUMNS = ("threads", "ours_s", "arkworks_s", "speedup", "ours_cpu_s", "arkworks_cpu_s",
           "cpu_ratio", "window", "additions", "additions_per_s")


def table(report: dict) -> str:
    lines = ["| msm | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for r in report["results"]:
        lines.append(f"| {r['group'].upper()} 2^{r['log_n']} | "
                     + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)
