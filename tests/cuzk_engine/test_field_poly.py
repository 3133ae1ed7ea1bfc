import random

import numpy as np
import pytest

from cuzk_engine import native
from cuzk_engine.backend import select_backend
from cuzk_engine.backend.cpu import CpuBackend
from cuzk_engine.field import (
    GENERATOR,
    MODULUS,
    batch_inverse,
    ints_to_limbs,
    limbs_to_ints,
    root_of_unity,
)
from cuzk_engine.groth16.prover import Synthesis, compute_h
from cuzk_engine.poly import Domain, transform_python

rng = random.Random(7)


def rand_vec(n):
    return [rng.randrange(MODULUS) for _ in range(n)]


def horner(coeffs, x):
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % MODULUS
    return acc


def test_limb_round_trip_and_roots():
    values = rand_vec(33) + [0, 1, MODULUS - 1]
    assert limbs_to_ints(ints_to_limbs(values)) == values
    w = root_of_unity(10)
    assert pow(w, 1 << 10, MODULUS) == 1 and pow(w, 1 << 9, MODULUS) != 1
    xs = rand_vec(20)
    assert all(x * y % MODULUS == 1 for x, y in zip(xs, batch_inverse(xs)))


def test_native_kernels_build():
    assert native.load() is not None, "the C compiler should be available in the dev env"


@pytest.mark.parametrize("log_n", [1, 4, 9])
def test_native_ntt_matches_direct_evaluation(log_n):
    n = 1 << log_n
    coeffs = rand_vec(n)
    backend = select_backend("cpu")
    w = root_of_unity(log_n)
    direct = [horner(coeffs, pow(w, k, MODULUS)) for k in range(n)]
    assert limbs_to_ints(backend.ntt(ints_to_limbs(coeffs))) == direct
    coset = [horner(coeffs, GENERATOR * pow(w, k, MODULUS) % MODULUS) for k in range(n)]
    assert limbs_to_ints(backend.ntt(ints_to_limbs(coeffs), coset=True)) == coset


@pytest.mark.parametrize("coset", [False, True])
def test_ntt_round_trip_native_and_python_agree(coset):
    log_n = 8
    values = ints_to_limbs(rand_vec(1 << log_n))
    backend = select_backend("cpu")
    forward = backend.ntt(values, coset=coset)
    assert np.array_equal(backend.ntt(forward, inverse=True, coset=coset), values)
    python = transform_python(limbs_to_ints(values), log_n, inverse_=False, coset=coset)
    assert limbs_to_ints(forward) == python


def test_python_fallback_backend(monkeypatch):
    monkeypatch.setattr(native, "load", lambda: None)
    backend = CpuBackend()
    assert backend.native is None
    values = ints_to_limbs(rand_vec(16))
    assert np.array_equal(backend.ntt(backend.ntt(values), inverse=True), values)


def test_native_vector_ops():
    lib = native.load()
    a, b = rand_vec(50), rand_vec(50)
    got = limbs_to_ints(lib.mul_vec(ints_to_limbs(a), ints_to_limbs(b)))
    assert got == [x * y % MODULUS for x, y in zip(a, b)]


def test_quotient_satisfies_h_times_z():
    """H*Z = A*B - C on random polynomials: evaluations with c = a*b on the domain."""
    domain = Domain(6)
    n = domain.size
    a, b = rand_vec(n), rand_vec(n)
    c = [x * y % MODULUS for x, y in zip(a, b)]
    synth = Synthesis("t", 0, [], ints_to_limbs([1]), ints_to_limbs(a),
                      ints_to_limbs(b), ints_to_limbs(c))
    backend = select_backend("cpu")
    h = limbs_to_ints(compute_h(backend, synth, domain))
    assert len(h) == n - 1
    coeff = {name: limbs_to_ints(backend.ntt(ints_to_limbs(v), inverse=True))
             for name, v in (("a", a), ("b", b), ("c", c))}
    for _ in range(3):
        x = rng.randrange(MODULUS)
        lhs = horner(h, x) * domain.vanishing_at(x) % MODULUS
        rhs = (horner(coeff["a"], x) * horner(coeff["b"], x) - horner(coeff["c"], x)) % MODULUS
        assert lhs == rhs


def test_quotient_rejects_non_divisible_input():
    domain = Domain(4)
    n = domain.size
    a, b, c = rand_vec(n), rand_vec(n), rand_vec(n)
    synth = Synthesis("t", 0, [], ints_to_limbs([1]), ints_to_limbs(a),
                      ints_to_limbs(b), ints_to_limbs(c))
    with pytest.raises(ArithmeticError):
        compute_h(select_backend("cpu"), synth, domain)
