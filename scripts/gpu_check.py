#!/usr/bin/env python
"""Device check for the CUDA backend: one command on a GPU machine, under 8 minutes on one H200.

  python scripts/gpu_check.py [--e2e-kind winning-post] [--e2e-profile large]

1. compiles ntt.cu and msm.cu with NVRTC through cupy;
2. checks every kernel against the CPU backend / arkworks on fresh random inputs, with every
   write-only kernel output poisoned before its launch;
3. times NTT 2^16..2^24 and G1 MSM 2^16..2^22 with CUDA events (device-resident inputs);
4. proves one partition of --e2e-kind/--e2e-profile end to end (prove_start on cuda and on cpu,
   both proofs finished and verified); when the remaining budget is too small for the CPU run at
   that size, the CPU side runs --cpu-fallback-profile instead and the report says so;
5. prints a table and JSON, and writes the JSON to $OUT/gpu_check.json when OUT is set.

Exits 2 without a usable GPU, 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cuzk_engine.backend import cuda
from cuzk_engine.backend.cpu import CpuBackend
from cuzk_engine.curve import G1Bases, G1Point, Scalar
from cuzk_engine.errors import CudaUnavailable
from cuzk_engine.field import MODULUS
from cuzk_engine.native import gpu_driver

FR_TOP_LIMB = MODULUS >> 192


def random_fr(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniform-ish canonical limbs, fast at 2^24: the top limb is drawn below r's top limb."""
    values = rng.integers(0, 2**64, size=(n, 4), dtype=np.uint64, endpoint=False)
    values[:, 3] %= np.uint64(FR_TOP_LIMB)
    return values


def chained_points(n: int) -> list:
    """n distinct points P, P+Q, P+2Q, ... (one addition each instead of a scalar multiply)."""
    step = G1Point() * Scalar(secrets.randbelow(MODULUS))
    points = [G1Point() * Scalar(secrets.randbelow(MODULUS))]
    for _ in range(n - 1):
        points.append(points[-1] + step)
    return points


def as_scalars(limbs: np.ndarray) -> list:
    return [Scalar.from_le_bytes(row.tobytes()) for row in limbs]


class Report:
    def __init__(self) -> None:
        self.data: dict = {"checks": [], "ntt": [], "msm": [], "e2e": {}, "notes": []}
        self.failed = False

    def check(self, name: str, ok: bool, seconds: float) -> None:
        self.data["checks"].append({"name": name, "ok": bool(ok), "s": round(seconds, 3)})
        self.failed |= not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name} ({seconds:.2f} s)", flush=True)


def check_kernels(cupy, run, backend, report: Report, rng, msm_logs=(12, 16)) -> None:
    poisoned = gpu_driver.PoisoningRunner(run)
    cpu = CpuBackend()
    for log_n in (1, 10, 16):
        host = random_fr(rng, 1 << log_n)
        for inverse in (False, True):
            for coset in (False, True):
                t = time.perf_counter()
                table = gpu_driver.twiddles(cupy, poisoned, log_n, inverse)
                got = gpu_driver.ntt(cupy, poisoned, cupy.asarray(host), log_n, table,
                                     inverse_=inverse, coset=coset)
                ok = np.array_equal(cupy.asnumpy(got), cpu.ntt(host, inverse=inverse, coset=coset))
                report.check(f"ntt 2^{log_n} inverse={inverse} coset={coset}", ok,
                             time.perf_counter() - t)
    host = random_fr(rng, 1 << 12)
    t = time.perf_counter()
    ok = np.array_equal(backend.ntt(host, inverse=True, coset=True),
                        cpu.ntt(host, inverse=True, coset=True))
    report.check("backend.ntt 2^12 (transfers, cached twiddles)", ok, time.perf_counter() - t)

    flags_in = np.array([[0, 0, 0, 0], [0, 0, 0, FR_TOP_LIMB + 1], [2**64 - 1] * 4,
                         [(MODULUS >> (64 * i)) & (2**64 - 1) for i in range(4)]], np.uint64)
    flags = cupy.empty(4, dtype=cupy.uint8)
    poisoned("fr_flag_noncanonical", 4, flags, cupy.asarray(flags_in))
    report.check("fr_flag_noncanonical", cupy.asnumpy(flags).tolist() == [0, 1, 1, 1], 0.0)

    small, large = msm_logs
    points = chained_points(1 << large)
    bases = G1Bases.from_points(points)
    device_bases = backend.device_bases(bases)
    cases = [(f"random 2^{small}", random_fr(rng, 1 << small)),
             (f"0/1/2 values 2^{small}",
              rng.integers(0, 3, size=(1 << small, 4), dtype=np.uint64)
              * np.array([1, 0, 0, 0], np.uint64)),
             (f"random 2^{large}", random_fr(rng, 1 << large))]
    for label, scalars in cases:
        n = len(scalars)
        t = time.perf_counter()
        got = gpu_driver.msm(cupy, poisoned, device_bases[:n].copy(), cupy.asarray(scalars))
        expected = G1Point.multiexp_unchecked(points[:n], as_scalars(scalars))
        report.check(f"msm {label} vs arkworks", got == expected, time.perf_counter() - t)
    t = time.perf_counter()
    scalars = random_fr(rng, len(points))
    ok = backend.msm_g1(bases, scalars) == CpuBackend().msm_g1(bases, scalars)
    report.check(f"backend.msm_g1 2^{large} vs cpu backend", ok, time.perf_counter() - t)
    backend.release_bases(bases)


