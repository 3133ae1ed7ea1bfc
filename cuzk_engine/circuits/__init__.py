"""The proof kinds, their size profiles, and circuit synthesis into an R1CS.

Every partition of a kind has the same circuit shape (so one parameter set and one VK serve
all partitions); only the witness and the public inputs differ. Synthetic sector data derives
from (kind, profile, seed), challenges from (kind, profile, seed, partition).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from cuzk_engine.circuits.porep import PARTITIONS as POREP_PARTITIONS
from cuzk_engine.circuits.porep import PorepShape, synthesize_porep
from cuzk_engine.circuits.post import PostShape, synthesize_post
from cuzk_engine.circuits.snap import PARTITIONS as SNAP_PARTITIONS
from cuzk_engine.circuits.snap import SnapShape, synthesize_snap
from cuzk_engine.errors import InvalidRequest
from cuzk_engine.field import BYTES
from cuzk_engine.gadgets import alloc
from cuzk_engine.gadgets.poseidon import hash2_gadget
from cuzk_engine.r1cs import ConstraintSystem

# defined with the vocabulary (a `prove` names its parameter files before importing this package)
from cuzk_engine.vocabulary import MAX_SEED as MAX_SEED
from cuzk_engine.vocabulary import check_kind_profile as check_kind_profile
from cuzk_engine.vocabulary import circuit_id as circuit_id
from cuzk_engine.vocabulary import parse_circuit_id as parse_circuit_id

# Sized so that tiny <= 2^11, small ~2^14, medium ~2^16 and large >= 2^18 constraints per
# partition, each just under its power of two (the NTT domain is the next power of two of
# constraints + public inputs + 1). Tiny shapes are scaled down further than the rest:
# window-post tiny checks 3 challenges of 1 sector (10 per sector from small up), porep-c2
# tiny labels from 1 parent, because ~260 constraints per Poseidon leave room for only ~7
# hashes in 2^11 constraints.
SHAPES: dict[str, dict[str, PostShape | SnapShape | PorepShape]] = {
    "winning-post": {
        "tiny": PostShape(sectors=1, challenges=2, depth=3),
        "small": PostShape(sectors=1, challenges=6, depth=10),
        "medium": PostShape(sectors=1, challenges=24, depth=10),
        "large": PostShape(sectors=1, challenges=66, depth=16),
    },
    "window-post": {
        "tiny": PostShape(sectors=1, challenges=3, depth=2),
        "small": PostShape(sectors=1, challenges=10, depth=6),
        "medium": PostShape(sectors=2, challenges=10, depth=12),
        "large": PostShape(sectors=8, challenges=10, depth=13),
    },
    "snap-update": {
        "tiny": SnapShape(challenges=1, depth=2),
        "small": SnapShape(challenges=2, depth=10),
        "medium": SnapShape(challenges=8, depth=10),
        "large": SnapShape(challenges=34, depth=10),
    },
    "porep-c2": {
        "tiny": PorepShape(challenges=1, parents=1, depth=2),
        "small": PorepShape(challenges=1, parents=4, depth=11),
        "medium": PorepShape(challenges=4, parents=4, depth=11),
        "large": PorepShape(challenges=17, parents=4, depth=11),
    },
}

PARTITIONS = {"winning-post": 1, "window-post": 1, "snap-update": SNAP_PARTITIONS,
              "porep-c2": POREP_PARTITIONS}

# each takes (cs, its kind's shape, labels, partition)
_SYNTHESIZERS: dict[str, Callable[..., None]] = {
    "winning-post": synthesize_post, "window-post": synthesize_post,
    "snap-update": synthesize_snap, "porep-c2": synthesize_porep,
}


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidRequest(f"seed must be an integer, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise InvalidRequest(f"seed {seed} is outside [0, {MAX_SEED}]")
    return seed


def partition_count(kind: str, profile: str) -> int:
    check_kind_profile(kind, profile)
    return PARTITIONS[kind]


@cache
def constraints_per_hash() -> int:
    cs = ConstraintSystem()
    hash2_gadget(cs, alloc(cs, 1), alloc(cs, 2))
    return cs.num_constraints


def num_public_inputs(kind: str, profile: str) -> int:
    check_kind_profile(kind, profile)
    return SHAPES[kind][profile].num_public_inputs


def constraint_count(kind: str, profile: str) -> int:
    """Exact constraints per partition, including one binding row per public input and ONE."""
    check_kind_profile(kind, profile)
    shape = SHAPES[kind][profile]
    return shape.constraints(constraints_per_hash()) + shape.num_public_inputs + 1


def domain_size(kind: str, profile: str) -> int:
    return 1 << (constraint_count(kind, profile) - 1).bit_length()


def working_set_bytes(kind: str, profile: str) -> int:
    """Estimated bytes one synthesized partition holds: the witness (about one variable per
    constraint) plus the a/b/c evaluations padded to the domain."""
    return BYTES * (constraint_count(kind, profile) + 3 * domain_size(kind, profile))


def build(kind: str, profile: str, seed: int, partition: int,
          matrices: bool = True) -> ConstraintSystem:
    """Synthesize one partition into a sealed constraint system (witness included); with
    matrices=False only values are kept (what the prover needs, several times faster)."""
    check_kind_profile(kind, profile)
    check_seed(seed)
    count = PARTITIONS[kind]
    if isinstance(partition, bool) or not isinstance(partition, int) or not (
            0 <= partition < count):
        raise InvalidRequest(
            f"partition {partition!r} is out of range: {kind} has {count} partition(s)")
    cs = ConstraintSystem(matrices=matrices)
    _SYNTHESIZERS[kind](cs, SHAPES[kind][profile], (kind, profile, seed), partition)
    cs.seal()
    return cs
