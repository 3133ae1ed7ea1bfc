"""The bucket-MSM and NTT drivers shared by the CUDA backend and the CPU-side kernel tests.

The kernels (msm.cu / ntt.cu) do the arithmetic one thread per index; these drivers do the glue
between launches with array code (numpy or cupy, passed in as `xp`) and call the kernels through
a `KernelRunner`. The CUDA backend's runner launches cupy RawModule kernels; the host runner
(gpu_host.HostKernels) calls the same per-thread bodies compiled with gcc. So a CPU test of
`msm_windows` against arkworks checks exactly the algorithm the GPU runs.

Point arrays are (k, 18) uint64: Jacobian X, Y, Z in Montgomery form, 6 limbs each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from py_arkworks_bls12381 import G1Point

from cuzk_engine.field import GENERATOR, MODULUS, inverse, root_of_unity

BASE_MODULUS = 0x1A0111EA397FE69A4B1BA7B6434BACD764774B84F38512BF6730D2A0F6B0F6241EABFFFEB153FFFFB9FEFFFFFFFFAAAB
SCALAR_BITS = 255
JACOBIAN_LIMBS = 18
# Entries one accumulation task sums serially; buckets with more are split into several tasks
# and their partial sums reduced again.
RUN_LENGTH = 32
MAX_POINTS = 1 << 32  # keys carry the point index in their low 32 bits


# Scalar parameter types of every kernel ("p" = array pointer); the trailing count is a u64.
# Runners cast ints to these exact widths: a kernel launch has no prototype to convert them.
KERNEL_SIGNATURES: dict[str, tuple[str, ...]] = {
    "msm_bucket_key": ("p", "p", "u64", "u32"),
    "msm_accumulate_affine": ("p", "p", "p", "p", "p"),
    "msm_accumulate_jacobian": ("p", "p", "p", "p"),
    "msm_window_segment": ("p", "p", "u32", "u32"),
    "msm_bases_to_mont": ("p",),
    "ntt_bit_reverse": ("p", "p", "u32"),
    "ntt_butterfly": ("p", "p", "u32", "u32"),
    "fr_powers": ("p", "p"),
    "fr_scale_powers": ("p", "p", "p"),
    "fr_flag_noncanonical": ("p", "p"),
}
KERNEL_FILES = {"ntt.cu": ("ntt_bit_reverse", "ntt_butterfly", "fr_powers", "fr_scale_powers",
                           "fr_flag_noncanonical"),
                "msm.cu": ("msm_bucket_key", "msm_accumulate_affine", "msm_accumulate_jacobian",
                           "msm_window_segment", "msm_bases_to_mont")}


# Kernels whose first argument is written in full and never read.
WRITE_ONLY_OUTPUT = frozenset({"msm_bucket_key", "msm_accumulate_affine",
                               "msm_accumulate_jacobian", "msm_window_segment",
                               "ntt_bit_reverse", "fr_powers", "fr_flag_noncanonical"})
_POISON = {1: 0xA5, 8: 0xA5A5A5A5A5A5A5A5}


class KernelRunner(Protocol):
    """Runs kernel `<name>_all` over `count` indices; arguments are arrays or ints."""

    def __call__(self, name: str, count: int, *args: Any) -> None: ...


class PoisoningRunner:
    """Wraps a runner for checks: fills every write-only output with a junk pattern before the
    launch, so an index a kernel fails to write shows up as a wrong result, not as a stale
    value that happens to be right."""

    def __init__(self, run: KernelRunner):
        self._run = run

    def __call__(self, name: str, count: int, *args: Any) -> None:
        if name in WRITE_ONLY_OUTPUT:
            out = args[0]
            out.fill(out.dtype.type(_POISON[out.dtype.itemsize]))
        self._run(name, count, *args)


@dataclass(frozen=True)
class MsmShape:
    window_bits: int
    windows: int
    segment_log: int  # each window's 2^c buckets are reduced by 2^segment_log threads

    @property
    def buckets(self) -> int:
        return self.windows << self.window_bits


def msm_shape(n: int) -> MsmShape:
    """Window width grows with n (more buckets amortize over more points), 4..16 bits."""
    c = max(4, min(16, n.bit_length() - 4))
    windows = -(-SCALAR_BITS // c)
    segment_log = max(0, c - 5)  # 32 buckets per reduction thread
    return MsmShape(c, windows, segment_log)


def run_tasks(xp, offsets):
    """Split segments [offsets[s], offsets[s+1]) into runs of at most RUN_LENGTH entries.

    Returns (begin, end, task_offsets): task s's runs are task_offsets[s] .. task_offsets[s+1].
    Every segment gets at least one task (an empty one sums to infinity), so the partial sums
    stay aligned with their segments."""
    counts = offsets[1:] - offsets[:-1]
    tasks = xp.maximum((counts + RUN_LENGTH - 1) // RUN_LENGTH, 1)
    task_offsets = xp.zeros(len(counts) + 1, dtype=xp.int64)
    xp.cumsum(tasks, out=task_offsets[1:])
    total = int(task_offsets[-1])
    task = xp.arange(total, dtype=xp.int64)
    segment = xp.searchsorted(task_offsets, task, side="right") - 1
    begin = offsets[segment] + (task - task_offsets[segment]) * RUN_LENGTH
    end = xp.minimum(begin + RUN_LENGTH, offsets[segment + 1])
    return begin, end, task_offsets


def reduce_segments(xp, run: KernelRunner, partials, offsets):
    """One Jacobian sum per segment of `partials` (contiguous runs given by offsets)."""
    while int(xp.max(offsets[1:] - offsets[:-1])) > 1:
        begin, end, offsets = run_tasks(xp, offsets)
        out = xp.empty((len(begin), JACOBIAN_LIMBS), dtype=xp.uint64)
        run("msm_accumulate_jacobian", len(begin), out, partials, begin, end)
        partials = out
    return partials


def msm_windows(xp, run: KernelRunner, bases_mont, scalars, shape: MsmShape):
    """The W window sums sum_d d * B_{w,d} as a (W, 18) array on xp's device.

    bases_mont: (n, 12) uint64 affine Montgomery points; scalars: (n, 4) canonical limbs."""
    n = len(scalars)
    keys = xp.empty(n * shape.windows, dtype=xp.uint64)
    run("msm_bucket_key", len(keys), keys, scalars, n, shape.window_bits)
    keys = xp.sort(keys)
    bucket_ids = (keys >> np.uint64(32)).astype(xp.int64)
    offsets = xp.searchsorted(bucket_ids, xp.arange(shape.buckets + 1, dtype=xp.int64))
    begin, end, task_offsets = run_tasks(xp, offsets)
    partials = xp.empty((len(begin), JACOBIAN_LIMBS), dtype=xp.uint64)
    run("msm_accumulate_affine", len(begin), partials, bases_mont, keys, begin, end)
    buckets = reduce_segments(xp, run, partials, task_offsets)

    segments = shape.windows << shape.segment_log
    segment_sums = xp.empty((segments, JACOBIAN_LIMBS), dtype=xp.uint64)
    run("msm_window_segment", segments, segment_sums, buckets, shape.window_bits,
        shape.segment_log)
    window_offsets = xp.arange(0, segments + 1, 1 << shape.segment_log, dtype=xp.int64)
    return reduce_segments(xp, run, segment_sums, window_offsets)


_R_INV = pow(1 << 384, -1, BASE_MODULUS)


def _from_mont(limbs) -> int:
    value = 0
    for i, limb in enumerate(limbs):
        value |= int(limb) << (64 * i)
    return value * _R_INV % BASE_MODULUS


def jacobian_to_g1(point: np.ndarray) -> G1Point:
    """One (18,) Montgomery Jacobian point to an arkworks point (arkworks checks it is on the
    curve, so a corrupted device result cannot pass as a point)."""
    x, y, z = (_from_mont(point[6 * k:6 * k + 6]) for k in range(3))
    if z == 0:
        return G1Point.identity()
    z_inv = pow(z, -1, BASE_MODULUS)
    z_inv2 = z_inv * z_inv % BASE_MODULUS
    ax = x * z_inv2 % BASE_MODULUS
    ay = y * z_inv2 * z_inv % BASE_MODULUS
    return G1Point.from_xy_bytes_unchecked_le(ax.to_bytes(48, "little") + ay.to_bytes(48, "little"))


def combine_windows(window_sums: np.ndarray, shape: MsmShape) -> G1Point:
    """sum_w 2^(c*w) * window_w by Horner's rule on the host (W*c arkworks additions)."""
    acc = G1Point.identity()
    for w in range(shape.windows - 1, -1, -1):
        for _ in range(shape.window_bits):
            acc = acc + acc
        acc = acc + jacobian_to_g1(window_sums[w])
    return acc


