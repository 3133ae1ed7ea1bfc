import random

import pytest

from cuzk_engine import circuits, native
from cuzk_engine.engine.stages import synthesize
from cuzk_engine.errors import InvalidRequest, UnsatisfiedCircuit
from cuzk_engine.field import MODULUS, ints_to_limbs
from cuzk_engine.gadgets import alloc, alloc_bit, conditional_swap, to_bits_le
from cuzk_engine.gadgets.merkle import SparseMerkleTree
from cuzk_engine.gadgets.poseidon import (
    TRACE_LENGTH,
    derive_parameters,
    hash2,
    hash2_gadget,
    parameters,
    permute,
    permute_gadget,
    trace_native,
    trace_python,
)
from cuzk_engine.r1cs import ConstraintSystem
from cuzk_engine.vocabulary import KINDS, PROFILES


def test_poseidon_matches_published_test_vector():
    # poseidonperm_x5_255_3 reference output for the input state [0, 1, 2]
    assert permute([0, 1, 2]) == [
        0x28CE19420FC246A05553AD1E8C98F5C9D67166BE2C18E9E4CB4B4E317DD2A78A,
        0x51F3E312C95343A896CFD8945EA82BA956C1118CE9B9859B6EA56637B4B1DDC4,
        0x3B2B69139B235626A0BFB56C9527AE66A7BF486AD8C11C14D1DA0C69BBE0F79A,
    ]


def test_stored_constants_are_the_grain_derivation():
    # the prover reads them from poseidon_constants instead of deriving them at every start
    constants, mds = derive_parameters()
    assert len(constants) == 3 * (8 + 57) and len(mds) == 3
    assert parameters() == (constants, mds)


@pytest.mark.parametrize("seed", range(3))
def test_native_poseidon_equals_in_circuit(seed):
    rng = random.Random(seed)
    state = [rng.randrange(MODULUS) for _ in range(3)]
    cs = ConstraintSystem()
    out = permute_gadget(cs, [alloc(cs, v) for v in state])
    assert [o.value for o in out] == permute(state)
    cs.check_satisfied()
    x, y = state[:2]
    cs2 = ConstraintSystem()
    assert hash2_gadget(cs2, alloc(cs2, x), alloc(cs2, y)).value == hash2(x, y)
    assert cs2.num_constraints == circuits.constraints_per_hash()
    cs2.check_satisfied()


EDGE_STATES = [[0, 0, 0], [1, 1, 1], [MODULUS - 1] * 3, [0, MODULUS - 1, 1], [MODULUS - 1, 0, 0],
               [2**255 % MODULUS, 2**128, 2**64 - 1]]


@pytest.mark.parametrize("state", EDGE_STATES + [
    [random.Random(seed).randrange(MODULUS) for _ in range(3)] for seed in range(20)])
def test_native_trace_matches_the_python_reference(state):
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: synthesis uses the Python trace")
    expected = trace_python(state)
    assert len(expected) == TRACE_LENGTH
    assert trace_native(lib, state) == expected
    # unreduced inputs are reduced first, as permute always did
    assert trace_native(lib, [v + MODULUS for v in state]) == expected


def test_native_trace_refuses_a_buffer_too_short():
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler")
    constants, mds = parameters()
    with pytest.raises(ValueError, match="trace has -1 rows"):
        lib.poseidon_trace(ints_to_limbs([0, 1, 2]), ints_to_limbs(constants),
                           ints_to_limbs(v for row in mds for v in row), 8, 57, 6,
                           TRACE_LENGTH - 1)


@pytest.mark.parametrize("state", EDGE_STATES)
def test_values_only_permutation_records_the_matrix_build_rows(state):
    full = ConstraintSystem()
    full_out = permute_gadget(full, [alloc(full, v) for v in state])
    full.check_satisfied()
    fast = ConstraintSystem(matrices=False)
    fast.label("other gadget")
    fast_out = permute_gadget(fast, [alloc(fast, v) for v in state])
    assert [o.value for o in fast_out] == [o.value for o in full_out] == permute(state)
    assert fast.values == full.values
    assert (fast.a_vals, fast.b_vals, fast.c_vals) == (full.a_vals, full.b_vals, full.c_vals)
    assert fast.label_of == [1] * full.num_constraints


def test_bulk_rows_are_refused_where_matrices_are_kept_or_sealed():
    with pytest.raises(RuntimeError, match="linear combinations"):
        ConstraintSystem().extend([1], [1], [1], [1])
    sealed = ConstraintSystem(matrices=False)
    sealed.seal()
    with pytest.raises(RuntimeError, match="sealed"):
        sealed.extend([1], [1], [1], [1])


