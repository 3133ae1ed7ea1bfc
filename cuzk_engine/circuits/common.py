"""What all proof kinds share: deterministic synthetic data and the index/inclusion steps."""

from __future__ import annotations

import hashlib

from cuzk_engine.field import MODULUS
from cuzk_engine.gadgets import Num, enforce_equal, to_bits_le
from cuzk_engine.gadgets.merkle import SparseMerkleTree, root_gadget
from cuzk_engine.r1cs import ConstraintSystem


def derive(*labels: object) -> int:
    """A field element determined by the labels (kind, profile, seed, purpose, indices...)."""
    digest = hashlib.blake2b(repr(labels).encode(), digest_size=64).digest()
    return int.from_bytes(digest, "little") % MODULUS


def derive_index(bound: int, *labels: object) -> int:
    return derive(*labels) % bound


def index_bits(cs: ConstraintSystem, index_input: Num, depth: int) -> list[Num]:
    """Boolean path bits of a public challenge index, packed back and tied to the input."""
    return to_bits_le(cs, index_input, depth)


def enforce_inclusion(cs: ConstraintSystem, tree: SparseMerkleTree, index: int, leaf: Num,
                      bits: list[Num], root: Num) -> None:
    cs.label(f"inclusion of leaf {index}")
    enforce_equal(cs, root_gadget(cs, leaf, bits, tree.siblings(index)), root)

