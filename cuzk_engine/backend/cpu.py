"""The CPU backend: native C NTTs and multi-core MSMs, with pure-Python NTTs and arkworks MSMs
where no C compiler exists.

All of them release the GIL (ctypes foreign calls and arkworks' Rust code), so the prover runs
independent transforms and MSMs in threads; each native MSM also spreads itself over
`msm_threads` threads.
"""

from __future__ import annotations

import numpy as np

from cuzk_engine import native
from cuzk_engine.curve import G1Bases, G2Bases, msm_g1, msm_g2, scalars_from_le_bytes
from cuzk_engine.field import (
    GENERATOR,
    int_to_limbs,
    ints_to_limbs,
    inverse,
    limbs_to_bytes,
    limbs_to_ints,
    root_of_unity,
)
from cuzk_engine.native import msm as native_msm
from cuzk_engine.poly import transform_python


def _log2_exact(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"NTT size {n} is not a power of two")
    return n.bit_length() - 1


def msm(bases: G1Bases | G2Bases, scalars: np.ndarray, threads: int | None = None):
    """sum_i scalars[i] * bases[i] (scalars (n, 4) uint64 canonical LE limbs) as an arkworks
    point: natively on `threads` threads (default: every core), else through arkworks."""
    lib = native_msm.load()
    if lib is None:
        arkworks = msm_g1 if bases.group == "g1" else msm_g2
        return arkworks(bases.points, scalars_from_le_bytes(limbs_to_bytes(scalars)))
    return bases.point_type.from_xy_bytes_unchecked_le(
        lib.msm(bases.group, bases.xy, scalars, threads=threads))


class CpuBackend:
    name = "cpu"

    def __init__(self, msm_threads: int | None = None) -> None:
        self.native = native.load()
        self.msm_threads = msm_threads

    def ntt(self, values: np.ndarray, *, inverse: bool = False,
            coset: bool = False) -> np.ndarray:
        log_n = _log2_exact(len(values))
        if self.native is None:
            out = transform_python(limbs_to_ints(values), log_n, inverse_=inverse, coset=coset)
            return ints_to_limbs(out)
        return _native_transform(self.native, values, log_n, inverse, coset)

    def msm_g1(self, bases: G1Bases, scalars: np.ndarray):
        return msm(bases, scalars, self.msm_threads)


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
