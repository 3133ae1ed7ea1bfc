"""Groth16 verification: e(A, B) = e(alpha, beta) e(IC(x), gamma) e(C, delta), checked as one
multi-pairing with a shared final exponentiation."""

from __future__ import annotations

from cuzk_engine.curve import (
    G1_COMPRESSED,
    G2_COMPRESSED,
    G1Point,
    G2Point,
    g1_from_compressed,
    g2_from_compressed,
    msm_g1,
    pairing_check,
    scalar,
)
from cuzk_engine.errors import ProofFormatError
from cuzk_engine.field import MODULUS
from cuzk_engine.groth16.keys import VerifyingKey

PROOF_BYTES = G1_COMPRESSED + G2_COMPRESSED + G1_COMPRESSED


def parse_proof(proof: bytes) -> tuple[G1Point, G2Point, G1Point]:
    if not isinstance(proof, bytes | bytearray) or len(proof) != PROOF_BYTES:
        size = len(proof) if isinstance(proof, bytes | bytearray) else type(proof).__name__
        raise ProofFormatError(f"a partition proof is {PROOF_BYTES} bytes, got {size}")
    a = g1_from_compressed(proof[:G1_COMPRESSED], "proof A")
    b = g2_from_compressed(proof[G1_COMPRESSED:G1_COMPRESSED + G2_COMPRESSED], "proof B")
    c = g1_from_compressed(proof[G1_COMPRESSED + G2_COMPRESSED:], "proof C")
    return a, b, c


def check_public_inputs(vk: VerifyingKey, public_inputs: list[int]) -> None:
    if len(public_inputs) != vk.num_public_inputs:
        raise ProofFormatError(
            f"expected {vk.num_public_inputs} public inputs, got {len(public_inputs)}")
    for i, x in enumerate(public_inputs):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < MODULUS:
            raise ProofFormatError(f"public input {i} is not a field element (0 <= x < r): {x!r}")


def verify(vk: VerifyingKey, public_inputs: list[int], proof: bytes) -> bool:
    check_public_inputs(vk, public_inputs)
    a, b, c = parse_proof(proof)
    ic = vk.ic[0] + msm_g1(vk.ic[1:], [scalar(x) for x in public_inputs])
    return pairing_check([-a, vk.alpha_g1, ic, c], [b, vk.beta_g2, vk.gamma_g2, vk.delta_g2])


def split_proofs(blob: bytes, partitions: int) -> list[bytes]:
    """A multi-partition proof is its partition proofs concatenated in index order."""
    if len(blob) != partitions * PROOF_BYTES:
        raise ProofFormatError(
            f"expected {partitions} x {PROOF_BYTES} = {partitions * PROOF_BYTES} bytes of proof, "
            f"got {len(blob)}")
    return [blob[i * PROOF_BYTES:(i + 1) * PROOF_BYTES] for i in range(partitions)]


def verify_partitions(vk: VerifyingKey, public_inputs: list[list[int]], blob: bytes) -> list[bool]:
    """One result per partition; every one must be True for the proof to be valid."""
    proofs = split_proofs(blob, len(public_inputs))
    return [verify(vk, inputs, proof) for inputs, proof in zip(public_inputs, proofs)]
