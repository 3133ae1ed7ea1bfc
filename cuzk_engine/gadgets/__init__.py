"""Circuit building blocks on top of `cuzk_engine.r1cs`.

A `Num` is a field element known to the circuit as a linear combination, carried with its
witness value, so gadgets compute the witness and the constraints in one pass. Linear steps
(additions, constant multiples) cost no constraints; only products do. In a values-only
system (`ConstraintSystem(matrices=False)`, the prover's) `lc` is None and only values flow;
every decision about the circuit's shape must therefore depend on structure, never on an lc.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cuzk_engine.field import MODULUS
from cuzk_engine.r1cs import LC, ONE, ConstraintSystem


@dataclass(slots=True)
class Num:
    lc: LC | None
    value: int


ZERO_LC: LC = {}


def constant(value: int) -> Num:
    value %= MODULUS
    return Num({ONE: value} if value else {}, value)


def alloc(cs: ConstraintSystem, value: int) -> Num:
    var = cs.alloc(value)
    return Num({var: 1} if cs.matrices else None, value % MODULUS)


def alloc_input(cs: ConstraintSystem, value: int) -> Num:
    var = cs.alloc_input(value)
    return Num({var: 1} if cs.matrices else None, value % MODULUS)


def linear(terms: Sequence[tuple[int, Num]], const: int = 0) -> Num:
    """sum coeff_i * x_i + const, with no constraint."""
    value = const + sum(coeff * x.value for coeff, x in terms)
    lc: LC = {ONE: const % MODULUS} if const % MODULUS else {}
    for coeff, x in terms:
        if x.lc is None:  # values only: no linear combination is built
            return Num(None, value % MODULUS)
        for var, k in x.lc.items():
            lc[var] = (lc.get(var, 0) + coeff * k) % MODULUS
    return Num({v: k for v, k in lc.items() if k}, value % MODULUS)


def add(x: Num, y: Num) -> Num:
    return linear([(1, x), (1, y)])


def sub(x: Num, y: Num) -> Num:
    return linear([(1, x), (-1, y)])


def mul(cs: ConstraintSystem, x: Num, y: Num) -> Num:
    z = alloc(cs, x.value * y.value)
    cs.enforce(x.lc, y.lc, z.lc, (x.value, y.value, z.value))
    return z


def compact(cs: ConstraintSystem, x: Num) -> Num:
    """Replace a combination by one fresh variable (one constraint), so that combinations
    folded through many linear layers do not grow without bound."""
    z = alloc(cs, x.value)
    cs.enforce(x.lc, {ONE: 1}, z.lc, (x.value, 1, z.value))
    return z


def enforce_equal(cs: ConstraintSystem, x: Num, y: Num) -> None:
    d = sub(x, y)
    cs.enforce(d.lc, {ONE: 1}, ZERO_LC, (d.value, 1, 0))


def alloc_bit(cs: ConstraintSystem, bit: int) -> Num:
    if bit not in (0, 1):
        raise ValueError(f"bit must be 0 or 1, got {bit}")
    b = alloc(cs, bit)
    not_b = sub(constant(1), b)
    cs.enforce(b.lc, not_b.lc, ZERO_LC, (b.value, not_b.value, 0))  # b * (1 - b) = 0
    return b


def to_bits_le(cs: ConstraintSystem, x: Num, nbits: int) -> list[Num]:
    """Boolean-constrained little-endian bits of x, with sum(bit_i * 2^i) = x enforced."""
    if x.value >> nbits:
        raise ValueError(f"{x.value} does not fit in {nbits} bits")
    bits = [alloc_bit(cs, (x.value >> i) & 1) for i in range(nbits)]
    enforce_equal(cs, linear([(1 << i, b) for i, b in enumerate(bits)]), x)
    return bits


def conditional_swap(cs: ConstraintSystem, bit: Num, x: Num, y: Num) -> tuple[Num, Num]:
    """(x, y) when bit = 0, (y, x) when bit = 1; one constraint: t = bit * (y - x)."""
    t = mul(cs, bit, sub(y, x))
    return add(x, t), sub(y, t)
