"""Prover commands: prove, verify, circuits, setup, bench prover.

The proof system and the circuits (numpy, the curve) are imported by the commands that use them,
not here: `prove` starts reading its parameter files first, which then runs beside those imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuzk_engine import paramfile
from cuzk_engine.cli import add_param_cache_argument, param_cache
from cuzk_engine.engine.stages import ensure_parameters, synthesize
from cuzk_engine.errors import InvalidRequest, ProofFormatError
from cuzk_engine.vocabulary import KINDS, MAX_SEED, PROFILES, circuit_id


def _seed(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be a decimal integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seed {value} is outside [0, 2^64 - 1]")
    return value


def _add_kind_profile(parser: argparse.ArgumentParser, profiles=PROFILES) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--profile", required=True, choices=profiles)


class _Progress:
    """A one-line progress bar on stderr (a line per 25% when stderr is not a terminal)."""

    def __init__(self, label: str):
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last_quarter = -1

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        if self.tty:
            bar = "#" * int(30 * fraction)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {done}/{total}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif int(fraction * 4) > self.last_quarter:
            self.last_quarter = int(fraction * 4)
            print(f"{self.label}: {done}/{total}", file=sys.stderr)


def _ensure(cache: Path, kind: str, profile: str, force: bool = False) -> float:
    cid = circuit_id(kind, profile)
    params_path, vk_path = paramfile.parameter_paths(cache, cid)
    started = time.perf_counter()
    if force or not (params_path.exists() and vk_path.exists()):
        print(f"setup {cid}: {paramfile.NOT_TRUSTED}", file=sys.stderr)
    ensure_parameters(cache, kind, profile, _Progress(f"setup {cid}"), force=force)
    return time.perf_counter() - started


def _write_atomically(out: Path, files: dict[str, bytes]) -> None:
    """Write every file into a fresh sibling directory, then rename it to `out`."""
    out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidRequest(f"{out} already exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _timed_read(cache: Path, cid: str) -> tuple[paramfile.ParameterFiles, float]:
    t0 = time.perf_counter()
    files = paramfile.read_parameter_files(cache, cid)
    return files, time.perf_counter() - t0


def cmd_prove(args: argparse.Namespace) -> int:
    cache = param_cache(args)
    kind, profile, seed = args.kind, args.profile, args.seed
    cid = circuit_id(kind, profile)
    params_path, vk_path = paramfile.parameter_paths(cache, cid)
    # present files need no setup, and reading them checks their headers as _ensure would
    setup_s = 0.0 if params_path.exists() and vk_path.exists() else _ensure(cache, kind, profile)
    proofs, inputs, parts = [], [], []
    with ThreadPoolExecutor(max_workers=1) as pool:
        # reading and digesting the parameter files release the GIL: started before the heavy
        # imports and the first partition's synthesis (both pure Python), it runs beside them
        reading = pool.submit(_timed_read, cache, cid)
        from cuzk_engine import circuits, groth16
        from cuzk_engine.backend import select_backend

        backend = select_backend(args.backend)
        started = time.perf_counter()
        synth = synthesize(kind, profile, seed, 0)
        files, read_s = reading.result()
    t0 = time.perf_counter()
    params = groth16.parameters_from_files(files)
    load_s = read_s + time.perf_counter() - t0
    for partition in range(circuits.partition_count(kind, profile)):
        if partition:
            synth = synthesize(kind, profile, seed, partition)
        proof = groth16.prove(synth, params, backend)
        if not groth16.verify(params.vk, synth.public_inputs, proof):
            raise InvalidRequest(f"partition {partition}: the fresh proof does not verify")
        proofs.append(proof)
        inputs.append([str(x) for x in synth.public_inputs])
        parts.append({"partition": partition, **{k: round(v, 4) for k, v in synth.timings.items()}})
    total_s = time.perf_counter() - started
    timings = {"circuit_id": cid, "kind": kind, "profile": profile, "seed": seed,
               "backend": backend.name, "setup_s": round(setup_s, 4),
               "load_params_s": round(load_s, 4), "prove_total_s": round(total_s, 4),
               "partitions": parts}
    _write_atomically(args.out, {
        "proof.bin": b"".join(proofs),
        "vk.json": params.vk.to_bytes(),
        "public_inputs.json": (json.dumps(inputs, indent=1) + "\n").encode(),
        "timings.json": (json.dumps(timings, indent=1) + "\n").encode(),
    })
    print(f"{cid}: {len(proofs)} partition proof(s) in {total_s:.2f}s -> {args.out}")
    return 0


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ProofFormatError(f"{path}: missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProofFormatError(f"{path}: not valid JSON ({exc})") from None


def _parse_inputs(raw, path: Path) -> list[list[int]]:
    from cuzk_engine.field import MODULUS

    if not isinstance(raw, list) or not raw or not all(isinstance(p, list) for p in raw):
        raise ProofFormatError(f"{path}: expected a list with one list per partition")
    out = []
    for k, part in enumerate(raw):
        values = []
        for i, text in enumerate(part):
            if not isinstance(text, str) or not text.isdigit():
                raise ProofFormatError(
                    f"{path}: partition {k} input {i} is not a decimal string: {text!r}")
            value = int(text)
            if value >= MODULUS:
                raise ProofFormatError(
                    f"{path}: partition {k} input {i} is not below the field modulus")
            values.append(value)
        out.append(values)
    return out


def cmd_verify(args: argparse.Namespace) -> int:
    from cuzk_engine import groth16

    directory: Path = args.dir
    vk = groth16.VerifyingKey.from_json(_read_json(directory / "vk.json"))
    inputs = _parse_inputs(_read_json(directory / "public_inputs.json"),
                           directory / "public_inputs.json")
    try:
        blob = (directory / "proof.bin").read_bytes()
    except FileNotFoundError:
        raise ProofFormatError(f"{directory / 'proof.bin'}: missing") from None
    results = groth16.verify_partitions(vk, inputs, blob)
    bad = [k for k, ok in enumerate(results) if not ok]
    if bad:
        print(f"INVALID: partition(s) {', '.join(map(str, bad))} of {len(results)} do not verify",
              file=sys.stderr)
        return 1
    print(f"OK: {len(results)} partition proof(s) verify")
    return 0


def circuit_table() -> list[dict]:
    from cuzk_engine import circuits

    rows = []
    for kind in KINDS:
        for profile in PROFILES:
            rows.append({
                "circuit_id": circuit_id(kind, profile),
                "partitions": circuits.partition_count(kind, profile),
                "constraints": circuits.constraint_count(kind, profile),
                "public_inputs": circuits.num_public_inputs(kind, profile),
                "domain": circuits.domain_size(kind, profile),
            })
    return rows


def cmd_circuits(args: argparse.Namespace) -> int:
    rows = circuit_table()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| circuit | partitions | constraints / partition | public inputs | NTT domain |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['circuit_id']} | {r['partitions']} | {r['constraints']} | "
              f"{r['public_inputs']} | 2^{r['domain'].bit_length() - 1} |")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    from cuzk_engine import groth16

    cache = param_cache(args)
    cid = circuit_id(args.kind, args.profile)
    elapsed = _ensure(cache, args.kind, args.profile, force=args.force)
    params = groth16.load_parameters(cache, cid)  # full digest check, also of older files
    params_path, vk_path = groth16.parameter_paths(cache, cid)
    print(f"{cid}: parameters ready in {elapsed:.2f}s ({params.nbytes / 2**20:.1f} MiB in "
          f"memory): {params_path}, {vk_path}")
    return 0


def bench_partition(cache: Path, kind: str, profile: str, backend_name: str) -> dict:
    from cuzk_engine import groth16
    from cuzk_engine.backend import select_backend

    cid = circuit_id(kind, profile)
    setup_s = _ensure(cache, kind, profile)
    params = groth16.load_parameters(cache, cid)
    backend = select_backend(backend_name)
    synth = synthesize(kind, profile, 1, 0)
    t0 = time.perf_counter()
    pending = groth16.prove_start(synth, params, backend)
    t1 = time.perf_counter()
    proof = groth16.prove_finish(pending, params)
    t2 = time.perf_counter()
    if not groth16.verify(params.vk, synth.public_inputs, proof):
        raise InvalidRequest(f"{cid}: benchmark proof does not verify")
    synth_overlapped = synthesize(kind, profile, 2, 0)
    t3 = time.perf_counter()
    groth16.prove(synth_overlapped, params, backend)
    overlapped_s = time.perf_counter() - t3
    synth_s = synth.timings["synthesize_s"]
    start_s, finish_s = t1 - t0, t2 - t1
    total = synth_s + start_s + finish_s
    constraints = synth.num_constraints
    return {
        "circuit_id": cid, "backend": backend.name, "constraints": constraints,
        "setup_s": round(setup_s, 3), "synthesize_s": round(synth_s, 3),
        "ntt_s": round(pending.timings["ntt_s"], 3),
        "g1_msm_s": round(pending.timings["g1_msm_s"], 3),
        "g2_msm_s": round(pending.timings["g2_msm_s"], 3),
        "prove_start_s": round(start_s, 3), "finish_s": round(finish_s, 3),
        "total_s": round(total, 3), "constraints_per_s": round(constraints / total),
        "prove_start_share": round(start_s / total, 3),
        "total_overlapped_s": round(synth_overlapped.timings["synthesize_s"] + overlapped_s, 3),
    }


def cmd_bench_prover(args: argparse.Namespace) -> int:
    cache = param_cache(args)
    kinds = KINDS if args.kind == "all" else (args.kind,)
    rows = [bench_partition(cache, kind, args.profile, args.backend) for kind in kinds]
    print(json.dumps({"profile": args.profile, "cpu_count": os.cpu_count(),
                      "loadavg": [round(x, 2) for x in os.getloadavg()], "results": rows},
                     indent=1))
    columns = ["constraints", "synthesize_s", "ntt_s", "g1_msm_s", "g2_msm_s", "finish_s",
               "total_s", "constraints_per_s", "prove_start_share", "total_overlapped_s"]
    print("| circuit | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for r in rows:
        print(f"| {r['circuit_id']} | " + " | ".join(str(r[c]) for c in columns) + " |")
    return 0


def cmd_bench_msm(args: argparse.Namespace) -> int:
    from cuzk_engine.bench.msm import run_msm_bench, table

    sizes = tuple(range(args.min_log, args.max_log + 1, 2))
    groups = ("g1", "g2") if args.group == "both" else (args.group,)
    report = run_msm_bench(sizes, groups, args.reps, args.threads)
    print(json.dumps(report, indent=1))
    print(table(report))
    return 0


def cmd_bench_side_by_side(args: argparse.Namespace) -> int:
    from cuzk_engine.bench.sidebyside import run_side_by_side, table

    report = run_side_by_side(args.kind, args.profile, args.pairs, args.peer, args.peer_cwd,
                              args.with_arkworks)
    print(json.dumps(report, indent=1))
    print(table(report))
    return 0


def _add_backend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="cpu", help="cpu, cuda, cuda:<n> or auto")


def register(subparsers) -> None:
    p = subparsers.add_parser("prove", help="prove every partition of a synthetic request")
    _add_kind_profile(p)
    p.add_argument("--seed", type=_seed, required=True, help="integer in [0, 2^64 - 1]")
    p.add_argument("--out", type=Path, required=True,
                   help="output directory (must not exist or be empty)")
    _add_backend(p)
    add_param_cache_argument(p)
    p.set_defaults(func=cmd_prove, skip_teardown=True)

    p = subparsers.add_parser("verify", help="verify a directory written by `prove`")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=cmd_verify, skip_teardown=True)

    p = subparsers.add_parser("circuits", help="print the constraint count of every circuit")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_circuits)

    p = subparsers.add_parser("setup", help="generate or check test parameters "
                                            "(NOT a trusted setup)")
    _add_kind_profile(p)
    p.add_argument("--force", action="store_true", help="regenerate even if present")
    add_param_cache_argument(p)
    p.set_defaults(func=cmd_setup)


def register_bench(bench) -> None:
    p = bench.add_parser("prover", help="time one partition: synthesis, NTTs, MSMs, finish")
    p.add_argument("--profile", required=True, choices=PROFILES)
    p.add_argument("--kind", default="all", choices=("all", *KINDS))
    _add_backend(p)
    add_param_cache_argument(p)
    p.set_defaults(func=cmd_bench_prover)

    p = bench.add_parser("msm", help="native G1/G2 MSMs against arkworks, same run")
    p.add_argument("--min-log", type=int, default=12, help="smallest size, log2 (default 12)")
    p.add_argument("--max-log", type=int, default=16,
                   help="largest size, log2, in steps of 2 (default 16, ~1-2 min here; 18 for "
                        "the full range)")
    p.add_argument("--group", default="both", choices=("g1", "g2", "both"))
    p.add_argument("--reps", type=int, default=3, help="alternating runs per size (median)")
    p.add_argument("--threads", type=int, default=None,
                   help="native MSM threads (default: os.cpu_count())")
    p.set_defaults(func=cmd_bench_msm)

    p = bench.add_parser("side-by-side",
                         help="whole-process prove against a peer command, alternating")
    p.add_argument("--kind", default="winning-post", choices=KINDS)
    p.add_argument("--profile", default="small", choices=PROFILES)
    p.add_argument("--pairs", type=int, default=5, help="alternating runs after a warm-up")
    p.add_argument("--peer", help="the peer's command line, e.g. 'npx snarkjs groth16 prove "
                                  "c.zkey c.wtns proof.json public.json'")
    p.add_argument("--peer-cwd", help="directory to run the peer in")
    p.add_argument("--with-arkworks", action="store_true",
                   help="also prove with the arkworks MSMs (CUZK_NATIVE_MSM=0)")
    p.set_defaults(func=cmd_bench_side_by_side)
