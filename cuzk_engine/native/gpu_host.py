"""Host build of the GPU kernels (gpu_host.c = ntt.cu + msm.cu + Fp/G1 entry points), via ctypes.

It exists for verification without a GPU: tests run the kernels' per-thread bodies and the
shared drivers in cuzk_engine.native.gpu_driver on the CPU and compare with arkworks and the
CPU backend. Built with the system C compiler into the same cache as the CPU kernels, keyed by
a hash of every source file it includes.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from cuzk_engine.errors import CompilerUnavailable
from cuzk_engine.native import _find_compiler, build_library
from cuzk_engine.native.gpu_driver import KERNEL_SIGNATURES

SOURCES = ("fr.h", "fp.h", "jacobian.h", "g1.h", "msm.h", "ntt_gpu.h", "launch.h", "ntt.cu", "msm.cu",
           "gpu_host.c")
CFLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
_CTYPES = {"p": ctypes.c_void_p, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}
ELEMENTWISE = ("fp_mul_vec", "fp_add_vec", "fp_sub_vec", "fp_to_mont_vec", "fp_from_mont_vec",
               "fp_neg_vec", "g1_add_vec", "g1_add_mixed_vec", "g1_dbl_vec", "g1_mul_small_vec")

_lock = threading.Lock()
_loaded: dict[str, HostKernels] = {}


def _pointer(array: np.ndarray) -> ctypes.c_void_p:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise TypeError("kernel arguments must be C-contiguous numpy arrays")
    return ctypes.c_void_p(array.ctypes.data)


class HostKernels:
    """A KernelRunner over the host build, plus element-wise Fp/G1 operations for tests."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        for name, params in KERNEL_SIGNATURES.items():
            fn = getattr(lib, f"{name}_all")
            fn.argtypes = [_CTYPES[p] for p in params] + [ctypes.c_uint64]
            fn.restype = None

    def __call__(self, name: str, count: int, *args) -> None:
        params = KERNEL_SIGNATURES[name]
        if len(args) != len(params):
            raise TypeError(f"{name} takes {len(params)} arguments, got {len(args)}")
        converted = [_pointer(a) if p == "p" else int(a) for p, a in zip(params, args)]
        getattr(self._lib, f"{name}_all")(*converted, count)

    def elementwise(self, name: str, out: np.ndarray, *inputs: np.ndarray) -> np.ndarray:
        """out[i] = op(inputs[0][i], ...) for the Fp/G1 test entry points in ELEMENTWISE."""
        if name not in ELEMENTWISE:
            raise ValueError(f"unknown element-wise operation {name!r}")
        fn = getattr(self._lib, name)
        fn.restype = None
        fn(_pointer(out), *(_pointer(a) for a in inputs), ctypes.c_uint64(len(out)))
        return out


def load() -> HostKernels:
    """The host build, compiled on first use; CompilerUnavailable without a C compiler."""
    compiler = _find_compiler()
    if compiler is None:
        raise CompilerUnavailable("no C compiler (cc, gcc or clang) to build gpu_host.c")
    with _lock:
        if compiler not in _loaded:
            target = build_library(compiler, "gpu_host.c", SOURCES, CFLAGS, "cuzk_gpu_host")
            _loaded[compiler] = HostKernels(ctypes.CDLL(str(target)))
        return _loaded[compiler]
