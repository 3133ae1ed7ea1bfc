"""porep-c2: at each challenged node, its label is the labeling hash of its parents' labels,
and the node and every parent are included in the sector's label tree (comm_r).

Challenged nodes live in the upper half of the sector and their parents in the lower half
(the previous layer's data in a stacked graph), so no label is both derived and random.
label(c) = Poseidon chain over [replica_id, label(parent_0), ..., label(parent_{P-1})].
Public inputs, in order: comm_r, replica_id, the challenge indices, the parent indices
(challenge-major), the partition index.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cuzk_engine.circuits.common import derive, derive_index, enforce_inclusion, index_bits
from cuzk_engine.gadgets import alloc, alloc_input
from cuzk_engine.gadgets.merkle import SparseMerkleTree
from cuzk_engine.gadgets.poseidon import hash_chain, hash_chain_gadget
from cuzk_engine.r1cs import ConstraintSystem

PARTITIONS = 10


@dataclass(frozen=True)
class PorepShape:
    challenges: int  # per partition
    parents: int
    depth: int

    def constraints(self, per_hash: int) -> int:
        nodes = 1 + self.parents
        per_challenge = (nodes * (self.depth + 1) + self.parents * per_hash
                         + nodes * (self.depth * (1 + per_hash) + 1))
        return self.challenges * per_challenge

    @property
    def num_public_inputs(self) -> int:
        return 2 + self.challenges * (1 + self.parents) + 1


@lru_cache(maxsize=4)  # the partitions of one request share the sector
def _sector(shape: PorepShape, labels: tuple):
    half = 1 << (shape.depth - 1)
    replica_id = derive(*labels, "replica-id")
    challenges = [[half + derive_index(half, *labels, "challenge", p, k)
                   for k in range(shape.challenges)] for p in range(PARTITIONS)]
    parents = {c: [derive_index(half, *labels, "parent", c, j) for j in range(shape.parents)]
               for part in challenges for c in part}
    leaves = {}
    for c, ps in parents.items():
        for p in ps:
            leaves[p] = derive(*labels, "base-label", p)
    for c, ps in parents.items():
        leaves[c] = hash_chain([replica_id] + [leaves[p] for p in ps])
    return replica_id, challenges, parents, SparseMerkleTree(shape.depth, leaves)


def synthesize_porep(cs: ConstraintSystem, shape: PorepShape, labels: tuple,
                     partition: int) -> None:
    replica_id_value, challenges, parents, tree = _sector(shape, labels)
    mine = challenges[partition]
    comm_r = alloc_input(cs, tree.root)
    replica_id = alloc_input(cs, replica_id_value)
    challenge_inputs = [alloc_input(cs, c) for c in mine]
    parent_inputs = [[alloc_input(cs, p) for p in parents[c]] for c in mine]
    alloc_input(cs, partition)

    for k, c in enumerate(mine):
        parent_labels = []
        for j, p in enumerate(parents[c]):
            cs.label(f"challenge {k} parent {j}: index bits")
            bits = index_bits(cs, parent_inputs[k][j], shape.depth)
            label = alloc(cs, tree.leaf(p))
            enforce_inclusion(cs, tree, p, label, bits, comm_r)
            parent_labels.append(label)
        cs.label(f"challenge {k}: labeling hash")
        label = hash_chain_gadget(cs, [replica_id, *parent_labels])
        cs.label(f"challenge {k}: index bits")
        bits = index_bits(cs, challenge_inputs[k], shape.depth)
        enforce_inclusion(cs, tree, c, label, bits, comm_r)
