"""Poseidon over BLS12-381 Fr, natively and in-circuit.

Instance (the Poseidon paper's `poseidonperm_x5_255_3`, 128-bit security):
  field = 1 (prime field), sbox = 0 (x^alpha with alpha = 5), n = 255 bits, t = 3,
  R_F = 8 full rounds (4 before and 4 after the partial rounds), R_P = 57 partial rounds.
Constants follow the reference script `generate_parameters_grain.sage`: an 80-bit Grain LFSR
seeded with those parameters (2+4+12+12+10+10 bits, then thirty 1s), 160 warm-up clocks, and
output bits taken in pairs (a 1 keeps the next bit, a 0 discards it). Round constants are
n-bit big-endian draws, redrawn while >= r. The MDS matrix is the Cauchy matrix
M[i][j] = 1/(x_i + y_j), with x, y the next 2t draws from the same stream reduced mod r. (The
script's extra invariant-subspace checks on M only trigger a redraw; the first matrix is the
one the published test vector uses, which `tests` pin.)

Each round: add t round constants, apply x^5 (to every lane in full rounds, lane 0 only in
partial rounds), multiply by M. The 2-to-1 hash used by Merkle trees is lane 0 of
permute([0, left, right]) (capacity lane 0 set to zero, as circomlib does).

In-circuit an S-box costs 3 constraints (x^2, x^4, x^5); round constants and the MDS layers are
folded into linear combinations, so a permutation is 3*(8*3 + 57) = 243 constraints plus
`compact` rows: lanes 1 and 2 are re-allocated after every COMPACT_EVERY-th partial round, which
stops their combinations from growing by one term per round (2 rows per compaction).
"""

from __future__ import annotations

from functools import cache
from operator import itemgetter

import numpy as np

from cuzk_engine import native
from cuzk_engine.field import MODULUS, ints_to_limbs, inverse, limbs_to_ints
from cuzk_engine.gadgets import Num, compact, constant, linear, mul
from cuzk_engine.gadgets.poseidon_constants import MDS, ROUND_CONSTANTS
from cuzk_engine.r1cs import ConstraintSystem

WIDTH = 3
FULL_ROUNDS = 8
PARTIAL_ROUNDS = 57
ALPHA = 5
FIELD_BITS = 255
COMPACT_EVERY = 6


def _grain_bits():
    def field_bits(value: int, width: int) -> list[int]:
        return [int(b) for b in format(value, f"0{width}b")]

    state = (field_bits(1, 2) + field_bits(0, 4) + field_bits(FIELD_BITS, 12)
             + field_bits(WIDTH, 12) + field_bits(FULL_ROUNDS, 10)
             + field_bits(PARTIAL_ROUNDS, 10) + [1] * 30)

    def clock() -> int:
        bit = state[62] ^ state[51] ^ state[38] ^ state[23] ^ state[13] ^ state[0]
        state.pop(0)
        state.append(bit)
        return bit

    for _ in range(160):
        clock()
    while True:
        if clock():
            yield clock()
        else:
            clock()


def parameters() -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(round constants, MDS matrix) of the instance documented above: derive_parameters()'s
    result, stored in poseidon_constants."""
    return ROUND_CONSTANTS, MDS


def derive_parameters() -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(round constants, MDS matrix) from the Grain LFSR, as documented above."""
    bits = _grain_bits()

    def draw() -> int:
        value = 0
        for _ in range(FIELD_BITS):
            value = (value << 1) | next(bits)
        return value

    constants = []
    for _ in range((FULL_ROUNDS + PARTIAL_ROUNDS) * WIDTH):
        value = draw()
        while value >= MODULUS:
            value = draw()
        constants.append(value)
    while True:
        xy = [draw() % MODULUS for _ in range(2 * WIDTH)]
        xs, ys = xy[:WIDTH], xy[WIDTH:]
        if len(set(xy)) == len(xy) and all((x + y) % MODULUS for x in xs for y in ys):
            break
    mds = tuple(tuple(inverse(x + y) for y in ys) for x in xs)
    return tuple(constants), mds


def _is_full(round_index: int) -> bool:
    half = FULL_ROUNDS // 2
    return round_index < half or round_index >= half + PARTIAL_ROUNDS


