"""Every CUDA kernel source compiles for the H200 (sm_90) without a GPU: NVRTC from the pip
wheel (the compiler cupy uses at run time) and nvcc when a toolkit is on PATH."""

import re
import shutil

import pytest

from cuzk_engine.errors import KernelCompileError, NvrtcUnavailable
from cuzk_engine.native import nvrtc
from cuzk_engine.native.gpu_driver import KERNEL_FILES, KERNEL_SIGNATURES


def test_every_kernel_in_the_signature_table_lives_in_one_file():
    listed = [name for names in KERNEL_FILES.values() for name in names]
    assert sorted(listed) == sorted(KERNEL_SIGNATURES)
    assert set(KERNEL_FILES) == set(nvrtc.KERNEL_SOURCES)


@pytest.mark.parametrize("source", nvrtc.KERNEL_SOURCES)
def test_nvrtc_compiles_kernels_for_compute_90(source):
    try:
        ptx = nvrtc.compile_ptx(source)
    except NvrtcUnavailable as exc:
        pytest.skip(f"NVRTC wheel missing: {exc}")
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert entries == {f"{name}_all" for name in KERNEL_FILES[source]}


def test_nvrtc_reports_compile_errors_with_the_log(tmp_path, monkeypatch):
    try:
        nvrtc.load_nvrtc()
    except NvrtcUnavailable as exc:
        pytest.skip(f"NVRTC wheel missing: {exc}")
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { int x = }\n')
    monkeypatch.setattr(nvrtc, "SOURCE_DIR", tmp_path)
    with pytest.raises(KernelCompileError, match="broken.cu.*error"):
        nvrtc.compile_ptx("broken.cu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", nvrtc.KERNEL_SOURCES)
def test_nvcc_front_end_accepts_kernels(source):
    assert "error" not in nvrtc.nvcc_check(source, output="ptx")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", nvrtc.KERNEL_SOURCES)
def test_nvcc_builds_sm_90_cubins(source):
    assert "error" not in nvrtc.nvcc_check(source, output="cubin")
