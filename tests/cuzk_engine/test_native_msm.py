"""The native multi-core MSMs (msm_host.c) against arkworks' multiexp on fresh random inputs and
on the edges: zero, one and r - 1 scalars, repeated and opposite bases (the doubling and
cancelling cases inside a bucket), the point at infinity, n = 1, sizes that are not powers of
two, forced window widths and thread counts."""

import json
import os
import secrets
import sys

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_engine import groth16
from cuzk_engine.backend import select_backend
from cuzk_engine.bench.sidebyside import run_side_by_side
from cuzk_engine.cli import main
from cuzk_engine.engine.stages import synthesize
from cuzk_engine.field import MODULUS
from cuzk_engine.native import _find_compiler, build_library
from cuzk_engine.native import msm as native_msm
from tests.cuzk_engine.conftest import blst_verify

R_MINUS_1 = MODULUS - 1
GROUPS = {"g1": G1Point, "g2": G2Point}


@pytest.fixture(scope="module")
def lib():
    compiler = _find_compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    # built directly, so a compile error fails the tests instead of skipping them
    build_library(compiler, "msm_host.c", native_msm.SOURCES, native_msm.CFLAGS, "cuzk_msm")
    loaded = native_msm.load()
    assert loaded is not None
    return loaded


def limbs(values):
    return np.array([[(v >> (64 * i)) & (2**64 - 1) for i in range(4)] for v in values],
                    dtype=np.uint64).reshape(len(values), 4)


@pytest.fixture(scope="module", params=sorted(GROUPS))
def group(request):
    point_type = GROUPS[request.param]
    # random multiples of the generator, with an identity, a repeated base and its negation
    pts = [point_type() * Scalar(secrets.randbelow(MODULUS)) for _ in range(150)]
    pts[7] = point_type.identity()
    pts[8] = pts[9]
    pts[10] = -pts[9]
    return request.param, point_type, pts


def ours(lib, name, points, scalars, **kwargs):
    xy = b"".join(p.to_xy_bytes_le() for p in points)
    out = lib.msm(name, xy, limbs(scalars), **kwargs)
    return GROUPS[name].from_xy_bytes_unchecked_le(out)


def reference(point_type, points, scalars):
    if not points:
        return point_type.identity()
    return point_type.multiexp_unchecked(points, [Scalar(s) for s in scalars])


@pytest.mark.parametrize("n", [0, 1, 2, 5, 77, 150])
def test_random_scalars_match_arkworks(lib, group, n):
    name, point_type, pts = group
    scalars = [secrets.randbelow(MODULUS) for _ in range(n)]
    assert ours(lib, name, pts[:n], scalars) == reference(point_type, pts[:n], scalars)


