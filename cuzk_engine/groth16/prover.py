"""The Groth16 prover, split where the engine needs it.

It proves a satisfied constraint system, whatever circuit built it (the engine's synthesis
stage builds one per partition: cuzk_engine.engine.stages.synthesize):
Synthesis.from_constraint_system -> prove_start (NTTs + G1 MSMs: the GPU's part) ->
prove_finish (G2 MSM, blinding, assembly: the finalizer's part).

With witness w, QAP polynomials u_i, v_i, w_i and quotient h:
  A  = alpha + sum w_i u_i(tau) + r delta                    (G1)
  B  = beta  + sum w_i v_i(tau) + s delta                    (G2, and a G1 copy for C)
  C  = sum_aux w_i l_i + sum h_j tau^j Z(tau)/delta + s A + r B_G1 - r s delta   (G1)
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from cuzk_engine import native
from cuzk_engine.backend import Backend, select_backend
from cuzk_engine.backend.cpu import CpuBackend, msm
from cuzk_engine.curve import G1Point, scalar
from cuzk_engine.errors import InvalidRequest
from cuzk_engine.field import MODULUS, int_to_limbs, ints_to_limbs, limbs_to_bytes, limbs_to_ints
from cuzk_engine.groth16.keys import Parameters
from cuzk_engine.native import msm as native_msm
from cuzk_engine.poly import Domain
from cuzk_engine.r1cs import ConstraintSystem

PROOF_BYTES = 192


@dataclass
class Synthesis:
    """A satisfied constraint system in the form the prover takes (one partition of a proof):
    picklable, so it can leave a synthesis worker process. ``circuit_id`` names the circuit,
    which must be the one the parameters were made for."""

    circuit_id: str
    partition: int
    public_inputs: list[int]
    witness: np.ndarray  # (num_variables, 4) uint64: ONE, public inputs, then private values
    a: np.ndarray  # (num_constraints, 4) uint64: A.w, B.w, C.w per constraint
    b: np.ndarray
    c: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_constraint_system(cls, cs: ConstraintSystem, circuit_id: str,
                               partition: int = 0) -> Synthesis:
        """A sealed constraint system's witness and A.w, B.w, C.w, checked satisfied: an
        unsatisfied one raises UnsatisfiedCircuit naming the first failing constraint."""
        synth = cls(
            circuit_id=circuit_id, partition=partition, public_inputs=cs.public_inputs,
            witness=ints_to_limbs(cs.values), a=ints_to_limbs(cs.a_vals),
            b=ints_to_limbs(cs.b_vals), c=ints_to_limbs(cs.c_vals),
        )
        lib = native.load()
        if lib is None or not np.array_equal(lib.mul_vec(synth.a, synth.b), synth.c):
            cs.raise_unsatisfied(cs.first_unsatisfied())  # names the first failing row
        return synth

    @property
    def num_constraints(self) -> int:
        return len(self.a)

    @property
    def nbytes(self) -> int:
        return self.witness.nbytes + self.a.nbytes + self.b.nbytes + self.c.nbytes


@dataclass
class PendingProof:
    """prove_start's output: G1 MSM results (affine LE x||y bytes) plus what finish needs."""

    circuit_id: str
    partition: int
    a_g1: bytes  # sum w_i u_i(tau) G1
    b_g1: bytes  # sum w_i v_i(tau) G1
    c_g1: bytes  # sum_aux w_i l_i + sum h_j H_j
    b_scalars: bytes  # witness values at the B-density indices, 32 bytes LE each
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return len(self.a_g1) + len(self.b_g1) + len(self.c_g1) + len(self.b_scalars)


def _check_shape(synth: Synthesis, params: Parameters) -> None:
    if synth.circuit_id != params.circuit_id:
        raise InvalidRequest(
            f"synthesis is for {synth.circuit_id} but the parameters are for {params.circuit_id}")
    if (len(synth.witness) != params.num_variables
            or synth.num_constraints != params.num_constraints
            or len(synth.public_inputs) + 1 != params.num_inputs):
        raise InvalidRequest(
            f"{synth.circuit_id}: circuit shape ({synth.num_constraints} constraints, "
            f"{len(synth.witness)} variables) does not match the parameters "
            f"({params.num_constraints}, {params.num_variables}); regenerate them with "
            f"`python -m cuzk_engine setup --force`")


def _padded(values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n, 4), dtype=np.uint64)
    out[:len(values)] = values
    return out


def compute_h(backend: Backend, synth: Synthesis, domain: Domain) -> np.ndarray:
    """Coefficients of h = (a*b - c) / Z: interpolate a, b, c on H, evaluate them on the coset
    g*H (where Z is the nonzero constant g^n - 1), divide, and interpolate back."""
    n = domain.size
    with ThreadPoolExecutor(max_workers=3) as pool:
        # the native NTTs release the GIL, so the three transforms run side by side
        coset_evals = list(pool.map(
            lambda v: backend.ntt(backend.ntt(_padded(v, n), inverse=True), coset=True),
            (synth.a, synth.b, synth.c)))
    a, b, c = coset_evals
    z_inv = domain.vanishing_on_coset_inv()
    native = getattr(backend, "native", None)
    if native is not None:
        quotient = native.abc_quotient(a, b, c, int_to_limbs(z_inv))
    else:
        quotient = ints_to_limbs(
            (x * y - z) * z_inv % MODULUS
            for x, y, z in zip(limbs_to_ints(a), limbs_to_ints(b), limbs_to_ints(c)))
    h = backend.ntt(quotient, inverse=True, coset=True)
    # deg(a*b - c) <= 2n - 2, so deg h <= n - 2: the top coefficient must vanish
    if h[n - 1].any():
        raise ArithmeticError("h has degree n - 1: a*b - c is not divisible by Z")
    return h[:n - 1]