def test_tampered_witness_names_the_failing_constraint():
    cs = ConstraintSystem()
    cs.label("poseidon under test")
    hash2_gadget(cs, alloc(cs, 3), alloc(cs, 4))
    cs.c_vals[17] = (cs.c_vals[17] + 1) % MODULUS
    with pytest.raises(UnsatisfiedCircuit, match=r"constraint 17 \(poseidon under test\)"):
        cs.check_satisfied()


def test_bits_swap_and_density():
    cs = ConstraintSystem()
    x = alloc(cs, 0b1011)
    bits = to_bits_le(cs, x, 4)
    assert [b.value for b in bits] == [1, 1, 0, 1]
    left, right = conditional_swap(cs, bits[0], alloc(cs, 5), alloc(cs, 9))
    assert (left.value, right.value) == (9, 5)
    cs.check_satisfied()
    with pytest.raises(ValueError):
        alloc_bit(cs, 2)
    in_a, in_b = cs.density()
    assert in_a[bits[0].lc.popitem()[0]] and not in_a[0]
    assert any(in_b)


def test_sparse_merkle_paths():
    tree = SparseMerkleTree(4, {3: 11, 9: 22})
    for index in (3, 9, 0):
        node = tree.leaf(index)
        for level, sibling in enumerate(tree.siblings(index)):
            bit = (index >> level) & 1
            node = hash2(sibling, node) if bit else hash2(node, sibling)
        assert node == tree.root


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_circuits_match_their_advertised_size(kind):
    cs = circuits.build(kind, "tiny", 5, circuits.partition_count(kind, "tiny") - 1)
    cs.check_satisfied()
    assert cs.num_constraints == circuits.constraint_count(kind, "tiny") <= 2**11
    assert len(cs.public_inputs) == circuits.num_public_inputs(kind, "tiny")


def test_small_profile_size_is_exact():
    cs = circuits.build("winning-post", "small", 1, 0)
    assert cs.num_constraints == circuits.constraint_count("winning-post", "small")
    assert 2**13 < cs.num_constraints <= 2**14


def test_synthesis_is_deterministic_and_seed_dependent():
    a = synthesize("porep-c2", "tiny", 3, 2)
    b = synthesize("porep-c2", "tiny", 3, 2)
    c = synthesize("porep-c2", "tiny", 4, 2)
    assert a.public_inputs == b.public_inputs and (a.witness == b.witness).all()
    assert a.public_inputs != c.public_inputs


def test_unsatisfied_witness_is_caught_before_proving(monkeypatch):
    real = SparseMerkleTree.siblings
    monkeypatch.setattr(SparseMerkleTree, "siblings",
                        lambda self, index: [s + 1 for s in real(self, index)])
    with pytest.raises(UnsatisfiedCircuit, match="inclusion of leaf"):
        synthesize("winning-post", "tiny", 1, 0)


@pytest.mark.parametrize("kind,profile,seed,partition", [
    ("nope", "tiny", 1, 0), ("porep-c2", "huge", 1, 0), ("porep-c2", "tiny", -1, 0),
    ("porep-c2", "tiny", 2**64, 0), ("porep-c2", "tiny", "1", 0), ("porep-c2", "tiny", 1, 10),
    ("snap-update", "tiny", 1, -1), ("winning-post", "tiny", True, 0),
])
def test_bad_requests_are_rejected(kind, profile, seed, partition):
    with pytest.raises(InvalidRequest):
        synthesize(kind, profile, seed, partition)


def test_contract_constants():
    assert circuits.circuit_id("snap-update", "tiny") == "snap-update.tiny"
    assert [circuits.partition_count(k, "tiny") for k in KINDS] == [1, 1, 16, 10]
    assert circuits.working_set_bytes("porep-c2", "medium") > 3 * 32 * 2**16
    assert circuits.MAX_SEED == 2**64 - 1


def test_every_kind_and_profile_of_the_vocabulary_has_a_circuit_and_no_other():
    assert list(circuits.SHAPES) == list(circuits.PARTITIONS) == list(KINDS)
    assert all(list(by_profile) == list(PROFILES) for by_profile in circuits.SHAPES.values())


@pytest.mark.parametrize("kind", KINDS)
def test_values_only_synthesis_matches_the_matrix_build(kind):
    """The prover's fast values-only path must produce the exact rows the setup saw."""
    full = circuits.build(kind, "tiny", 8, 0)
    full.check_satisfied()
    fast = circuits.build(kind, "tiny", 8, 0, matrices=False)
    assert fast.values == full.values
    assert (fast.a_vals, fast.b_vals, fast.c_vals) == (full.a_vals, full.b_vals, full.c_vals)
