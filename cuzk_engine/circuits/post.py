"""Proof-of-spacetime kinds: inclusion of challenged leaves in sector trees.

winning-post: one sector, `challenges` leaves. window-post: `sectors` sectors, `challenges`
leaves each. Public inputs, in order: the sector roots, the challenge indices (sector-major),
the partition index.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuzk_engine.circuits.common import derive, derive_index, enforce_inclusion, index_bits
from cuzk_engine.gadgets import alloc, alloc_input
from cuzk_engine.gadgets.merkle import SparseMerkleTree
from cuzk_engine.r1cs import ConstraintSystem


@dataclass(frozen=True)
class PostShape:
    sectors: int
    challenges: int  # per sector
    depth: int

    def constraints(self, per_hash: int) -> int:
        per_challenge = (self.depth + 1) + self.depth * (1 + per_hash) + 1
        return self.sectors * self.challenges * per_challenge

    @property
    def num_public_inputs(self) -> int:
        return self.sectors + self.sectors * self.challenges + 1


def synthesize_post(cs: ConstraintSystem, shape: PostShape, labels: tuple, partition: int) -> None:
    size = 1 << shape.depth
    trees, challenges = [], []
    for s in range(shape.sectors):
        idx = [derive_index(size, *labels, "challenge", partition, s, k)
               for k in range(shape.challenges)]
        leaves = {i: derive(*labels, "leaf", s, i) for i in idx}
        trees.append(SparseMerkleTree(shape.depth, leaves))
        challenges.append(idx)

    roots = [alloc_input(cs, tree.root) for tree in trees]
    index_inputs = [[alloc_input(cs, i) for i in idx] for idx in challenges]
    alloc_input(cs, partition)

    for s, tree in enumerate(trees):
        for k, index in enumerate(challenges[s]):
            cs.label(f"sector {s} challenge {k}: index bits")
            bits = index_bits(cs, index_inputs[s][k], shape.depth)
            leaf = alloc(cs, tree.leaf(index))
            enforce_inclusion(cs, tree, index, leaf, bits, roots[s])