def _h_msm(backend: Backend, synth: Synthesis, params: Parameters,
           timings: dict[str, float]) -> G1Point:
    t0 = time.perf_counter()
    h = compute_h(backend, synth, Domain(params.domain_log))
    timings["ntt_s"] = time.perf_counter() - t0
    return backend.msm_g1(params.h_query, h)


def _start(synth: Synthesis, params: Parameters, backend: Backend,
           pool: ThreadPoolExecutor) -> Callable[[], PendingProof]:
    """Submits H (NTTs, then its MSM) and the A, B-in-G1 and L MSMs to `pool`, in that order (all
    release the GIL); the returned call waits for them and assembles the PendingProof."""
    timings: dict[str, float] = {}
    w = synth.witness
    t0 = time.perf_counter()
    fut_h = pool.submit(_h_msm, backend, synth, params, timings)
    fut_a = pool.submit(backend.msm_g1, params.a_query, w[params.a_indices])
    fut_l = pool.submit(backend.msm_g1, params.l_query, w[params.num_inputs:])
    fut_b = pool.submit(backend.msm_g1, params.b_g1_query, w[params.b_indices])

    def finish() -> PendingProof:
        h_point, a_point, l_point, b_point = (f.result() for f in (fut_h, fut_a, fut_l, fut_b))
        timings["prove_start_s"] = time.perf_counter() - t0
        timings["g1_msm_s"] = timings["prove_start_s"] - timings["ntt_s"]
        return PendingProof(
            circuit_id=synth.circuit_id, partition=synth.partition,
            a_g1=a_point.to_xy_bytes_le(), b_g1=b_point.to_xy_bytes_le(),
            c_g1=(l_point + h_point).to_xy_bytes_le(),
            b_scalars=b"".join(limbs_to_bytes(w[params.b_indices])),
            timings=timings,
        )
    return finish


def prove_start(synth: Synthesis, params: Parameters, backend: Backend | None = None) -> PendingProof:
    _check_shape(synth, params)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return _start(synth, params, backend or select_backend("auto"), pool)()


def _b_g2_msm(params: Parameters, b_scalars: np.ndarray, threads: int | None = None):
    """The G2 MSM for B, on the CPU whatever the backend (the finalizer's part)."""
    return msm(params.b_g2_query, b_scalars, threads)


def _assemble(pending: PendingProof, params: Parameters, b_g2_sum) -> bytes:
    r = secrets.randbelow(MODULUS - 1) + 1
    s = secrets.randbelow(MODULUS - 1) + 1
    sr, ss = scalar(r), scalar(s)
    a = params.alpha_g1 + G1Point.from_xy_bytes_unchecked_le(pending.a_g1) + params.delta_g1 * sr
    b2 = params.beta_g2 + b_g2_sum + params.delta_g2 * ss
    b1 = params.beta_g1 + G1Point.from_xy_bytes_unchecked_le(pending.b_g1) + params.delta_g1 * ss
    c = (G1Point.from_xy_bytes_unchecked_le(pending.c_g1) + a * ss + b1 * sr
         - params.delta_g1 * scalar(r * s))
    return a.to_compressed_bytes() + b2.to_compressed_bytes() + c.to_compressed_bytes()


def prove_finish(pending: PendingProof, params: Parameters) -> bytes:
    if pending.circuit_id != params.circuit_id:
        raise InvalidRequest(
            f"pending proof is for {pending.circuit_id}, parameters for {params.circuit_id}")
    t0 = time.perf_counter()
    b_scalars = np.frombuffer(pending.b_scalars, dtype="<u8").reshape(-1, 4)
    b_g2_sum = _b_g2_msm(params, b_scalars)
    t1 = time.perf_counter()
    proof = _assemble(pending, params, b_g2_sum)
    pending.timings["g2_msm_s"] = t1 - t0
    pending.timings["finish_s"] = time.perf_counter() - t0
    return proof


def prove(synth: Synthesis, params: Parameters, backend: Backend | None = None) -> bytes:
    """prove_start + prove_finish as jobs for one worker per core, longest first: the G2 MSM
    for B (it needs only the witness), H, then the G1 MSMs. On the CPU backend each MSM then
    runs on one thread unless a count was chosen (the backend's, an engine's, CUZK_MSM_THREADS):
    whole MSMs side by side, one per core, cost less than each MSM split over the cores."""
    _check_shape(synth, params)
    backend = backend or select_backend("auto")
    g2_threads = None  # beside a GPU the G2 MSM has the cores to itself
    if isinstance(backend, CpuBackend):
        # against each MSM on every core, with the MSMs overlapped as they came: -3.5 % CPU and
        # -1.5 to -2.5 % wall for the whole `prove` at 2^14 and 2^16 (PROVER.md)
        g2_threads = backend.msm_threads or native_msm.chosen_threads() or 1
        backend = CpuBackend(msm_threads=g2_threads)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        t0 = time.perf_counter()
        fut_b2 = pool.submit(_b_g2_msm, params, synth.witness[params.b_indices], g2_threads)
        pending = _start(synth, params, backend, pool)()
        b_g2_sum = fut_b2.result()
        t1 = time.perf_counter()
    proof = _assemble(pending, params, b_g2_sum)
    pending.timings["finish_s"] = time.perf_counter() - t1
    pending.timings["prove_s"] = time.perf_counter() - t0
    synth.timings.update(pending.timings)
    return proof


__all__ = ["PROOF_BYTES", "PendingProof", "Synthesis", "prove", "prove_finish",
           "prove_start"]
