"""Groth16 over BLS12-381: test setup, split prover, verifier, parameter cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cuzk_engine import circuits
from cuzk_engine.errors import ParameterFileError
from cuzk_engine.groth16 import setup as _setup
from cuzk_engine.groth16.keys import (
    NOT_TRUSTED,
    Parameters,
    VerifyingKey,
    load_parameter_files,
    parameter_paths,
    read_header,
)
from cuzk_engine.groth16.prover import (
    PROOF_BYTES,
    PendingProof,
    Synthesis,
    prove,
    prove_finish,
    prove_start,
)
from cuzk_engine.groth16.verifier import split_proofs, verify, verify_partitions


def ensure_parameters(param_cache: Path, kind: str, profile: str,
                      progress: Callable[[int, int], None] | None = None,
                      force: bool = False) -> None:
    """Run the seeded test setup when the files are missing (or `force`), else check the
    .params header and size; progress(done, total) counts scalar multiplications."""
    cid = circuits.circuit_id(kind, profile)
    params_path, vk_path = parameter_paths(Path(param_cache), cid)
    if not force and params_path.exists() and vk_path.exists():
        read_header(params_path, cid)
        return
    _setup.generate(Path(param_cache), kind, profile, progress)


def load_parameters(param_cache: Path, circuit_id: str) -> Parameters:
    circuits.parse_circuit_id(circuit_id)
    return load_parameter_files(Path(param_cache), circuit_id)


def parameters_file_bytes(param_cache: Path, circuit_id: str) -> int:
    params_path, vk_path = parameter_paths(Path(param_cache), circuit_id)
    try:
        return params_path.stat().st_size + vk_path.stat().st_size
    except FileNotFoundError as exc:
        raise ParameterFileError(f"{exc.filename}: missing") from None


__all__ = [
    "NOT_TRUSTED", "PROOF_BYTES", "Parameters", "PendingProof", "Synthesis", "VerifyingKey",
    "ensure_parameters", "load_parameters", "parameter_paths", "parameters_file_bytes",
    "prove", "prove_finish", "prove_start", "split_proofs", "verify",
    "verify_partitions",
]
