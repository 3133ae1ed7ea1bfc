"""The dashboard's own check of a returned proof, independent of the engine's self-check."""

from __future__ import annotations

from cuzk_engine.errors import ProofFormatError
from cuzk_engine.groth16 import PROOF_BYTES, VerifyingKey, verify_partitions
from vastmgr.lib.errors import VerificationError


def reverify(vk: dict | None, public_inputs: object, proof: bytes) -> bool:
    """True when every 192-byte partition proof verifies against its public inputs.

    `public_inputs` is one list of field elements per partition (a flat list is accepted for
    a one-partition proof); elements may be JSON integers or decimal/0x strings.
    """
    if vk is None:
        raise VerificationError("the verifying key is missing")
    if not proof or len(proof) % PROOF_BYTES:
        raise VerificationError(f"proof is {len(proof)} bytes, not a multiple of {PROOF_BYTES}")
    if not isinstance(public_inputs, list):
        raise VerificationError("public inputs are missing")
    if not public_inputs or not isinstance(public_inputs[0], list):
        public_inputs = [public_inputs]
    try:
        inputs = [[_element(x) for x in partition] for partition in public_inputs]
        key = VerifyingKey.from_json(vk)
        return all(verify_partitions(key, inputs, proof))
    except (ProofFormatError, KeyError, TypeError, ValueError) as exc:
        raise VerificationError(str(exc)) from exc


def _element(value) -> int:
    if isinstance(value, str):
        return int(value, 0)
    return value
