"""The GPU's MSM and NTT algorithms run on the CPU: the kernels' per-thread bodies (host build)
driven by the same gpu_driver code the CUDA backend uses, compared with arkworks'
multiexp_unchecked and the CPU backend's NTT on fresh random inputs."""

import secrets

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, Scalar

from cuzk_engine.backend.cpu import CpuBackend
from cuzk_engine.errors import CompilerUnavailable
from cuzk_engine.field import MODULUS
from cuzk_engine.native import gpu_driver, gpu_host

R_MINUS_1 = MODULUS - 1


@pytest.fixture(scope="module")
def kernels():
    try:
        return gpu_driver.PoisoningRunner(gpu_host.load())
    except CompilerUnavailable as exc:
        pytest.skip(str(exc))


def limbs(values):
    return np.array([[(v >> (64 * i)) & (2**64 - 1) for i in range(4)] for v in values],
                    dtype=np.uint64).reshape(len(values), 4)


def host_bases(kernels, points):
    xy = b"".join(p.to_xy_bytes_le() for p in points)
    bases = np.frombuffer(xy, dtype=np.uint64).reshape(len(points), 12).copy()
    kernels("msm_bases_to_mont", len(bases), bases)
    return bases


def host_msm(kernels, points, scalars):
    return gpu_driver.msm(np, kernels, host_bases(kernels, points), limbs(scalars))


def arkworks_msm(points, scalars):
    return G1Point.multiexp_unchecked(points, [Scalar(s) for s in scalars])


@pytest.fixture(scope="module")
def points():
    pts = [G1Point() * Scalar(secrets.randbelow(MODULUS)) for _ in range(200)]
    pts[7] = G1Point.identity()
    pts[8] = pts[9]  # a repeated base meets itself in its bucket: the doubling case
    return pts


@pytest.mark.parametrize("n", [1, 3, 64, 200])
def test_bucket_msm_matches_arkworks_on_random_scalars(kernels, points, n):
    scalars = [secrets.randbelow(MODULUS) for _ in range(n)]
    assert host_msm(kernels, points[:n], scalars) == arkworks_msm(points[:n], scalars)


def test_bucket_msm_skewed_scalars(kernels, points):
    # Witness-like values: mostly 0/1 and small counters pile into a few buckets, which the
    # driver must split into several accumulation runs; plus the extremes r - 1 and 2^254.
    scalars = [1] * 100 + [0] * 40 + [secrets.randbelow(8) for _ in range(56)]
    scalars += [R_MINUS_1, 2**254, 2**64, 2**128 + 1]
    assert host_msm(kernels, points, scalars) == arkworks_msm(points, scalars)


@pytest.mark.parametrize("window_bits,segment_log", [(8, 3), (7, 7), (13, 8)])
def test_bucket_msm_window_shapes(kernels, points, window_bits, segment_log):
    # Wider windows than the size-based default, cut into several reduction segments per
    # window, so the segment offsets (lo > 0) and uneven last windows are exercised.
    shape = gpu_driver.MsmShape(window_bits, -(-255 // window_bits), segment_log)
    scalars = [secrets.randbelow(MODULUS) for _ in range(40)]
    sums = gpu_driver.msm_windows(np, kernels, host_bases(kernels, points[:40]), limbs(scalars),
                                  shape)
    assert gpu_driver.combine_windows(sums, shape) == arkworks_msm(points[:40], scalars)


def test_bucket_msm_one_huge_bucket_reduces_in_several_levels(kernels):
    # 1100 entries in one bucket: 35 runs, then 2, then 1 (three reduction levels).
    n = 1100
    pts = [G1Point() * Scalar(secrets.randbelow(MODULUS))]
    for _ in range(n - 1):
        pts.append(pts[-1] + pts[0])
    scalars = [1] * n
    scalars[-1] = secrets.randbelow(MODULUS)
    assert host_msm(kernels, pts, scalars) == arkworks_msm(pts, scalars)


def test_bucket_msm_all_zero_scalars_is_identity(kernels, points):
    assert host_msm(kernels, points[:50], [0] * 50) == G1Point.identity()


def test_run_tasks_split_long_segments_and_keep_empty_ones():
    offsets = np.array([0, 0, 5, 5 + 3 * gpu_driver.RUN_LENGTH + 1], dtype=np.int64)
    begin, end, task_offsets = gpu_driver.run_tasks(np, offsets)
    assert task_offsets.tolist() == [0, 1, 2, 6]
    assert begin.tolist()[:2] == [0, 0] and end.tolist()[:2] == [0, 5]
    assert (end - begin)[2:].tolist() == [gpu_driver.RUN_LENGTH] * 3 + [1]
    assert end[-1] == offsets[-1]


@pytest.mark.parametrize("log_n", [0, 1, 5, 10])
@pytest.mark.parametrize("inverse,coset", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_gpu_ntt_algorithm_matches_cpu_backend(kernels, log_n, inverse, coset):
    values = limbs([secrets.randbelow(MODULUS) for _ in range(1 << log_n)])
    table = gpu_driver.twiddles(np, kernels, log_n, inverse)
    got = gpu_driver.ntt(np, kernels, values, log_n, table, inverse_=inverse, coset=coset)
    expected = CpuBackend().ntt(values, inverse=inverse, coset=coset)
    assert np.array_equal(got, expected)


def test_noncanonical_flags(kernels):
    values = limbs([0, MODULUS - 1, MODULUS, 2**256 - 1, 5])
    flags = np.empty(5, dtype=np.uint8)
    kernels("fr_flag_noncanonical", 5, flags, values)
    assert flags.tolist() == [0, 0, 1, 1, 0]
