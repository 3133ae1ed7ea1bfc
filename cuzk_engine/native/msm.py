"""Native multi-core MSMs for G1 and G2 (msm_host.c), compiled on first use and loaded by ctypes.

Points cross as arkworks' uncompressed LE affine x||y bytes (96-byte G1, 192-byte G2, zeros for
infinity) and scalars as (n, 4) uint64 canonical limbs, the formats the parameter files and the
prover already hold, so a call converts nothing in Python. The C code spreads one MSM over
`threads` threads and runs with the GIL released (a ctypes call releases it).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from cuzk_engine.native import load_library

SOURCES = ("fr.h", "fp.h", "fp_x64.h", "fp2.h", "jacobian.h", "g1.h", "g2.h", "msm.h", "msm_cpu.h",
           "msm_host.c")
# no auto-vectorisation: it packs the carry-chain selects into vector moves, ~5% slower
CFLAGS = ("-O3", "-fno-tree-vectorize", "-march=native", "-shared", "-fPIC", "-std=c11", "-pthread")
COORD_BYTES = {"g1": 48, "g2": 96}
# the window widths msm_choose_window considers; forced ones must lie in the same range
MIN_WINDOW, MAX_WINDOW = 2, 20
# what an MSM reports about itself, in msm_host.c's MSM_STAT_* order
STATS = ("window", "windows", "general_scalars", "one_scalars", "bucket_additions",
         "reduction_additions", "doublings")



THREADS_ENV = "CUZK_MSM_THREADS"
# set by an engine for its process (its CPU split between MSM threads and synthesis processes)
_process_threads: int | None = None


def configured_threads() -> int | None:
    """CUZK_MSM_THREADS when set to a positive count (to leave cores to synthesis processes)."""
    configured = os.environ.get(THREADS_ENV, "")
    return int(configured) if configured.isdigit() and int(configured) > 0 else None


def set_process_threads(threads: int | None) -> None:
    """The threads every MSM of this process uses unless a call says otherwise (None: back to
    CUZK_MSM_THREADS or every core). The engine sets its share of the CPU here."""
    global _process_threads
    _process_threads = threads


def chosen_threads() -> int | None:
    """Threads per MSM as chosen for this process (its setting, else CUZK_MSM_THREADS), or None
    when nobody chose."""
    return _process_threads or configured_threads()


def default_threads() -> int:
    """Threads per MSM: the chosen count, else every core."""
    return chosen_threads() or max(1, os.cpu_count() or 1)


class NativeMsm:
    """sum_i scalars[i] * bases[i] in G1 or G2, on several threads."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        self._fns = {}
        for group in COORD_BYTES:
            fn = getattr(lib, f"{group}_msm")
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            self._fns[group] = fn

    def msm(self, group: str, xy: bytes, scalars: np.ndarray, *, threads: int | None = None,
            window: int = 0, stats: dict[str, int] | None = None) -> bytes:
        """The affine x||y bytes of the sum. window=0 picks the window width from the size;
        `stats`, when given, is filled with the STATS counts of this call."""
        point_bytes = 2 * COORD_BYTES[group]
        n = len(xy) // point_bytes
        if len(xy) != n * point_bytes:
            raise ValueError(f"{group} bases: {len(xy)} bytes is not a multiple of {point_bytes}")
        scalars = np.ascontiguousarray(scalars, dtype=np.uint64)
        if scalars.shape != (n, 4):
            raise ValueError(f"MSM length mismatch: {n} points, scalars of shape {scalars.shape}")
        if window and not MIN_WINDOW <= window <= MAX_WINDOW:
            raise ValueError(f"window {window}: expected 0 (automatic) or "
                             f"{MIN_WINDOW}..{MAX_WINDOW}")
        out = ctypes.create_string_buffer(point_bytes)
        counts = np.zeros(len(STATS), dtype=np.int64)
        # c_char_p hands C the bytes object's own buffer: no copy of the bases
        rc = self._fns[group](out, ctypes.c_char_p(bytes(xy)), scalars.ctypes.data, n, window,
                              threads or default_threads(), counts.ctypes.data)
        if rc != 0:
            raise MemoryError(f"native {group} MSM of {n} points could not allocate its tables")
        if stats is not None:
            stats.update(zip(STATS, (int(x) for x in counts)))
        return out.raw


DISABLE_ENV = "CUZK_NATIVE_MSM"


def load() -> NativeMsm | None:
    """The compiled MSMs, building them on first use; None when no C compiler works, or when
    CUZK_NATIVE_MSM=0 asks for the arkworks MSMs (the benchmarks' same-run baseline)."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    return load_library("msm_host.c", SOURCES, CFLAGS, "cuzk_msm", NativeMsm)
