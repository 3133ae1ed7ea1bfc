"""Binary Poseidon Merkle trees: a sparse native tree and the in-circuit inclusion check.

Synthetic sectors hold data only at the leaves a proof touches; every other leaf is zero, so a
tree of depth 30 costs (touched leaves x depth) hashes to build, and the empty subtrees'
hashes are computed once per level. A circuit cannot tell the difference: a path is a path.
"""

from __future__ import annotations

from functools import cache

from cuzk_engine.gadgets import Num, alloc, conditional_swap
from cuzk_engine.gadgets.poseidon import hash2, hash2_gadget
from cuzk_engine.r1cs import ConstraintSystem


@cache
def empty_subtree_hash(level: int) -> int:
    """Root of a subtree of 2^level zero leaves."""
    if level == 0:
        return 0
    below = empty_subtree_hash(level - 1)
    return hash2(below, below)


class SparseMerkleTree:
    def __init__(self, depth: int, leaves: dict[int, int]):
        if any(not 0 <= i < (1 << depth) for i in leaves):
            raise ValueError(f"leaf index outside a tree of depth {depth}")
        self.depth = depth
        self.levels: list[dict[int, int]] = [dict(leaves)]
        for level in range(depth):
            below = self.levels[-1]
            above: dict[int, int] = {}
            for parent in {i >> 1 for i in below}:
                above[parent] = hash2(self.node(level, 2 * parent), self.node(level, 2 * parent + 1))
            self.levels.append(above)

    def node(self, level: int, index: int) -> int:
        return self.levels[level].get(index, empty_subtree_hash(level))

    @property
    def root(self) -> int:
        return self.node(self.depth, 0)

    def leaf(self, index: int) -> int:
        return self.node(0, index)

    def siblings(self, index: int) -> list[int]:
        """Sibling hashes from the leaf level up."""
        return [self.node(level, (index >> level) ^ 1) for level in range(self.depth)]


def root_gadget(cs: ConstraintSystem, leaf: Num, bits: list[Num],
                siblings: list[int]) -> Num:
    """The root reached from `leaf` along the path whose direction bits (LSB = leaf level) are
    `bits`, with sibling hashes allocated as private witness values."""
    current = leaf
    for bit, sibling_value in zip(bits, siblings, strict=True):
        sibling = alloc(cs, sibling_value)
        left, right = conditional_swap(cs, bit, current, sibling)
        current = hash2_gadget(cs, left, right)
    return current
