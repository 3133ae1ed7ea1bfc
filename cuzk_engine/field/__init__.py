"""The BLS12-381 scalar field Fr: constants, roots of unity and the limb interchange format.

Field elements are plain Python ints in [0, MODULUS) everywhere in Python code. Vectors that
cross into native code or a GPU are (n, 4) uint64 arrays of canonical little-endian limbs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

MODULUS = 0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001
# 7 generates Fr*; (r - 1) = 2^32 * odd, so radix-2 domains up to 2^32 exist.
GENERATOR = 7
TWO_ADICITY = 32
_ODD_PART = (MODULUS - 1) >> TWO_ADICITY
ROOT_OF_UNITY_2_32 = pow(GENERATOR, _ODD_PART, MODULUS)

BYTES = 32


def inverse(x: int) -> int:
    if x % MODULUS == 0:
        raise ZeroDivisionError("0 has no inverse in Fr")
    return pow(x, -1, MODULUS)


def batch_inverse(values: Sequence[int]) -> list[int]:
    """Montgomery's trick: n inverses for one modular exponentiation and 3n multiplies."""
    prefix = []
    acc = 1
    for v in values:
        prefix.append(acc)
        acc = acc * v % MODULUS
    inv_acc = inverse(acc)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = prefix[i] * inv_acc % MODULUS
        inv_acc = inv_acc * values[i] % MODULUS
    return out


def root_of_unity(log_n: int) -> int:
    """A primitive 2^log_n-th root of unity."""
    if not 0 <= log_n <= TWO_ADICITY:
        raise ValueError(f"no 2^{log_n}-th roots of unity in Fr (2-adicity is {TWO_ADICITY})")
    return pow(ROOT_OF_UNITY_2_32, 1 << (TWO_ADICITY - log_n), MODULUS)


def ints_to_limbs(values: Iterable[int]) -> np.ndarray:
    """Canonical ints -> (n, 4) uint64 little-endian limbs."""
    raw = b"".join(v.to_bytes(BYTES, "little") for v in values)
    return np.frombuffer(raw, dtype="<u8").reshape(-1, 4).astype(np.uint64, copy=True)


def int_to_limbs(value: int) -> np.ndarray:
    return ints_to_limbs([value])[0].copy()


def limbs_to_ints(limbs: np.ndarray) -> list[int]:
    raw = np.ascontiguousarray(limbs, dtype="<u8").tobytes()
    return [int.from_bytes(raw[i:i + BYTES], "little") for i in range(0, len(raw), BYTES)]


def limbs_to_bytes(limbs: np.ndarray) -> list[bytes]:
    """Each element as 32 little-endian bytes (what arkworks Scalar.from_le_bytes takes)."""
    raw = np.ascontiguousarray(limbs, dtype="<u8").tobytes()
    return [raw[i:i + BYTES] for i in range(0, len(raw), BYTES)]
