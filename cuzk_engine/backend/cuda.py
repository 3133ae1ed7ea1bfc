"""The CUDA backend: Fr NTTs and bucket-method G1 MSMs as cupy RawModule kernels.

The kernels are ntt.cu / msm.cu, compiled at run time by NVRTC for the device's architecture;
the glue between launches is cuzk_engine.native.gpu_driver, the same code the CPU-side tests run
against arkworks with a host build of the kernels. Device state that outlives one call (the MSM
bases of each loaded parameter set, twiddle tables) is cached per device and counted in
`DeviceMemory`, so the engine can see what a GPU holds.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from cuzk_engine import native
from cuzk_engine.errors import CudaUnavailable
from cuzk_engine.native import gpu_driver, nvrtc

if TYPE_CHECKING:
    from cuzk_engine.curve import G1Bases, G1Point

THREADS_PER_BLOCK = 256


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:
        raise CudaUnavailable(
            f"cupy is not installed ({exc}); install the gpu extra: pip install 'vastmgr[gpu]'"
        ) from None
    return cupy


def device_count() -> int:
    """Usable CUDA devices; 0 without cupy, driver or device (never raises)."""
    try:
        cupy = _import_cupy()
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - cupy raises driver-specific errors; none means "no GPU"
        return 0


class DeviceMemory:
    """Bytes this process keeps resident on one device beyond a single call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[str, int] = {}

    def set(self, owner: str, nbytes: int) -> None:
        with self._lock:
            if nbytes:
                self._by_owner[owner] = nbytes
            else:
                self._by_owner.pop(owner, None)

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(self._by_owner.values())


_instances: dict[int, CudaBackend] = {}
_instances_lock = threading.Lock()
_memory: dict[int, DeviceMemory] = {}
_memory_lock = threading.Lock()


