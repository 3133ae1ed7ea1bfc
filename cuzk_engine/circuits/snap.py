"""snap-update (sector update): at each challenged node, new = old + data * rho, and the
three values are included in the old-replica, data and new-replica trees.

Unwritten leaves are zero in all three trees, which keeps new = old + data * rho true at every
node. rho = Poseidon(comm_r_old, comm_d) is computed outside the circuit and made public.
Public inputs, in order: comm_r_old, comm_d, comm_r_new, the challenge indices, the partition
index, rho.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cuzk_engine.circuits.common import derive, derive_index, enforce_inclusion, index_bits
from cuzk_engine.field import MODULUS
from cuzk_engine.gadgets import alloc, alloc_input, linear
from cuzk_engine.gadgets.merkle import SparseMerkleTree
from cuzk_engine.gadgets.poseidon import hash2
from cuzk_engine.r1cs import ConstraintSystem

PARTITIONS = 16


@dataclass(frozen=True)
class SnapShape:
    challenges: int  # per partition
    depth: int

    def constraints(self, per_hash: int) -> int:
        per_challenge = (self.depth + 1) + 3 * (self.depth * (1 + per_hash) + 1) + 1
        return self.challenges * per_challenge

    @property
    def num_public_inputs(self) -> int:
        return 3 + self.challenges + 2


@lru_cache(maxsize=4)  # the partitions of one request share the sector
def _sector(shape: SnapShape, labels: tuple):
    """All partitions' challenges and the three trees over the sector they touch."""
    size = 1 << shape.depth
    challenges = [[derive_index(size, *labels, "challenge", p, k) for k in range(shape.challenges)]
                  for p in range(PARTITIONS)]
    touched = {i for part in challenges for i in part}
    old = {i: derive(*labels, "old", i) for i in touched}
    data = {i: derive(*labels, "data", i) for i in touched}
    old_tree = SparseMerkleTree(shape.depth, old)
    data_tree = SparseMerkleTree(shape.depth, data)
    rho = hash2(old_tree.root, data_tree.root)
    new = {i: (old[i] + data[i] * rho) % MODULUS for i in touched}
    return challenges, old_tree, data_tree, SparseMerkleTree(shape.depth, new), rho


def synthesize_snap(cs: ConstraintSystem, shape: SnapShape, labels: tuple, partition: int) -> None:
    challenges, old_tree, data_tree, new_tree, rho_value = _sector(shape, labels)
    comm_r_old = alloc_input(cs, old_tree.root)
    comm_d = alloc_input(cs, data_tree.root)
    comm_r_new = alloc_input(cs, new_tree.root)
    index_inputs = [alloc_input(cs, i) for i in challenges[partition]]
    alloc_input(cs, partition)
    rho = alloc_input(cs, rho_value)

    for k, index in enumerate(challenges[partition]):
        cs.label(f"challenge {k}: index bits")
        bits = index_bits(cs, index_inputs[k], shape.depth)
        old = alloc(cs, old_tree.leaf(index))
        data = alloc(cs, data_tree.leaf(index))
        new = alloc(cs, new_tree.leaf(index))
        cs.label(f"challenge {k}: encoding new = old + data * rho")
        delta = linear([(1, new), (-1, old)])
        cs.enforce(data.lc, rho.lc, delta.lc, (data.value, rho.value, delta.value))
        enforce_inclusion(cs, old_tree, index, old, bits, comm_r_old)
        enforce_inclusion(cs, data_tree, index, data, bits, comm_d)
        enforce_inclusion(cs, new_tree, index, new, bits, comm_r_new)