def _compacts_after(round_index: int) -> bool:
    """Whether lanes 1 and 2 are re-allocated after this round: every COMPACT_EVERY-th
    partial one."""
    return (not _is_full(round_index)
            and (round_index - FULL_ROUNDS // 2) % COMPACT_EVERY == COMPACT_EVERY - 1)


# One permutation's trace: per S-box its input x, x^2, x^4, x^5; after every COMPACT_EVERY-th
# partial round lanes 1 and 2; then the output state. The values-only gadget records its
# variables and rows from it, and `permute` is its last WIDTH elements.
TRACE_LENGTH = (4 * (WIDTH * FULL_ROUNDS + PARTIAL_ROUNDS) + 2 * (PARTIAL_ROUNDS // COMPACT_EVERY)
                + WIDTH)


def trace_python(state: list[int]) -> list[int]:
    """The trace in Python: the reference for the native kernel, and its fallback."""
    constants, mds = parameters()
    m = MODULUS
    out: list[int] = []
    s = [v % m for v in state]
    for r in range(FULL_ROUNDS + PARTIAL_ROUNDS):
        base = r * WIDTH
        s = [(s[0] + constants[base]) % m, (s[1] + constants[base + 1]) % m,
             (s[2] + constants[base + 2]) % m]
        for i in range(WIDTH if _is_full(r) else 1):
            x = s[i]
            x2 = x * x % m
            x4 = x2 * x2 % m
            s[i] = x4 * x % m
            out += (x, x2, x4, s[i])
        if _compacts_after(r):
            out += s[1:]
        s = [(row[0] * s[0] + row[1] * s[1] + row[2] * s[2]) % m for row in mds]
    return out + s


@cache
def _parameter_limbs() -> tuple[np.ndarray, np.ndarray]:
    constants, mds = parameters()
    return ints_to_limbs(constants), ints_to_limbs(v for row in mds for v in row)


def _trace_limbs(lib: native.NativeFr, state: list[int]) -> np.ndarray:
    constants, mds = _parameter_limbs()
    return lib.poseidon_trace(ints_to_limbs(v % MODULUS for v in state), constants, mds,
                              FULL_ROUNDS, PARTIAL_ROUNDS, COMPACT_EVERY, TRACE_LENGTH)


def trace_native(lib: native.NativeFr, state: list[int]) -> list[int]:
    return limbs_to_ints(_trace_limbs(lib, state))


# looked up once: each native.load() searches PATH for the compiler, which costs more than a
# permutation's native trace
_native_fr = cache(native.load)


def trace(state: list[int]) -> list[int]:
    lib = _native_fr()
    return trace_python(state) if lib is None else trace_native(lib, state)


def permute(state: list[int]) -> list[int]:
    lib = _native_fr()
    if lib is None:
        return trace_python(state)[-WIDTH:]
    return limbs_to_ints(_trace_limbs(lib, state)[-WIDTH:])  # converts only the output


def hash2(left: int, right: int) -> int:
    return permute([0, left, right])[0]


def hash_chain(values: list[int]) -> int:
    """Fold a list of >= 2 elements: h(h(h(v0, v1), v2), ...)."""
    acc = hash2(values[0], values[1])
    for v in values[2:]:
        acc = hash2(acc, v)
    return acc


def _sbox(cs: ConstraintSystem, x: Num) -> Num:
    x2 = mul(cs, x, x)
    x4 = mul(cs, x2, x2)
    return mul(cs, x4, x)


def permute_gadget(cs: ConstraintSystem, state: list[Num]) -> list[Num]:
    if not cs.matrices:
        return _permute_values_only(cs, state)
    constants, mds = parameters()
    s = list(state)
    for r in range(FULL_ROUNDS + PARTIAL_ROUNDS):
        s = [linear([(1, v)], constants[r * WIDTH + i]) for i, v in enumerate(s)]
        if _is_full(r):
            s = [_sbox(cs, v) for v in s]
        else:
            s[0] = _sbox(cs, s[0])
            if _compacts_after(r):
                s[1:] = [compact(cs, v) for v in s[1:]]
        s = [linear(list(zip(row, s))) for row in mds]
    return s


@cache
def _trace_rows() -> tuple[itemgetter, itemgetter, itemgetter, itemgetter]:
    """Where the values-only gadget takes its new variables and its rows' a, b, c from a trace
    (index TRACE_LENGTH is the constant 1), in the order permute_gadget allocates and adds
    them."""
    allocs: list[int] = []
    a: list[int] = []
    b: list[int] = []
    c: list[int] = []
    one = TRACE_LENGTH
    pos = 0
    for r in range(FULL_ROUNDS + PARTIAL_ROUNDS):
        for _ in range(WIDTH if _is_full(r) else 1):  # x*x = x2, x2*x2 = x4, x4*x = x5
            allocs += (pos + 1, pos + 2, pos + 3)
            a += (pos, pos + 1, pos + 2)
            b += (pos, pos + 1, pos)
            c += (pos + 1, pos + 2, pos + 3)
            pos += 4
        if _compacts_after(r):
            allocs += (pos, pos + 1)  # lane * 1 = fresh variable
            a += (pos, pos + 1)
            b += (one, one)
            c += (pos, pos + 1)
            pos += 2
    if pos + WIDTH != TRACE_LENGTH:
        raise AssertionError("the trace layout disagrees with TRACE_LENGTH")
    return itemgetter(*allocs), itemgetter(*a), itemgetter(*b), itemgetter(*c)


def _permute_values_only(cs: ConstraintSystem, state: list[Num]) -> list[Num]:
    """permute_gadget for a values-only system: the same variables and rows in the same order
    (tests compare both modes row by row), taken from one trace of the permutation."""
    values = trace([x.value for x in state])
    values.append(1)
    allocs, a, b, c = _trace_rows()
    cs.extend(allocs(values), a(values), b(values), c(values))
    return [Num(None, v) for v in values[TRACE_LENGTH - WIDTH:TRACE_LENGTH]]


def hash2_gadget(cs: ConstraintSystem, left: Num, right: Num) -> Num:
    return permute_gadget(cs, [constant(0), left, right])[0]


def hash_chain_gadget(cs: ConstraintSystem, values: list[Num]) -> Num:
    acc = hash2_gadget(cs, values[0], values[1])
    for v in values[2:]:
        acc = hash2_gadget(cs, acc, v)
    return acc
