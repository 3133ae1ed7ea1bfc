"""The prover stages the engine drives, injectable so scheduling tests can use fast stand-ins.

The default is the real prover (cuzk_engine.groth16 / circuits); it is imported lazily so the
scheduling layers load without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Stages:
    synthesize: Callable[[str, str, int, int], Any]  # module-level: runs in a process pool
    prove_start: Callable[..., Any]  # (synth, params, backend) -> pending
    prove_finish: Callable[[Any, Any], bytes]
    verify: Callable[[Any, list[int], bytes], bool]  # (vk, public_inputs, proof)
    ensure_parameters: Callable[[Path, str, str], None]
    load_parameters: Callable[[Path, str], Any]
    parameters_file_bytes: Callable[[Path, str], int]
    circuit_id: Callable[[str, str], str]
    partition_count: Callable[[str, str], int]
    working_set_bytes: Callable[[str, str], int]
    select_backend: Callable[[str], Any]
    kinds: tuple[str, ...]
    profiles: tuple[str, ...]
    max_seed: int
    name: str = "real"

    def circuit_lookup(self, circuit: str) -> tuple[str, str] | None:
        """(kind, profile) of a circuit id, or None if no such circuit exists."""
        for kind in self.kinds:
            for profile in self.profiles:
                if self.circuit_id(kind, profile) == circuit:
                    return kind, profile
        return None


def real_stages() -> Stages:
    from cuzk_engine import circuits, groth16
    from cuzk_engine.backend import select_backend

    return Stages(
        synthesize=groth16.synthesize,
        prove_start=groth16.prove_start,
        prove_finish=groth16.prove_finish,
        verify=groth16.verify,
        ensure_parameters=groth16.ensure_parameters,
        load_parameters=groth16.load_parameters,
        parameters_file_bytes=groth16.parameters_file_bytes,
        circuit_id=circuits.circuit_id,
        partition_count=circuits.partition_count,
        working_set_bytes=circuits.working_set_bytes,
        select_backend=select_backend,
        kinds=tuple(circuits.KINDS),
        profiles=tuple(circuits.PROFILES),
        max_seed=circuits.MAX_SEED,
    )
