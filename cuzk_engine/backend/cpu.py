"""The CPU backend: native C NTTs (pure Python when no compiler) and arkworks MSMs.

Both release the GIL (ctypes foreign calls and arkworks' Rust code), so the prover runs
independent transforms and MSMs in threads and uses both cores.
"""

from __future__ import annotations

import numpy as np

from cuzk_engine import native
from cuzk_engine.curve import G1Bases, msm_g1, scalars_from_le_bytes
from cuzk_engine.field import (
    GENERATOR,
    int_to_limbs,
    ints_to_limbs,
    inverse,
    limbs_to_bytes,
    limbs_to_ints,
    root_of_unity,
)
from cuzk_engine.poly import transform_python


def _log2_exact(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"NTT size {n} is not a power of two")
    return n.bit_length() - 1


class CpuBackend:
    name = "cpu"

    def __init__(self) -> None:
        self.native = native.load()

    def ntt(self, values: np.ndarray, *, inverse: bool = False,
            coset: bool = False) -> np.ndarray:
        log_n = _log2_exact(len(values))
        if self.native is None:
            out = transform_python(limbs_to_ints(values), log_n, inverse_=inverse, coset=coset)
            return ints_to_limbs(out)
        return _native_transform(self.native, values, log_n, inverse, coset)

    def msm_g1(self, bases: G1Bases, scalars: np.ndarray):
        return msm_g1(bases.points, scalars_from_le_bytes(limbs_to_bytes(scalars)))


def _native_transform(lib: native.NativeFr, values: np.ndarray, log_n: int,
                      inverse_: bool, coset: bool) -> np.ndarray:
    out = np.array(values, dtype=np.uint64, order="C", copy=True)
    omega = root_of_unity(log_n)
    if not inverse_:
        if coset:
            lib.scale_powers_inplace(out, int_to_limbs(GENERATOR))
        lib.ntt_inplace(out, log_n, int_to_limbs(omega))
        return out
    lib.ntt_inplace(out, log_n, int_to_limbs(inverse(omega)))
    lib.scale_inplace(out, int_to_limbs(inverse(1 << log_n)))
    if coset:
        lib.scale_powers_inplace(out, int_to_limbs(inverse(GENERATOR)))
    return out
