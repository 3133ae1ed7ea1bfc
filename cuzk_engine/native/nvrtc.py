"""Compile the CUDA kernel sources to PTX without a GPU.

NVRTC is the compiler cupy uses at run time, and the `nvidia-cuda-nvrtc-cu12` wheel ships it
without needing a driver or a device, so CI can prove every kernel builds for the H200's
architecture. `nvcc_check` is a second opinion when a CUDA toolkit is on PATH.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

from cuzk_engine.errors import KernelCompileError, NvrtcUnavailable

SOURCE_DIR = Path(__file__).resolve().parent
KERNEL_SOURCES = ("ntt.cu", "msm.cu")
DEFAULT_ARCH = "compute_90"


def _candidate_libraries() -> list[str]:
    candidates = []
    try:
        import nvidia.cuda_nvrtc

        for root in nvidia.cuda_nvrtc.__path__:
            candidates += sorted(str(p) for p in Path(root, "lib").glob("libnvrtc.so*"))
    except ImportError:
        pass
    return candidates + ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]


def load_nvrtc() -> ctypes.CDLL:
    for name in _candidate_libraries():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcUnavailable(
        "libnvrtc not found: install the nvidia-cuda-nvrtc-cu12 wheel (part of the dev extra)")


def kernel_options(arch: str = DEFAULT_ARCH) -> list[str]:
    """The NVRTC options the kernels are built with, here and by the CUDA backend."""
    return [f"--gpu-architecture={arch}", "--std=c++17", f"--include-path={SOURCE_DIR}"]


def compile_ptx(source_name: str, arch: str = DEFAULT_ARCH) -> str:
    """PTX for one kernel file of this package; raises KernelCompileError with the NVRTC log."""
    lib = load_nvrtc()
    code = (SOURCE_DIR / source_name).read_bytes()
    prog = ctypes.c_void_p()

    def check(status: int, what: str) -> None:
        if status != 0:
            raise KernelCompileError(
                source_name, f"{what}: {lib.nvrtcGetErrorString(status).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), code, source_name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    try:
        options = [o.encode() for o in kernel_options(arch)]
        argv = (ctypes.c_char_p * len(options))(*options)
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if status != 0:
            raise KernelCompileError(source_name, log.value.decode(errors="replace"))
        ptx_size = ctypes.c_size_t()
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(ptx_size.value)
        check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvcc_check(source_name: str, arch: str = "sm_90", output: str = "ptx") -> str:
    """Build one kernel file with nvcc, to PTX (front end only, seconds) or to a cubin (adds
    ptxas, tens of seconds for msm.cu); returns nvcc's diagnostics (empty when clean)."""
    if output not in ("ptx", "cubin"):
        raise ValueError(f"output must be 'ptx' or 'cubin', not {output!r}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [nvcc, f"-arch={arch}", "-std=c++17", "-I", str(SOURCE_DIR), f"-{output}",
             "-o", str(Path(tmp) / f"kernel.{output}"), str(SOURCE_DIR / source_name)],
            check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise KernelCompileError(source_name, result.stderr)
    return result.stderr


def kernel_source(source_name: str) -> str:
    """The source handed to cupy.RawModule (headers resolve through kernel_options' include path)."""
    return (SOURCE_DIR / source_name).read_text()
