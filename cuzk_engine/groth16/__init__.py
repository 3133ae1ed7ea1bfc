"""Groth16 over BLS12-381: test setup, split prover, verifier, parameter cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cuzk_engine.errors import ParameterFileError
from cuzk_engine.groth16.keys import (
    NOT_TRUSTED,
    Parameters,
    VerifyingKey,
    load_parameter_files,
    parameter_paths,
    parameters_from_files,
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
from cuzk_engine.r1cs import ConstraintSystem


def ensure_parameters(param_cache: Path, circuit_id: str,
                      constraint_system: Callable[[], ConstraintSystem],
                      progress: Callable[[int, int], None] | None = None,
                      force: bool = False) -> None:
    """Run the seeded test setup for the circuit `constraint_system()` builds when its files are
    missing (or `force`), else check the .params header and size; progress(done, total) counts
    scalar multiplications. The circuit is built only when a setup runs."""
    params_path, vk_path = parameter_paths(Path(param_cache), circuit_id)
    if not force and params_path.exists() and vk_path.exists():
        read_header(params_path, circuit_id)
        return
    # imported only when a setup runs: a `prove` with cached parameters never needs it
    from cuzk_engine.groth16.setup import generate

    generate(Path(param_cache), circuit_id, constraint_system(), progress)


def load_parameters(param_cache: Path, circuit_id: str) -> Parameters:
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
    "parameters_from_files",
    "prove", "prove_finish", "prove_start", "split_proofs", "verify",
    "verify_partitions",
]
