"""Real proofs for every tiny kind, checked by our verifier and independently by blst."""

import json

import pytest

from cuzk_engine import circuits, groth16
from cuzk_engine.backend import select_backend
from cuzk_engine.engine.stages import synthesize
from cuzk_engine.errors import InvalidRequest, ProofFormatError, UnsatisfiedCircuit
from cuzk_engine.field import MODULUS
from cuzk_engine.r1cs import ConstraintSystem
from cuzk_engine.vocabulary import KINDS
from tests.cuzk_engine.conftest import blst_verify


@pytest.fixture(scope="module")
def proved(tiny_params):
    """kind -> (vk json, [public inputs per partition], [proof per partition])."""
    backend = select_backend("cpu")
    out = {}
    for kind in KINDS:
        params = tiny_params[kind]
        inputs, proofs = [], []
        for partition in range(circuits.partition_count(kind, "tiny")):
            synth = synthesize(kind, "tiny", 11, partition)
            if partition % 2:
                proof = groth16.prove_finish(groth16.prove_start(synth, params, backend), params)
            else:
                proof = groth16.prove(synth, params, backend)
            inputs.append(synth.public_inputs)
            proofs.append(proof)
        out[kind] = (params.vk.to_json(), inputs, proofs)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_partition_verifies_with_us_and_with_blst(kind, proved, tiny_params):
    vk_json, inputs, proofs = proved[kind]
    vk = groth16.VerifyingKey.from_json(json.loads(json.dumps(vk_json)))
    assert len(proofs) == circuits.partition_count(kind, "tiny")
    for public, proof in zip(inputs, proofs):
        assert len(proof) == 192
        assert groth16.verify(vk, public, proof)
        assert blst_verify(vk_json, public, proof)
    assert all(groth16.verify_partitions(vk, inputs, b"".join(proofs)))


def _rejects(vk, vk_json, public, proof) -> bool:
    try:
        ours = groth16.verify(vk, public, proof)
    except ProofFormatError:
        return True  # a malformed point is a rejection too
    return not ours


def test_flipping_any_byte_breaks_the_proof(proved, tiny_params):
    vk_json, inputs, proofs = proved["winning-post"]
    vk = tiny_params["winning-post"].vk
    proof = proofs[0]
    for i in range(len(proof)):
        for mask in (0x01, 0x80):
            bad = bytearray(proof)
            bad[i] ^= mask
            assert _rejects(vk, vk_json, inputs[0], bytes(bad)), (i, mask)


@pytest.mark.parametrize("kind", KINDS)
def test_changing_any_public_input_fails(kind, proved, tiny_params):
    vk_json, inputs, proofs = proved[kind]
    vk = tiny_params[kind].vk
    for i in range(len(inputs[0])):
        bad = list(inputs[0])
        bad[i] = (bad[i] + 1) % MODULUS
        assert not groth16.verify(vk, bad, proofs[0]), i
        assert not blst_verify(vk_json, bad, proofs[0])


@pytest.mark.parametrize("kind", ["snap-update", "porep-c2"])
def test_swapping_two_partitions_fails(kind, proved, tiny_params):
    _, inputs, proofs = proved[kind]
    swapped = [proofs[1], proofs[0], *proofs[2:]]
    results = groth16.verify_partitions(tiny_params[kind].vk, inputs, b"".join(swapped))
    assert results[:2] == [False, False] and all(results[2:])


def test_proofs_are_blinded(tiny_params):
    params = tiny_params["window-post"]
    synth = synthesize("window-post", "tiny", 1, 0)
    first, second = groth16.prove(synth, params), groth16.prove(synth, params)
    assert first != second
    assert groth16.verify(params.vk, synth.public_inputs, second)


def test_verify_rejects_malformed_input(proved, tiny_params):
    _, inputs, proofs = proved["winning-post"]
    vk = tiny_params["winning-post"].vk
    with pytest.raises(ProofFormatError, match="192 bytes"):
        groth16.verify(vk, inputs[0], proofs[0][:-1])
    with pytest.raises(ProofFormatError, match="not a field element"):
        groth16.verify(vk, [MODULUS, *inputs[0][1:]], proofs[0])
    with pytest.raises(ProofFormatError, match="public inputs"):
        groth16.verify(vk, inputs[0][:-1], proofs[0])
    with pytest.raises(ProofFormatError):
        groth16.split_proofs(proofs[0] * 2, 3)


def test_point_outside_the_subgroup_is_rejected(proved, tiny_params):
    from cuzk_engine.curve import G1Point

    # x = 4 gives a point on E(Fp) of order not dividing r (the curve's cofactor part)
    x = 4
    p = 0x1A0111EA397FE69A4B1BA7B6434BACD764774B84F38512BF6730D2A0F6B0F6241EABFFFEB153FFFFB9FEFFFFFFFFAAAB
    while pow(x**3 + 4, (p - 1) // 2, p) != 1:
        x += 1
    y = pow(x**3 + 4, (p + 1) // 4, p)
    point = G1Point.from_xy_bytes_unchecked_be(x.to_bytes(48, "big") + y.to_bytes(48, "big"))
    assert not point.is_in_subgroup()
    _, inputs, proofs = proved["winning-post"]
    bad = point.to_compressed_bytes() + proofs[0][48:]
    with pytest.raises(ProofFormatError, match="subgroup"):
        groth16.verify(tiny_params["winning-post"].vk, inputs[0], bad)
    vk_json = dict(tiny_params["winning-post"].vk.to_json())
    vk_json["alpha_g1"] = point.to_compressed_bytes().hex()
    with pytest.raises(ProofFormatError, match="subgroup"):
        groth16.VerifyingKey.from_json(vk_json)


def test_synthesis_for_other_parameters_is_refused(tiny_params):
    synth = synthesize("porep-c2", "tiny", 1, 0)
    with pytest.raises(InvalidRequest, match="parameters are for"):
        groth16.prove_start(synth, tiny_params["winning-post"])


def test_synthesis_and_pending_proof_pickle(tiny_params):
    import pickle

    synth = synthesize("winning-post", "tiny", 2, 0)
    synth2 = pickle.loads(pickle.dumps(synth))
    assert synth2.nbytes == synth.nbytes > 0
    params = tiny_params["winning-post"]
    pending = pickle.loads(pickle.dumps(groth16.prove_start(synth2, params)))
    assert pending.nbytes > 0
    assert groth16.verify(params.vk, synth.public_inputs, groth16.prove_finish(pending, params))


def test_the_prover_takes_any_constraint_system_and_refuses_an_unsatisfied_one():
    """groth16 knows no circuit: it takes a sealed constraint system, whoever built it."""
    def product(claimed: int) -> ConstraintSystem:
        cs = ConstraintSystem(matrices=False)
        x, y, z = cs.alloc_input(3), cs.alloc(4), cs.alloc(claimed)
        cs.enforce({x: 1}, {y: 1}, {z: 1})  # x * y = z
        cs.seal()
        return cs

    synth = groth16.Synthesis.from_constraint_system(product(12), "x-times-y", partition=5)
    assert (synth.circuit_id, synth.partition, synth.public_inputs) == ("x-times-y", 5, [3])
    assert synth.num_constraints == 3  # the product and the two public input bindings
    with pytest.raises(UnsatisfiedCircuit, match="constraint 0"):
        groth16.Synthesis.from_constraint_system(product(13), "x-times-y")
