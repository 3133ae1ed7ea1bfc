"""BLS12-381 groups through py-arkworks-bls12381: checked decoding, bases for MSMs, pairings.

Two encodings are used. Compressed ZCash encoding (48-byte G1, 96-byte G2) is the public
format of proofs and verifying keys; every such point read from outside is checked to lie on
the curve and in the prime-order subgroup. Uncompressed little-endian affine x||y (96-byte G1,
192-byte G2, all zeros for infinity) is the internal format of parameter files and of MSM bases
handed to a backend: it loads ~100x faster, and parameter files are checked by digest instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from py_arkworks_bls12381 import GT, G1Point, G2Point, Scalar

from cuzk_engine.errors import ProofFormatError
from cuzk_engine.field import MODULUS
from cuzk_engine.paramfile import G1_XY, G2_XY

G1_COMPRESSED = 48
G2_COMPRESSED = 96

__all__ = [
    "GT",
    "FixedBase",
    "G1Bases",
    "G1Point",
    "G2Bases",
    "G2Point",
    "Scalar",
    "g1_from_compressed",
    "g2_from_compressed",
    "msm_g1",
    "msm_g2",
    "pairing_check",
    "scalar",
    "scalars_from_le_bytes",
]


def _check(point, what: str):
    if not point.is_in_subgroup():
        raise ProofFormatError(f"{what}: point is not in the prime-order subgroup")
    return point


def _from_compressed(group, size: int, name: str, data: bytes, what: str):
    if len(data) != size:
        raise ProofFormatError(f"{what}: expected {size} bytes, got {len(data)}")
    try:
        point = group.from_compressed_bytes_unchecked(bytes(data))
    except ValueError as exc:
        raise ProofFormatError(f"{what}: not a valid compressed {name} point ({exc})") from None
    return _check(point, what)


def g1_from_compressed(data: bytes, what: str = "G1 point"):
    return _from_compressed(G1Point, G1_COMPRESSED, "G1", data, what)


def g2_from_compressed(data: bytes, what: str = "G2 point"):
    return _from_compressed(G2Point, G2_COMPRESSED, "G2", data, what)


def scalar(value: int) -> Scalar:
    return Scalar.from_le_bytes((value % MODULUS).to_bytes(32, "little"))


def scalars_from_le_bytes(chunks: Sequence[bytes]) -> list[Scalar]:
    return [Scalar.from_le_bytes(c) for c in chunks]


class _Bases:
    point_type: type[G1Point | G2Point] = G1Point
    group = "g1"
    xy_len = G1_XY

    def __init__(self, xy: bytes):
        if len(xy) % self.xy_len:
            raise ValueError(f"bases: {len(xy)} bytes is not a multiple of {self.xy_len}")
        self.xy = bytes(xy)

    @cached_property
    def points(self) -> list:
        """The bases as arkworks points, built on first use: the native MSMs read `xy` directly,
        so only the arkworks fallback and the setup pay for this."""
        load = self.point_type.from_xy_bytes_unchecked_le
        size = self.xy_len
        # "unchecked" still rejects points off the curve; the subgroup is vouched for by the
        # parameter file's digest.
        return [load(self.xy[i:i + size]) for i in range(0, len(self.xy), size)]

    def __len__(self) -> int:
        return len(self.xy) // self.xy_len

    @classmethod
    def from_points(cls, points: Sequence) -> _Bases:
        return cls(b"".join(p.to_xy_bytes_le() for p in points))

    @property
    def nbytes(self) -> int:
        # the bytes plus arkworks' own affine copy (two base-field coordinates per point), which
        # exists once the arkworks fallback has run: budgeted whether or not it does
        return 2 * len(self.xy)


class G1Bases(_Bases):
    """G1 MSM bases: arkworks points plus their affine LE x||y bytes (96 each, zeros = inf)."""


class G2Bases(_Bases):
    """G2 MSM bases: arkworks points plus their affine LE x||y bytes (192 each)."""

    point_type = G2Point
    group = "g2"
    xy_len = G2_XY


def _msm(point_type, points: Sequence, scalars: Sequence[Scalar]):
    if len(points) != len(scalars):
        # arkworks zips its inputs and would silently drop the tail
        raise ValueError(f"MSM length mismatch: {len(points)} points, {len(scalars)} scalars")
    if not points:
        return point_type.identity()
    return point_type.multiexp_unchecked(list(points), list(scalars))


def msm_g1(points: Sequence, scalars: Sequence[Scalar]):
    return _msm(G1Point, points, scalars)


def msm_g2(points: Sequence, scalars: Sequence[Scalar]):
    return _msm(G2Point, points, scalars)


def pairing_check(g1s: Sequence, g2s: Sequence) -> bool:
    """True when prod e(g1s[i], g2s[i]) is the identity (one shared final exponentiation)."""
    return bool(GT.pairing_check(list(g1s), list(g2s)))


class FixedBase:
    """Many scalar multiples of one base point, for the parameter setup.

    A windowed table holds d * base * 2^(w*j) for every window j and digit d, so a 255-bit
    multiplication becomes ceil(255/w) table additions instead of ~380 group operations:
    ~16 additions (~30 us) instead of one 270 us arkworks scalar multiplication at w = 16.
    """

    def __init__(self, base, window: int = 12):
        self.window = window
        self.windows = -(-MODULUS.bit_length() // window)
        self.identity = type(base).identity()
        self.table = []
        row_base = base
        for _ in range(self.windows):
            row = [self.identity]
            acc = self.identity
            for _ in range(1, 1 << window):
                acc = acc + row_base
                row.append(acc)
            self.table.append(row)
            row_base = acc + row_base  # base * 2^(w*(j+1))

    def mul(self, k: int):
        k %= MODULUS
        mask = (1 << self.window) - 1
        acc = self.identity
        for row in self.table:
            digit = k & mask
            if digit:
                acc = acc + row[digit]
            k >>= self.window
            if not k:
                break
        return acc

    def mul_many_xy(self, scalars: Sequence[int]) -> bytes:
        return b"".join(self.mul(k).to_xy_bytes_le() for k in scalars)
