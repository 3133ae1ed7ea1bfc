"""The prover stages the engine drives, injectable so scheduling tests can use fast stand-ins.

The default is the real prover: the circuits (cuzk_engine.circuits) build each partition's
constraint system, which the proof system (cuzk_engine.groth16) proves without knowing which
circuit it is. Both are imported lazily so the scheduling layers load without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuzk_engine.groth16 import Synthesis


@dataclass(frozen=True)
class Stages:
    synthesize: Callable[[str, str, int, int], Any]  # module-level: runs in a process pool
    prove_start: Callable[..., Any]  # (synth, params, backend) -> pending
    prove_finish: Callable[[Any, Any], bytes]
    verify: Callable[[Any, list[int], bytes], bool]  # (vk, public_inputs, proof)
    # (param_cache, kind, profile, progress=None): progress(done, total) while a setup runs
    ensure_parameters: Callable[..., None]
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


def synthesize(kind: str, profile: str, seed: int, partition: int) -> Synthesis:
    """The real synthesis stage: one partition of the (kind, profile) circuit with the witness
    of ``seed``, in the form the prover takes. Module-level, so a process pool can run it."""
    from cuzk_engine import circuits
    from cuzk_engine.groth16 import Synthesis

    start = time.perf_counter()
    cs = circuits.build(kind, profile, seed, partition, matrices=False)
    synth = Synthesis.from_constraint_system(cs, circuits.circuit_id(kind, profile), partition)
    synth.timings["synthesize_s"] = time.perf_counter() - start
    return synth


def ensure_parameters(param_cache: Path, kind: str, profile: str,
                      progress: Callable[[int, int], None] | None = None,
                      force: bool = False) -> None:
    """The (kind, profile) circuit's parameter files, set up from its constraint system when
    missing (or `force`), else checked."""
    from cuzk_engine import circuits, groth16

    groth16.ensure_parameters(param_cache, circuits.circuit_id(kind, profile),
                              lambda: circuits.build(kind, profile, 0, 0), progress, force)


def load_parameters(param_cache: Path, circuit_id: str) -> Any:
    """A known circuit's parameters; an unknown id is refused before any file is opened."""
    from cuzk_engine import circuits, groth16

    circuits.parse_circuit_id(circuit_id)
    return groth16.load_parameters(param_cache, circuit_id)


def real_stages() -> Stages:
    from cuzk_engine import circuits, groth16
    from cuzk_engine.backend import select_backend
    from cuzk_engine.vocabulary import KINDS, PROFILES

    return Stages(
        synthesize=synthesize,
        prove_start=groth16.prove_start,
        prove_finish=groth16.prove_finish,
        verify=groth16.verify,
        ensure_parameters=ensure_parameters,
        load_parameters=load_parameters,
        parameters_file_bytes=groth16.parameters_file_bytes,
        circuit_id=circuits.circuit_id,
        partition_count=circuits.partition_count,
        working_set_bytes=circuits.working_set_bytes,
        select_backend=select_backend,
        kinds=KINDS,
        profiles=PROFILES,
        max_seed=circuits.MAX_SEED,
    )
