"""Native CPU kernels over Fr: `fr.h` + `ntt_host.c`, compiled on first use and loaded by ctypes.

The shared library is built with the system C compiler into a cache directory keyed by a hash
of the sources and flags, so an edited header never loads a stale build. When no compiler is
available `load()` returns None and callers use the pure-Python fallbacks in `cuzk_engine.poly`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import numpy as np

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("fr.h", "ntt_host.c")
CFLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c11")
T = TypeVar("T")

_lock = threading.Lock()
# One build per (compiler, library): None where the build or the load failed.
_loaded: dict[tuple[str, str], object] = {}


def cache_dir() -> Path:
    configured = os.environ.get("CUZK_NATIVE_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "cuzk_engine" / "native"


def _find_compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build_library(compiler: str, main: str, sources: tuple[str, ...],
                  cflags: tuple[str, ...], prefix: str) -> Path:
    """Compile `main` (which includes `sources`) into the cache, once per content and flags;
    OSError (with the compiler's messages) when the build fails.

    The file name carries a hash of every source and of the command, so an edited header never
    loads a stale build; the build goes to a temporary name and is renamed into place, so a
    concurrent or interrupted build never leaves a half-written library behind.
    """
    digest = hashlib.sha256()
    for name in sources:
        digest.update((SOURCE_DIR / name).read_bytes())
    digest.update(" ".join((compiler, *cflags)).encode())
    target = cache_dir() / f"{prefix}_{digest.hexdigest()[:16]}.so"
    if not target.exists():
        # imported here: nearly every process finds its library built, and these imports
        # cost ~3 ms of each one-shot `prove`
        import subprocess
        import tempfile

        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            try:
                subprocess.run([compiler, *cflags, "-I", str(SOURCE_DIR), "-o", str(out),
                                str(SOURCE_DIR / main)], check=True, capture_output=True)
            except subprocess.CalledProcessError as exc:
                raise OSError(f"{compiler} could not build {main}: "
                              f"{exc.stderr.decode(errors='replace')[-2000:]}") from exc
            os.replace(out, target)
    return target


_ARR = np.ctypeslib.ndpointer(dtype=np.uint64, flags="C_CONTIGUOUS")


class NativeFr:
    """Typed wrappers around the compiled kernels; every array is (n, 4) uint64 canonical."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        self._lib = lib
        lib.fr_ntt.argtypes = [_ARR, ctypes.c_int, _ARR]
        lib.fr_ntt.restype = ctypes.c_int
        lib.fr_scale.argtypes = [_ARR, ctypes.c_int64, _ARR]
        lib.fr_scale.restype = None
        lib.fr_scale_powers.argtypes = [_ARR, ctypes.c_int64, _ARR]
        lib.fr_scale_powers.restype = None
        lib.fr_abc_quotient.argtypes = [_ARR, _ARR, _ARR, _ARR, ctypes.c_int64, _ARR]
        lib.fr_abc_quotient.restype = None
        lib.fr_mul_vec.argtypes = [_ARR, _ARR, _ARR, ctypes.c_int64]
        lib.fr_mul_vec.restype = None
        lib.fr_poseidon_trace.argtypes = [_ARR, ctypes.c_int64, _ARR, _ARR, _ARR, ctypes.c_int,
                                          ctypes.c_int, ctypes.c_int]
        lib.fr_poseidon_trace.restype = ctypes.c_int64

    def ntt_inplace(self, values: np.ndarray, log_n: int, omega: np.ndarray) -> None:
        if self._lib.fr_ntt(values, log_n, omega) != 0:
            raise MemoryError("native NTT could not allocate its twiddle table")

    def scale_inplace(self, values: np.ndarray, c: np.ndarray) -> None:
        self._lib.fr_scale(values, len(values), c)

    def scale_powers_inplace(self, values: np.ndarray, g: np.ndarray) -> None:
        self._lib.fr_scale_powers(values, len(values), g)

    def abc_quotient(self, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                     z: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self._lib.fr_abc_quotient(out, a, b, c, len(a), z)
        return out

    def mul_vec(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self._lib.fr_mul_vec(out, a, b, len(a))
        return out

    def poseidon_trace(self, state: np.ndarray, constants: np.ndarray, mds: np.ndarray,
                       full_rounds: int, partial_rounds: int, compact_every: int,
                       length: int) -> np.ndarray:
        """One width-3 Poseidon permutation's trace (see fr_poseidon_trace), `length` rows."""
        out = np.empty((length, 4), dtype=np.uint64)
        written = self._lib.fr_poseidon_trace(out, length, state, constants, mds, full_rounds,
                                               partial_rounds, compact_every)
        if written != length:
            raise ValueError(f"the Poseidon trace has {written} rows, not {length}")
        return out


def load_library(main: str, sources: tuple[str, ...], cflags: tuple[str, ...], name: str,
                 wrap: Callable[[ctypes.CDLL, Path], T]) -> T | None:
    """Build `main` (once per compiler and process) and wrap the loaded library; None when no
    C compiler works or the build fails, so callers fall back to arkworks."""
    compiler = _find_compiler()
    if compiler is None:
        return None
    with _lock:
        key = (compiler, name)
        if key not in _loaded:
            try:
                target = build_library(compiler, main, sources, cflags, name)
                _loaded[key] = wrap(ctypes.CDLL(str(target)), target)
            except OSError:
                _loaded[key] = None
        return cast("T | None", _loaded[key])


def load() -> NativeFr | None:
    """The compiled kernels, building them on first use; None when no C compiler works."""
    return load_library("ntt_host.c", SOURCES, CFLAGS, "cuzk_fr", NativeFr)
