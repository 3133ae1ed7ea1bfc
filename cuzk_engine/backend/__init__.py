"""Compute backends for the prover's heavy steps (NTTs and G1 MSMs).

`prove_start` talks only to this interface, so a GPU backend (`cuda:<ordinal>`) can replace
the CPU one without touching the prover. Interchange formats: Fr vectors are (n, 4) uint64
arrays of canonical little-endian limbs; MSM bases are `cuzk_engine.curve.G1Bases` (arkworks
points plus their affine LE x||y bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from cuzk_engine.errors import InvalidRequest

if TYPE_CHECKING:
    from cuzk_engine.curve import G1Bases, G1Point


@runtime_checkable
class Backend(Protocol):
    name: str

    def ntt(self, values: np.ndarray, *, inverse: bool = False,
            coset: bool = False) -> np.ndarray:
        """values: (n, 4) uint64 canonical LE limbs, n a power of two. coset=True evaluates on
        g*H (g = 7); inverse=True with coset=True inverts that."""
        ...

    def msm_g1(self, bases: G1Bases, scalars: np.ndarray) -> G1Point:
        """sum_i scalars[i] * bases[i]; scalars (n, 4) uint64 canonical LE limbs."""
        ...


def _cuda_backend(name: str) -> Backend:
    """The CUDA backend; raises InvalidRequest saying why it is not usable here."""
    from cuzk_engine.backend import cuda

    try:
        ordinal = int(name.split(":", 1)[1]) if ":" in name else 0
        return cuda.CudaBackend.create(ordinal)
    except (RuntimeError, OSError, ValueError) as exc:  # no cupy/driver/device, bad ordinal
        raise InvalidRequest(f"backend {name!r} is not usable on this machine: {exc}") from None


def select_backend(name: str = "auto") -> Backend:
    """"cpu", "cuda" / "cuda:<n>", or "auto" (CUDA when usable, else CPU)."""
    from cuzk_engine.backend.cpu import CpuBackend

    if name == "cpu":
        return CpuBackend()
    if name == "auto":
        try:
            return _cuda_backend("cuda")
        except InvalidRequest:
            return CpuBackend()
    if name == "cuda" or name.startswith("cuda:"):
        return _cuda_backend(name)
    raise InvalidRequest(f"unknown backend {name!r} (expected cpu, cuda, cuda:<n> or auto)")
