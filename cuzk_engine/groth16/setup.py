"""Seeded Groth16 setup: NOT A TRUSTED SETUP, test parameters only.

The toxic waste (tau, alpha, beta, gamma, delta) is derived from the circuit id, so anyone can
recompute it: these parameters prove nothing to a third party and exist to exercise a real
prover. The expensive part is hundreds of thousands of fixed-base scalar multiplications; they
use windowed tables (`cuzk_engine.curve.FixedBase`) spread over worker processes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cuzk_engine.curve import FixedBase, G1Point, G2Point
from cuzk_engine.field import MODULUS, inverse
from cuzk_engine.groth16.keys import (
    SECTIONS,
    ParamsHeader,
    VerifyingKey,
    write_parameter_files,
)
from cuzk_engine.poly import Domain
from cuzk_engine.r1cs import ConstraintSystem

CHUNK = 4096
# below this many multiplications, worker start-up costs more than it saves
PARALLEL_THRESHOLD = 3 * CHUNK

_tables: dict[str, FixedBase] = {}


def _table(group: str) -> FixedBase:
    if group not in _tables:
        _tables[group] = FixedBase(G1Point() if group == "g1" else G2Point())
    return _tables[group]


def _multiply_chunk(group: str, scalars: list[int]) -> bytes:
    return _table(group).mul_many_xy(scalars)


def _toxic_waste(cid: str, domain: Domain) -> tuple[int, int, int, int, int]:
    def draw(label: str) -> int:
        counter = 0
        while True:
            digest = hashlib.blake2b(f"cuzk test setup|{cid}|{label}|{counter}".encode(),
                                     digest_size=64).digest()
            value = int.from_bytes(digest, "little") % MODULUS
            if value and (label != "tau" or domain.vanishing_at(value)):
                return value
            counter += 1

    return draw("tau"), draw("alpha"), draw("beta"), draw("gamma"), draw("delta")


def _multiply_all(jobs: list[tuple[str, str, list[int]]],
                  progress: Callable[[int, int], None] | None) -> dict[str, bytes]:
    """jobs: (section, group, scalars) -> {section: concatenated xy bytes}."""
    chunks = [(section, group, scalars[i:i + CHUNK])
              for section, group, scalars in jobs for i in range(0, max(len(scalars), 1), CHUNK)]
    total = sum(len(s) for _, _, s in chunks)
    done = 0
    results: dict[int, bytes] = {}
    if progress:
        progress(0, total)
    workers = min(os.cpu_count() or 1, 4)
    if total < PARALLEL_THRESHOLD or workers < 2:
        for i, (_, group, scalars) in enumerate(chunks):
            results[i] = _multiply_chunk(group, scalars)
            done += len(scalars)
            if progress:
                progress(done, total)
    else:
        # imported here, as a prover never needs them; spawn, not fork: the caller may be a
        # multi-threaded engine process
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_multiply_chunk, group, scalars): (i, len(scalars))
                       for i, (_, group, scalars) in enumerate(chunks)}
            for future in as_completed(futures):
                i, count = futures[future]
                results[i] = future.result()
                done += count
                if progress:
                    progress(done, total)
    out: dict[str, list[bytes]] = {}
    for i, (section, _, _) in enumerate(chunks):
        out.setdefault(section, []).append(results[i])
    return {section: b"".join(parts) for section, parts in out.items()}


def generate(param_cache: Path, cid: str, cs: ConstraintSystem,
             progress: Callable[[int, int], None] | None = None) -> None:
    """Run the test setup for the circuit `cs` (built with its matrices; any witness) and write
    <cid>.params and <cid>.vk atomically."""
    num_vars, num_inputs = cs.num_variables, cs.num_inputs
    domain = Domain.for_size(cs.num_constraints)
    tau, alpha, beta, gamma, delta = _toxic_waste(cid, domain)

    # u_i = A_i(tau), v_i = B_i(tau), w_i = C_i(tau): the QAP polynomials at tau, through the
    # Lagrange basis of the constraint domain.
    lagrange = domain.lagrange_at(tau)
    u, v, w = [0] * num_vars, [0] * num_vars, [0] * num_vars
    for matrix, acc in ((cs.a, u), (cs.b, v), (cs.c, w)):
        for lc, lj in zip(matrix, lagrange):
            for var, coeff in lc.items():
                acc[var] += coeff * lj
    in_a, in_b = cs.density()
    a_indices = [i for i in range(num_vars) if in_a[i]]
    b_indices = [i for i in range(num_vars) if in_b[i]]

    gamma_inv, delta_inv = inverse(gamma), inverse(delta)
    combined = [(beta * u[i] + alpha * v[i] + w[i]) % MODULUS for i in range(num_vars)]
    z_tau = domain.vanishing_at(tau)
    h_scalars = []
    term = z_tau * delta_inv % MODULUS  # tau^j Z(tau) / delta
    for _ in range(domain.size - 1):
        h_scalars.append(term)
        term = term * tau % MODULUS

    jobs: list[tuple[str, str, list[int]]] = [
        ("alpha_g1", "g1", [alpha]), ("beta_g1", "g1", [beta]), ("delta_g1", "g1", [delta]),
        ("beta_g2", "g2", [beta]), ("delta_g2", "g2", [delta]), ("gamma_g2", "g2", [gamma]),
        ("ic", "g1", [c * gamma_inv % MODULUS for c in combined[:num_inputs]]),
        ("a_query", "g1", [u[i] % MODULUS for i in a_indices]),
        ("b_g1_query", "g1", [v[i] % MODULUS for i in b_indices]),
        ("b_g2_query", "g2", [v[i] % MODULUS for i in b_indices]),
        ("l_query", "g1", [c * delta_inv % MODULUS for c in combined[num_inputs:]]),
        ("h_query", "g1", h_scalars),
    ]
    points = _multiply_all(jobs, progress)

    def g1s(section: str) -> list:
        raw = points[section]
        return [G1Point.from_xy_bytes_unchecked_le(raw[i:i + 96]) for i in range(0, len(raw), 96)]

    vk = VerifyingKey(
        g1s("alpha_g1")[0],
        G2Point.from_xy_bytes_unchecked_le(points["beta_g2"]),
        G2Point.from_xy_bytes_unchecked_le(points["gamma_g2"]),
        G2Point.from_xy_bytes_unchecked_le(points["delta_g2"]),
        g1s("ic"),
    )
    vk_bytes = vk.to_bytes()
    points["a_indices"] = np.asarray(a_indices, dtype="<u4").tobytes()
    points["b_indices"] = np.asarray(b_indices, dtype="<u4").tobytes()
    body = b"".join(points[name] for name, _ in SECTIONS)
    counts = {name: len(points[name]) // size for name, size in SECTIONS}
    header = ParamsHeader(
        circuit_id=cid, num_variables=num_vars, num_inputs=num_inputs,
        num_constraints=cs.num_constraints, domain_log=domain.log_n, counts=counts,
        body_sha256=hashlib.sha256(body).hexdigest(),
        vk_sha256=hashlib.sha256(vk_bytes).hexdigest(),
    )
    write_parameter_files(param_cache, header, body, vk_bytes)
