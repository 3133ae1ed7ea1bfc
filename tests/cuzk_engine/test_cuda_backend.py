"""Backend selection and the CUDA backend. Without a GPU (CI): auto falls back to the CPU and
an explicit "cuda" request fails with the reason. With a GPU: the backend's NTT and MSM match
the CPU backend on fresh random inputs, and bases stay on the device between MSMs."""

import builtins
import secrets

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, Scalar

from cuzk_engine.backend import cuda, select_backend
from cuzk_engine.backend.cpu import CpuBackend
from cuzk_engine.curve import G1Bases
from cuzk_engine.errors import CompilerUnavailable, CudaUnavailable, InvalidRequest
from cuzk_engine.field import MODULUS

HAS_GPU = cuda.device_count() > 0
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA device on this machine")


def random_limbs(n):
    values = [secrets.randbelow(MODULUS) for _ in range(n)]
    return np.array([[(v >> (64 * i)) & (2**64 - 1) for i in range(4)] for v in values],
                    dtype=np.uint64).reshape(n, 4)


@pytest.mark.skipif(HAS_GPU, reason="checks the fallback on machines without a GPU")
def test_auto_selects_cpu_without_a_device():
    assert select_backend("auto").name == "cpu"


@pytest.mark.skipif(HAS_GPU, reason="checks the error on machines without a GPU")
def test_explicit_cuda_without_a_device_says_why():
    with pytest.raises(InvalidRequest, match="'cuda' is not usable.*(cupy|driver|device)"):
        select_backend("cuda")


def test_missing_cupy_is_reported_with_the_install_hint(monkeypatch):
    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    assert cuda.device_count() == 0
    with pytest.raises(CudaUnavailable, match=r"gpu extra"):
        cuda.CudaBackend.create(0)
    with pytest.raises(InvalidRequest, match="cupy is not installed"):
        select_backend("cuda:0")


def test_unknown_backend_name_is_rejected():
    with pytest.raises(InvalidRequest, match="unknown backend"):
        select_backend("tpu")


@pytest.fixture(scope="module")
def gpu():
    return cuda.CudaBackend.create(0)


@needs_gpu
@pytest.mark.parametrize("inverse,coset", [(False, False), (True, False), (False, True),
                                           (True, True)])
def test_gpu_ntt_matches_cpu_backend(gpu, inverse, coset):
    values = random_limbs(1 << 12)
    expected = CpuBackend().ntt(values, inverse=inverse, coset=coset)
    assert np.array_equal(gpu.ntt(values, inverse=inverse, coset=coset), expected)


@needs_gpu
def test_gpu_msm_matches_arkworks_and_keeps_bases_on_device(gpu):
    points = [G1Point() * Scalar(secrets.randbelow(MODULUS)) for _ in range(300)]
    bases = G1Bases.from_points(points)
    before = gpu.memory.cached_bytes
    for _ in range(2):
        scalars = random_limbs(len(points))
        expected = G1Point.multiexp_unchecked(
            points, [Scalar(int.from_bytes(row.tobytes(), "little")) for row in scalars])
        assert gpu.msm_g1(bases, scalars) == expected
    assert gpu.memory.cached_bytes - before >= len(points) * 96
    device_copy = gpu.device_bases(bases)
    assert gpu.device_bases(bases) is device_copy
    gpu.release_bases(bases)
    assert gpu.memory.cached_bytes < before + len(points) * 96


@needs_gpu
def test_gpu_rejects_noncanonical_scalars(gpu):
    points = [G1Point()] * 4
    scalars = random_limbs(4)
    scalars[2] = [2**64 - 1] * 4
    with pytest.raises(ValueError, match="not canonical"):
        gpu.msm_g1(G1Bases.from_points(points), scalars)


class _HostModule:
    """Stands in for cupy.RawModule: each kernel function runs the host build of the same
    kernel, after checking the launch covers every index and the scalar types are exact."""

    def __init__(self, kernels, code, options):
        assert any(o.startswith("--include-path=") for o in options)
        self._kernels = kernels

    def get_function(self, full_name):
        name = full_name.removesuffix("_all")
        params = cuda.gpu_driver.KERNEL_SIGNATURES[name]

        def launch(grid, block, args):
            *kernel_args, count = args
            assert isinstance(count, np.uint64) and grid[0] * block[0] >= count
            for kind, arg in zip(params, kernel_args):
                expected = {"p": np.ndarray, "u32": np.uint32, "u64": np.uint64}[kind]
                assert isinstance(arg, expected), (name, kind, type(arg))
            self._kernels(name, int(count), *kernel_args)

        return launch


class _HostCupy:
    """The slice of the cupy API the backend uses, over numpy and the host kernel build."""

    def __init__(self, kernels):
        self.ndarray = np.ndarray
        self.uint8 = np.uint8
        # host-to-device copies never alias the caller's memory (bases.xy is immutable bytes)
        self.asarray = lambda a: np.array(a, order="C", copy=True)
        self.count_nonzero = np.count_nonzero
        self.RawModule = lambda code, options: _HostModule(kernels, code, options)

        class _Device:
            def __init__(self, ordinal):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.cuda = type("cuda", (), {"Device": _Device})

    def __getattr__(self, name):
        return getattr(np, name)

    def asnumpy(self, array):
        return np.asarray(array)


@pytest.fixture(scope="module")
def host_backend():
    from cuzk_engine.native import gpu_host

    try:
        kernels = gpu_host.load()
    except CompilerUnavailable as exc:
        pytest.skip(str(exc))
    return cuda.CudaBackend(0, _HostCupy(kernels))


@pytest.mark.parametrize("inverse,coset", [(False, False), (True, True)])
def test_backend_plumbing_ntt_on_host_kernels(host_backend, inverse, coset):
    values = random_limbs(1 << 9)
    expected = CpuBackend().ntt(values, inverse=inverse, coset=coset)
    assert np.array_equal(host_backend.ntt(values, inverse=inverse, coset=coset), expected)
    assert host_backend.memory.cached_bytes >= (1 << 8) * 32


def test_backend_plumbing_msm_caches_bases_per_object(host_backend):
    points = [G1Point() * Scalar(secrets.randbelow(MODULUS)) for _ in range(40)]
    bases = G1Bases.from_points(points)
    scalars = random_limbs(40)
    expected = G1Point.multiexp_unchecked(
        points, [Scalar(int.from_bytes(row.tobytes(), "little")) for row in scalars])
    before = host_backend.memory.cached_bytes
    assert host_backend.msm_g1(bases, scalars) == expected
    assert host_backend.memory.cached_bytes == before + 40 * 96
    assert host_backend.device_bases(bases) is host_backend.device_bases(bases)
    del bases
    import gc

    gc.collect()
    assert host_backend.memory.cached_bytes == before


def test_backend_plumbing_rejects_bad_inputs(host_backend):
    bases = G1Bases.from_points([G1Point()] * 4)
    with pytest.raises(ValueError, match="length mismatch"):
        host_backend.msm_g1(bases, random_limbs(3))
    bad = random_limbs(4)
    bad[1, 3] = 2**64 - 1
    with pytest.raises(ValueError, match="not canonical"):
        host_backend.msm_g1(bases, bad)
    with pytest.raises(ValueError, match="power of two"):
        host_backend.ntt(random_limbs(6))
    with pytest.raises(ValueError, match=r"\(n, 4\) uint64"):
        host_backend.ntt(np.zeros((8, 4), dtype=np.int64))


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU exit path")
def test_gpu_check_script_exits_with_a_clear_message_without_a_gpu():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2
    assert "no usable GPU" in result.stderr