def time_events(cupy, fn, repeats: int) -> tuple[float, float]:
    """(best device ms by CUDA events, best wall ms) over `repeats` runs after one warm-up."""
    fn()
    best_gpu = best_wall = float("inf")
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        wall = time.perf_counter()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best_wall = min(best_wall, (time.perf_counter() - wall) * 1e3)
        best_gpu = min(best_gpu, cupy.cuda.get_elapsed_time(start, stop))
    return best_gpu, best_wall


def time_kernels(cupy, run, report: Report, rng, ntt_logs, msm_logs, distinct_log=16) -> None:
    for log_n in ntt_logs:
        values = cupy.asarray(random_fr(rng, 1 << log_n))
        t = time.perf_counter()
        table = gpu_driver.twiddles(cupy, run, log_n, False)
        cupy.cuda.Device().synchronize()
        twiddle_ms = (time.perf_counter() - t) * 1e3
        gpu_ms, wall_ms = time_events(cupy, lambda v=values, k=log_n, w=table: gpu_driver.ntt(
            cupy, run, v, k, w, inverse_=False, coset=False), repeats=3)
        report.data["ntt"].append({"log_n": log_n, "gpu_ms": round(gpu_ms, 3),
                                   "wall_ms": round(wall_ms, 3),
                                   "twiddles_ms": round(twiddle_ms, 3)})
        print(f"  ntt 2^{log_n}: {gpu_ms:.3f} ms (twiddles {twiddle_ms:.1f} ms once)", flush=True)

    distinct = 1 << distinct_log
    xy = G1Bases.from_points(chained_points(distinct)).xy
    unique = cupy.asarray(np.frombuffer(xy, np.uint64).reshape(distinct, 12))
    run("msm_bases_to_mont", distinct, unique)
    for log_n in msm_logs:
        n = 1 << log_n
        # bases repeat every `distinct` points: the same work per point as distinct ones
        bases = cupy.ascontiguousarray(cupy.tile(unique, (n // distinct, 1)))
        scalars = cupy.asarray(random_fr(rng, n))
        repeats = 3 if log_n <= 20 else 2
        gpu_ms, wall_ms = time_events(
            cupy, lambda b=bases, s=scalars: gpu_driver.msm(cupy, run, b, s), repeats=repeats)
        report.data["msm"].append({"log_n": log_n, "gpu_ms": round(gpu_ms, 3),
                                   "wall_ms": round(wall_ms, 3),
                                   "window_bits": gpu_driver.msm_shape(n).window_bits})
        print(f"  msm 2^{log_n}: {gpu_ms:.1f} ms", flush=True)


def prove_once(groth16, synth, params, backend) -> tuple[float, bool, dict]:
    t = time.perf_counter()
    pending = groth16.prove_start(synth, params, backend)
    elapsed = time.perf_counter() - t
    proof = groth16.prove_finish(pending, params)
    return elapsed, groth16.verify(params.vk, synth.public_inputs, proof), pending.timings


def end_to_end(backend, report: Report, args, deadline: float) -> None:
    from cuzk_engine import circuits, groth16
    from cuzk_engine.engine.stages import ensure_parameters, synthesize

    cache = Path(os.environ.get("CUZK_PARAM_CACHE") or tempfile.mkdtemp(prefix="cuzk-params-"))
    e2e = report.data["e2e"]

    def prepare(profile: str):
        t = time.perf_counter()
        ensure_parameters(cache, args.e2e_kind, profile)
        params = groth16.load_parameters(cache, circuits.circuit_id(args.e2e_kind, profile))
        setup_s = time.perf_counter() - t
        t = time.perf_counter()
        synth = synthesize(args.e2e_kind, profile, secrets.randbelow(2**64), 0)
        return params, synth, setup_s, time.perf_counter() - t

    params, synth, setup_s, synth_s = prepare(args.e2e_profile)
    e2e.update(kind=args.e2e_kind, profile=args.e2e_profile, setup_s=round(setup_s, 1),
               synthesize_s=round(synth_s, 1), domain_log=params.domain_log)
    print(f"  setup {setup_s:.1f} s, synthesis {synth_s:.1f} s, domain 2^{params.domain_log}",
          flush=True)
    cold, ok_cold, _ = prove_once(groth16, synth, params, backend)
    warm, ok_warm, timings = prove_once(groth16, synth, params, backend)
    report.check(f"prove {args.e2e_kind}.{args.e2e_profile} on {backend.name} verifies",
                 ok_cold and ok_warm, warm)
    e2e.update(cuda_prove_start_cold_s=round(cold, 3), cuda_prove_start_s=round(warm, 3),
               cuda_timings={k: round(v, 3) for k, v in timings.items()})

    # the CPU prove is the slowest step; fall back to a smaller profile rather than overrun
    cpu_profile = args.e2e_profile
    if deadline - time.perf_counter() < args.cpu_reserve_s:
        cpu_profile = args.cpu_fallback_profile
        report.data["notes"].append(
            f"CPU prove_start ran on profile {cpu_profile}, not {args.e2e_profile}: "
            f"under {args.cpu_reserve_s} s of the budget was left")
        params, synth, _, _ = prepare(cpu_profile)
        cuda_same, _, _ = prove_once(groth16, synth, params, backend)
        e2e["cuda_prove_start_on_cpu_profile_s"] = round(cuda_same, 3)
    cpu_s, ok_cpu, _ = prove_once(groth16, synth, params, CpuBackend())
    report.check(f"prove {args.e2e_kind}.{cpu_profile} on cpu verifies", ok_cpu, cpu_s)
    e2e.update(cpu_profile=cpu_profile, cpu_prove_start_s=round(cpu_s, 3))
    gpu_same = e2e.get("cuda_prove_start_on_cpu_profile_s", warm)
    e2e["speedup"] = round(cpu_s / gpu_same, 1) if gpu_same else None


def print_table(report: Report) -> None:
    d = report.data
    print("\n| op | size | gpu ms (events) | wall ms |")
    print("|---|---|---|---|")
    for row in d["ntt"]:
        print(f"| NTT | 2^{row['log_n']} | {row['gpu_ms']:.3f} | {row['wall_ms']:.3f} |")
    for row in d["msm"]:
        print(f"| G1 MSM (c={row['window_bits']}) | 2^{row['log_n']} | {row['gpu_ms']:.1f} | "
              f"{row['wall_ms']:.1f} |")
    e2e = d["e2e"]
    if "cuda_prove_start_s" in e2e:
        print(f"\nprove_start {e2e['kind']}.{e2e['profile']} (2^{e2e['domain_log']}): "
              f"cuda {e2e['cuda_prove_start_s']:.2f} s (cold {e2e['cuda_prove_start_cold_s']:.2f} s)"
              f"; cpu ({e2e.get('cpu_profile')}) {e2e.get('cpu_prove_start_s', float('nan')):.2f} s"
              f"; speedup {e2e.get('speedup')}x")
    for note in d["notes"]:
        print(f"note: {note}")
    passed = sum(c["ok"] for c in d["checks"])
    print(f"checks: {passed}/{len(d['checks'])} passed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--e2e-kind", default="winning-post")
    parser.add_argument("--e2e-profile", default="large")
    parser.add_argument("--cpu-fallback-profile", default="medium")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--ntt-max-log", type=int, default=24)
    parser.add_argument("--msm-max-log", type=int, default=22)
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="total time the check aims to stay under")
    parser.add_argument("--cpu-reserve-s", type=float, default=150.0,
                        help="time left needed to run the CPU prove at the e2e profile")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    deadline = started + args.budget_s

    try:
        backend = cuda.CudaBackend.create(args.device)
    except CudaUnavailable as exc:
        print(f"gpu_check: no usable GPU, nothing checked: {exc}", file=sys.stderr)
        return 2
    import cupy

    report = Report()
    props = cupy.cuda.runtime.getDeviceProperties(args.device)
    report.data["device"] = {"name": props["name"].decode(), "ordinal": args.device,
                             "cc": f"{props['major']}.{props['minor']}",
                             "memory_gib": round(props["totalGlobalMem"] / 2**30, 1)}
    print(f"device: {report.data['device']}", flush=True)
    rng = np.random.default_rng(secrets.randbits(64))

    print("compile:", flush=True)
    t = time.perf_counter()
    with cupy.cuda.Device(args.device):
        run = backend.runner()
        report.data["compile_s"] = round(time.perf_counter() - t, 2)
        print(f"  ntt.cu + msm.cu: {report.data['compile_s']} s", flush=True)
        print("correctness (poisoned outputs, fresh random inputs):", flush=True)
        check_kernels(cupy, run, backend, report, rng)
        print("timings:", flush=True)
        time_kernels(cupy, run, report, rng, range(16, args.ntt_max_log + 1, 2),
                     range(16, args.msm_max_log + 1, 2))
        report.data["memory"] = backend.memory_info()
        if not args.skip_e2e:
            print("end to end:", flush=True)
            end_to_end(backend, report, args, deadline)
    report.data["total_s"] = round(time.perf_counter() - started, 1)
    print_table(report)
    text = json.dumps(report.data, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