def test_edge_scalars_match_arkworks(lib, group):
    name, point_type, pts = group
    # witness-like: mostly 0/1 (the ones take the direct path), small values crowding a few
    # buckets, the extremes r - 1 (all top digits, the signed-digit carry) and powers of two
    scalars = [1] * 40 + [0] * 30 + [secrets.randbelow(8) for _ in range(40)]
    scalars += [R_MINUS_1, R_MINUS_1, 2**254, 2**64, 2**128 + 1, 2, 3, (MODULUS - 1) // 2]
    scalars += [secrets.randbelow(MODULUS) for _ in range(len(pts) - len(scalars))]
    secrets.SystemRandom().shuffle(scalars)
    assert ours(lib, name, pts, scalars) == reference(point_type, pts, scalars)


def test_cancelling_and_doubling_inside_buckets(lib, group):
    name, point_type, pts = group
    p = pts[20]
    k = secrets.randbelow(MODULUS)
    # P and -P with the same scalar cancel; P three times with the same scalar doubles
    assert ours(lib, name, [p, -p], [k, k]) == point_type.identity()
    assert ours(lib, name, [p, p, p], [k, k, k]) == reference(point_type, [p], [3 * k])
    assert ours(lib, name, [p, p], [1, 1]) == p + p
    assert ours(lib, name, [p, -p], [1, 1]) == point_type.identity()
    assert ours(lib, name, [point_type.identity()], [k]) == point_type.identity()
    assert ours(lib, name, [p], [R_MINUS_1]) == -p


def test_doubling_and_cancelling_inside_the_reduction(lib, group):
    # window 6: 32 buckets reduced as 8 segments of 4 side by side (msm_reduce). Digits 4 and 3
    # land in the top two buckets of segment 0, whose running and total sums then meet:
    name, point_type, pts = group
    p = pts[30]
    # only the top bucket: total copies the running sum, then adds it again (a doubling)
    assert ours(lib, name, [p], [4], window=6) == p * Scalar(4)
    # B_3 = P, B_2 = -2P: running = -P after two steps, total = P: total + running cancels
    assert ours(lib, name, [p, p * Scalar(-2 % MODULUS)], [4, 3], window=6) == -(p + p)
    # B_3 = P, B_2 = -P: the running sum itself cancels, and comes back with B_0
    q = pts[31]
    assert ours(lib, name, [p, -p, q], [4, 3, 1 + 2 ** 64], window=6) == reference(
        point_type, [p, -p, q], [4, 3, 1 + 2 ** 64])
    # the same point in every bucket of every segment, and segments' sums equal to each other
    scalars = list(range(1, 33)) * 2
    assert ours(lib, name, [p] * 64, scalars, window=6) == p * Scalar(sum(scalars))


@pytest.mark.parametrize("window", [2, 3, 19])
def test_reduction_segment_edges(lib, group, window):
    # 2 and 3: one bucket per segment; 19: the segments shrink to fit a batch
    name, point_type, pts = group
    scalars = [secrets.randbelow(MODULUS) for _ in range(30)] + [R_MINUS_1, 1, 0, 2 ** 200]
    assert ours(lib, name, pts[:34], scalars, window=window, threads=2) == reference(
        point_type, pts[:34], scalars)


# GLV: k = k1 + k2 * LAMBDA with k2 = floor(k / LAMBDA) and k1 = k mod LAMBDA (msm_host.c)
LAMBDA = 0xd201000000010000 ** 2 - 1
GLV_EDGES = [LAMBDA - 1, LAMBDA, LAMBDA + 1, 2 * LAMBDA - 1, 2 * LAMBDA, LAMBDA ** 2 - 1,
             LAMBDA ** 2, LAMBDA ** 2 + LAMBDA - 1, R_MINUS_1, (LAMBDA + 1) * LAMBDA - 1,
             2 ** 128 - 1, 2 ** 128, 2 ** 254, 5 * LAMBDA + 3, (2 ** 127) * LAMBDA]


def test_glv_lambda_is_a_cube_root_of_unity():
    assert (LAMBDA ** 2 + LAMBDA + 1) % MODULUS == 0
    assert all(0 < k < MODULUS for k in GLV_EDGES)


def test_glv_split_edges_match_arkworks(lib, group):
    # the halves at their extremes (k1 = 0 or LAMBDA - 1, k2 = 0, 1 or LAMBDA + 1), the
    # quotient estimate's corrections, and one point per scalar and all of them in one MSM
    name, point_type, pts = group
    for k, p in zip(GLV_EDGES, pts[20:]):
        assert ours(lib, name, [p], [k]) == p * Scalar(k), hex(k)
        assert ours(lib, name, [p], [MODULUS - k]) == -(p * Scalar(k)), hex(k)
    scalars = GLV_EDGES + [MODULUS - k for k in GLV_EDGES]
    points = pts[40:40 + len(scalars)]
    for window in (0, 4, 13):
        assert ours(lib, name, points, scalars, window=window, threads=2) == reference(
            point_type, points, scalars)


@pytest.mark.parametrize("window", [2, 5, 8, 13, 16])
@pytest.mark.parametrize("threads", [1, 3])
def test_window_widths_and_thread_counts(lib, group, window, threads):
    name, point_type, pts = group
    scalars = [secrets.randbelow(MODULUS) for _ in range(60)] + [R_MINUS_1, 1, 0, 2]
    expected = reference(point_type, pts[:64], scalars)
    assert ours(lib, name, pts[:64], scalars, window=window, threads=threads) == expected


def test_rejects_mismatched_lengths(lib):
    xy = G1Point().to_xy_bytes_le()
    with pytest.raises(ValueError, match="length mismatch"):
        lib.msm("g1", xy, limbs([1, 2]))
    with pytest.raises(ValueError, match="not a multiple"):
        lib.msm("g1", xy[:-1], limbs([1]))
    with pytest.raises(ValueError, match="window 21"):
        lib.msm("g1", xy, limbs([1]), window=21)


# digit 128 (the top bucket at window 8) in every window but the top one: windows whose digits
# reach every bucket get no replicas
TOP_DIGITS = sum(128 << (8 * w) for w in range(31))


@pytest.mark.parametrize("scalar", [3, R_MINUS_1 - 2])
def test_one_repeated_digit_fills_the_wait_queue_and_the_overflow(lib, group, scalar):
    # every other point lands in the same bucket of each window: one fills it, one is pending,
    # a batch's worth waits for the next batch and the rest goes to the Jacobian overflow
    name, point_type, pts = group
    scalars = [scalar] * (len(pts) - 1) + [TOP_DIGITS]
    expected = reference(point_type, pts, scalars)
    assert ours(lib, name, pts, scalars, window=8, threads=2) == expected


def test_replicated_buckets_of_a_narrow_window_overflow_and_fold(lib, group):
    # scalar 3 reaches 3 of window 8's 128 buckets: the points spread over 32 replicas of them,
    # each replica still gets more than a batch and a wait queue of one bucket (overflow
    # sums in replica 0 and in the others, folded together), and 5 reaches a 5th bucket
    name, point_type, pts = group
    repeats = 16
    scalars = [3] * (repeats * len(pts) - 1) + [5]
    got = ours(lib, name, pts * repeats, scalars, window=8, threads=2)
    assert got == reference(point_type, pts, [3 * repeats] * (len(pts) - 1) + [3 * repeats + 2])


def test_bench_msm_prints_json_and_a_table(lib, capsys):
    # the smallest run: both groups at 2^12 once, each result checked against arkworks inside
    assert main(["bench", "msm", "--min-log", "12", "--max-log", "12", "--reps", "1",
                 "--threads", "2"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[:out.rindex("}") + 1])
    rows = {r["group"]: r for r in report["results"]}
    assert sorted(rows) == ["g1", "g2"]
    for row in rows.values():
        assert row["n"] == 4096 and row["threads"] == 2
        assert row["speedup"] > 0 and row["additions_per_s"] > 0
        # every scalar is random: nearly every one of its windows has a nonzero digit
        assert row["bucket_additions"] > 0.9 * row["n"] * row["windows"]
        assert row["reduction_additions"] == row["windows"] << row["window"]
    assert "| G1 2^12 | 2 |" in out and "| G2 2^12 | 2 |" in out


@pytest.mark.parametrize("native", ["1", "0"])
def test_proofs_verify_with_native_and_with_arkworks_msms(tiny_params, monkeypatch, native):
    # CUZK_NATIVE_MSM=0 is the arkworks fallback (also what runs without a C compiler); both
    # must give proofs blst accepts, through the split path and the monolithic one
    monkeypatch.setenv(native_msm.DISABLE_ENV, native)
    assert (native_msm.load() is None) == (native == "0")
    params = tiny_params["porep-c2"]
    backend = select_backend("cpu")
    for partition in (0, 1):
        synth = synthesize("porep-c2", "tiny", 5, partition)
        if partition:
            proof = groth16.prove(synth, params, backend)
        else:
            proof = groth16.prove_finish(groth16.prove_start(synth, params, backend), params)
        assert blst_verify(params.vk.to_json(), synth.public_inputs, proof)


def test_side_by_side_runs_whole_processes(tiny_cache, monkeypatch):
    # every side is a real process (ours with native and with arkworks MSMs, a trivial peer),
    # each run after one warm-up; the proofs themselves are checked by the prove command
    monkeypatch.setenv("CUZK_PARAM_CACHE", str(tiny_cache))
    report = run_side_by_side("winning-post", "tiny", 1, peer=f"{sys.executable} -c pass",
                              with_arkworks=True)
    names = [r["side"] for r in report["results"]]
    assert names == ["cuzk_engine", "cuzk_engine (arkworks MSMs)", "peer"]
    for row in report["results"]:
        assert len(row["wall_s"]) == 1 and row["median_s"] > 0 and row["peak_rss_mib"] > 0
    assert report["results"][0]["ours_over_this"] == 1.0
    with pytest.raises(RuntimeError, match="peer failed"):
        run_side_by_side("winning-post", "tiny", 1, peer=f"{sys.executable} -c 'exit(3)'")


def test_thread_count_defaults_to_every_core_unless_configured(monkeypatch):
    monkeypatch.setattr(native_msm, "_process_threads", None)  # an engine in this process sets it
    monkeypatch.delenv(native_msm.THREADS_ENV, raising=False)
    assert native_msm.default_threads() == max(1, os.cpu_count() or 1)
    monkeypatch.setenv(native_msm.THREADS_ENV, "3")
    assert native_msm.default_threads() == 3
    for unusable in ("0", "-2", "many", ""):
        monkeypatch.setenv(native_msm.THREADS_ENV, unusable)
        assert native_msm.default_threads() == max(1, os.cpu_count() or 1)

    native_msm.set_process_threads(2)  # what an engine sets for its process wins
    assert native_msm.default_threads() == 2
