"""The Fp and G1 arithmetic the MSM kernels are built from, compiled for the host with gcc and
checked against Python integers and arkworks on fresh random inputs."""

import secrets

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, Scalar

from cuzk_engine.errors import CompilerUnavailable
from cuzk_engine.native import gpu_host
from cuzk_engine.native.gpu_driver import BASE_MODULUS as P
from cuzk_engine.native.gpu_driver import jacobian_to_g1

R = 1 << 384
COUNT = 64


@pytest.fixture(scope="module")
def kernels():
    try:
        return gpu_host.load()
    except CompilerUnavailable as exc:
        pytest.skip(str(exc))


def to_limbs(values, limbs=6):
    return np.array([[(v >> (64 * i)) & (2**64 - 1) for i in range(limbs)] for v in values],
                    dtype=np.uint64).reshape(len(values), limbs)


def from_limbs(array):
    return [sum(int(x) << (64 * i) for i, x in enumerate(row)) for row in array]


def random_fp(count):
    # include the edges a carry chain gets wrong first
    edge = [0, 1, P - 1, P - 2, (1 << 64) - 1, 1 << 380]
    return edge + [secrets.randbelow(P) for _ in range(count - len(edge))]


def mont(v):
    return v * R % P


def test_fp_mul_add_sub_neg_match_python_ints(kernels):
    a, b = random_fp(COUNT), random_fp(COUNT)[::-1]
    la, lb = to_limbs(a), to_limbs(b)
    out = np.empty_like(la)
    r_inv = pow(R, -1, P)
    assert from_limbs(kernels.elementwise("fp_mul_vec", out, la, lb)) == [
        x * y * r_inv % P for x, y in zip(a, b)]
    assert from_limbs(kernels.elementwise("fp_add_vec", out, la, lb)) == [
        (x + y) % P for x, y in zip(a, b)]
    assert from_limbs(kernels.elementwise("fp_sub_vec", out, la, lb)) == [
        (x - y) % P for x, y in zip(a, b)]
    assert from_limbs(kernels.elementwise("fp_neg_vec", out, la)) == [(-x) % P for x in a]


def test_fp_montgomery_round_trip(kernels):
    a = random_fp(COUNT)
    out = np.empty((COUNT, 6), dtype=np.uint64)
    in_mont = kernels.elementwise("fp_to_mont_vec", out, to_limbs(a))
    assert from_limbs(in_mont) == [mont(x) for x in a]
    back = kernels.elementwise("fp_from_mont_vec", np.empty_like(out), in_mont.copy())
    assert from_limbs(back) == a


def random_points(count):
    return [G1Point() * Scalar(secrets.randbelow(2**255)) for _ in range(count)]


def affine_ints(point):
    xy = point.to_xy_bytes_le()
    return int.from_bytes(xy[:48], "little"), int.from_bytes(xy[48:], "little")


def jacobian(points):
    """Montgomery Jacobian limbs with a random Z per point, so no formula can rely on Z = 1."""
    rows = []
    for p in points:
        if p == G1Point.identity():
            rows.append([mont(1), mont(1), 0])
            continue
        x, y = affine_ints(p)
        z = secrets.randbelow(P - 1) + 1
        rows.append([mont(x * z * z % P), mont(y * z * z * z % P), mont(z)])
    return to_limbs([c for row in rows for c in row]).reshape(len(points), 18)


def affine(points):
    rows = []
    for p in points:
        x, y = affine_ints(p)
        rows += [mont(x) if (x or y) else 0, mont(y) if (x or y) else 0]
    return to_limbs(rows).reshape(len(points), 12)


def as_points(array):
    return [jacobian_to_g1(row) for row in array]


def test_g1_add_double_mixed_add_match_arkworks(kernels):
    ps, qs = random_points(COUNT), random_points(COUNT)
    inf = G1Point.identity()
    # exceptional pairs: equal, opposite, and infinity on either side
    ps[:5] = [ps[0], ps[1], inf, ps[3], inf]
    qs[:5] = [ps[0], -ps[1], qs[2], inf, inf]
    out = np.empty((COUNT, 18), dtype=np.uint64)
    expected_sum = [p + q for p, q in zip(ps, qs)]
    assert as_points(kernels.elementwise("g1_add_vec", out, jacobian(ps), jacobian(qs))) == \
        expected_sum
    assert as_points(kernels.elementwise("g1_add_mixed_vec", out, jacobian(ps), affine(qs))) == \
        expected_sum
    assert as_points(kernels.elementwise("g1_dbl_vec", out, jacobian(ps))) == [p + p for p in ps]


def test_g1_small_multiple_matches_arkworks(kernels):
    ps = random_points(8)
    ks = [0, 1, 2, 3, 31, 2**16 - 1, secrets.randbelow(2**20), secrets.randbelow(2**64)]
    out = np.empty((8, 18), dtype=np.uint64)
    got = kernels.elementwise("g1_mul_small_vec", out, jacobian(ps), np.array(ks, np.uint64))
    assert as_points(got) == [p * Scalar(k) for p, k in zip(ps, ks)]