def device_memory(ordinal: int) -> DeviceMemory:
    with _memory_lock:
        return _memory.setdefault(ordinal, DeviceMemory())


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for name in ("fr.h", "fp.h", "jacobian.h", "g1.h", "msm.h", "ntt_gpu.h", "launch.h", *nvrtc.KERNEL_SOURCES):
        digest.update((nvrtc.SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


class _Runner:
    """gpu_driver.KernelRunner over cupy RawModules on one device."""

    def __init__(self, cupy, modules: dict[str, Any]):
        self._cupy = cupy
        self._functions = {}
        for source, names in gpu_driver.KERNEL_FILES.items():
            for name in names:
                self._functions[name] = modules[source].get_function(f"{name}_all")

    def __call__(self, name: str, count: int, *args) -> None:
        if count == 0:
            return
        params = gpu_driver.KERNEL_SIGNATURES[name]
        if len(args) != len(params):
            raise TypeError(f"{name} takes {len(params)} arguments, got {len(args)}")
        converted = []
        for kind, arg in zip(params, args):
            if kind == "p":
                if not isinstance(arg, self._cupy.ndarray) or not arg.flags.c_contiguous:
                    raise TypeError(f"{name}: array arguments must be C-contiguous cupy arrays")
                converted.append(arg)
            else:
                converted.append(np.uint32(arg) if kind == "u32" else np.uint64(arg))
        blocks = (count + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        self._functions[name]((blocks,), (THREADS_PER_BLOCK,), (*converted, np.uint64(count)))


class CudaBackend:
    """Backend protocol on one CUDA device (`cuda:<ordinal>`)."""

    def __init__(self, ordinal: int, cupy) -> None:
        self.ordinal = ordinal
        self.name = f"cuda:{ordinal}"
        self._cupy = cupy
        self._device = cupy.cuda.Device(ordinal)
        self._lock = threading.Lock()
        self._runner: _Runner | None = None
        self._twiddles: dict[tuple[int, bool], Any] = {}  # cupy arrays
        self._bases: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.memory = device_memory(ordinal)
        # owner keys are per instance: several backends may share a device's account
        self._owner = f"{self.name}/{id(self):x}"
        for part in ("bases", "twiddles"):
            weakref.finalize(self, self.memory.set, f"{self._owner}/{part}", 0)
        # prove_start divides a*b - c by Z on the host between the transforms; the native CPU
        # kernel does that in milliseconds where Python integers take seconds at GPU sizes.
        self.native = native.load()

    @classmethod
    def create(cls, ordinal: int = 0) -> CudaBackend:
        """The process's backend on device `ordinal` (one per device, so its cached bases and
        twiddles serve every caller); CudaUnavailable (a RuntimeError) says why not."""
        cupy = _import_cupy()
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # noqa: BLE001 - e.g. CUDARuntimeError: insufficient driver
            raise CudaUnavailable(f"no usable CUDA driver or device: {exc}") from None
        if not 0 <= ordinal < count:
            raise CudaUnavailable(f"CUDA device {ordinal} does not exist ({count} visible)")
        with _instances_lock:
            if ordinal not in _instances:
                _instances[ordinal] = cls(ordinal, cupy)
            return _instances[ordinal]

    # -- compilation -------------------------------------------------------------------------

    def runner(self) -> _Runner:
        """Compiles ntt.cu and msm.cu for this device on first use (NVRTC, cached by cupy)."""
        with self._lock:
            if self._runner is None:
                with self._device:
                    # cupy's compile cache keys on the source text and options only; the digest
                    # of the included headers makes an edited header recompile.
                    options = ("--std=c++17", f"--include-path={nvrtc.SOURCE_DIR}",
                               f"-DCUZK_SOURCES={_sources_digest()}")
                    modules = {src: self._cupy.RawModule(code=nvrtc.kernel_source(src),
                                                         options=options)
                               for src in nvrtc.KERNEL_SOURCES}
                    self._runner = _Runner(self._cupy, modules)
            return self._runner

    # -- NTT ---------------------------------------------------------------------------------

    def _twiddle_table(self, log_n: int, inverse: bool):
        key = (log_n, inverse)
        with self._lock:
            table = self._twiddles.get(key)
        if table is None:
            table = gpu_driver.twiddles(self._cupy, self.runner(), log_n, inverse)
            with self._lock:
                table = self._twiddles.setdefault(key, table)
                self.memory.set(f"{self._owner}/twiddles",
                                sum(t.nbytes for t in self._twiddles.values()))
        return table

    def ntt(self, values: np.ndarray, *, inverse: bool = False,
            coset: bool = False) -> np.ndarray:
        values = _fr_array(values, "NTT input")
        n = len(values)
        if n < 1 or n & (n - 1):
            raise ValueError(f"NTT size {n} is not a power of two")
        log_n = n.bit_length() - 1
        run = self.runner()
        with self._device:
            device_values = self._cupy.asarray(values)
            self._require_canonical(run, device_values, "NTT input")
            table = self._twiddle_table(log_n, inverse)
            out = gpu_driver.ntt(self._cupy, run, device_values, log_n, table,
                                 inverse_=inverse, coset=coset)
            return self._cupy.asnumpy(out)

    # -- MSM ---------------------------------------------------------------------------------

    def device_bases(self, bases: G1Bases):
        """The bases as (n, 12) Montgomery affine limbs on this device, uploaded once per
        G1Bases object and freed with it (a parameter set evicted from the SRS cache)."""
        with self._lock:
            cached = self._bases.get(bases)
        if cached is not None:
            return cached
        run = self.runner()
        with self._device:
            host = np.frombuffer(bases.xy, dtype=np.uint64).reshape(len(bases), 12)
            device = self._cupy.asarray(host)
            run("msm_bases_to_mont", len(device), device)
        with self._lock:
            device = self._bases.setdefault(bases, device)
            self._account_bases()
        weakref.finalize(bases, self._account_bases)
        return device

    def _account_bases(self) -> None:
        self.memory.set(f"{self._owner}/bases", sum(d.nbytes for d in self._bases.values()))

    def release_bases(self, bases: G1Bases) -> None:
        """Drop the device copy of `bases` now rather than when the object is collected."""
        with self._lock:
            self._bases.pop(bases, None)
            self._account_bases()

    def msm_g1(self, bases: G1Bases, scalars: np.ndarray) -> G1Point:
        scalars = _fr_array(scalars, "MSM scalars")
        if len(scalars) != len(bases):
            raise ValueError(f"MSM length mismatch: {len(bases)} points, {len(scalars)} scalars")
        device_bases = self.device_bases(bases)
        run = self.runner()
        with self._device:
            device_scalars = self._cupy.asarray(scalars)
            self._require_canonical(run, device_scalars, "MSM scalars")
            return gpu_driver.msm(self._cupy, run, device_bases, device_scalars)

    # -- accounting ----------------------------------------------------------------------------

    def memory_info(self) -> dict[str, int]:
        """cached_bytes: bases + twiddles this process keeps on the device; pool_bytes: what
        cupy's pool holds (cached plus freed-but-reusable); free/total: the device's view."""
        with self._device:
            free, total = self._cupy.cuda.runtime.memGetInfo()
            pool = self._cupy.get_default_memory_pool()
            return {"cached_bytes": self.memory.cached_bytes,
                    "pool_used_bytes": int(pool.used_bytes()),
                    "pool_total_bytes": int(pool.total_bytes()),
                    "device_free_bytes": int(free), "device_total_bytes": int(total)}

    def _require_canonical(self, run: _Runner, values, what: str) -> None:
        flags = self._cupy.empty(len(values), dtype=self._cupy.uint8)
        run("fr_flag_noncanonical", len(values), flags, values)
        bad = int(self._cupy.count_nonzero(flags))
        if bad:
            raise ValueError(f"{what}: {bad} values are not canonical (>= r)")


def _fr_array(values: np.ndarray, what: str) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype != np.uint64 or values.ndim != 2 or values.shape[1] != 4:
        raise ValueError(f"{what}: expected an (n, 4) uint64 array, got {values.dtype} "
                         f"{values.shape}")
    return np.ascontiguousarray(values)