def msm(xp, run: KernelRunner, bases_mont, scalars) -> G1Point:
    n = len(scalars)
    if len(bases_mont) != n:
        raise ValueError(f"MSM length mismatch: {len(bases_mont)} points, {n} scalars")
    if n == 0:
        return G1Point.identity()
    if n >= MAX_POINTS:
        raise ValueError(f"MSM of {n} points exceeds the kernel limit of {MAX_POINTS - 1}")
    shape = msm_shape(n)
    sums = msm_windows(xp, run, bases_mont, scalars, shape)
    return combine_windows(np.asarray(sums.get() if hasattr(sums, "get") else sums), shape)


def fr_mont(value: int) -> np.ndarray:
    """(1, 4) uint64 Montgomery form of an Fr element, a kernel constant argument."""
    v = (value << 256) % MODULUS
    return np.array([[(v >> (64 * i)) & 0xFFFFFFFFFFFFFFFF for i in range(4)]], dtype=np.uint64)


def twiddles(xp, run: KernelRunner, log_n: int, inverse_: bool):
    """omega^k (k < n/2) in Montgomery form for the size-2^log_n transform."""
    omega = root_of_unity(log_n)
    base = xp.asarray(fr_mont(inverse(omega) if inverse_ else omega))
    half = max(1, (1 << log_n) // 2)
    table = xp.empty((half, 4), dtype=xp.uint64)
    run("fr_powers", half, table, base)
    return table


def ntt(xp, run: KernelRunner, values, log_n: int, table, *, inverse_: bool, coset: bool):
    """Transform canonical (n, 4) limbs (a device array for xp); returns a new array.

    `table` comes from twiddles(xp, run, log_n, inverse_), cached by the caller."""
    n = 1 << log_n
    if coset and not inverse_:
        values = values.copy()
        run("fr_scale_powers", n, values, xp.asarray(fr_mont(1)), xp.asarray(fr_mont(GENERATOR)))
    out = xp.empty_like(values)
    run("ntt_bit_reverse", n, out, values, log_n)
    for stage in range(1, log_n + 1):
        run("ntt_butterfly", n // 2, out, table, log_n, stage)
    if inverse_:
        g = inverse(GENERATOR) if coset else 1
        run("fr_scale_powers", n, out, xp.asarray(fr_mont(inverse(n))), xp.asarray(fr_mont(g)))
    return out
