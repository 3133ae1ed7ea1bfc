"""Shared prover fixtures: one parameter cache per test session holding every tiny circuit,
and an independent Groth16 verifier written on pyblst (blst), not on the library we test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pyblst import BlstP1Element, BlstP2Element, final_verify, miller_loop

from cuzk_engine import circuits, groth16
from cuzk_engine.engine.orchestrator import Engine
from cuzk_engine.engine.snapshot import EngineSnapshot
from cuzk_engine.engine.stages import ensure_parameters
from cuzk_engine.vocabulary import KINDS


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("params")
    for kind in KINDS:
        ensure_parameters(cache, kind, "tiny")
    return cache


@pytest.fixture(scope="session")
def tiny_params(tiny_cache):
    return {kind: groth16.load_parameters(tiny_cache, circuits.circuit_id(kind, "tiny"))
            for kind in KINDS}


def blst_verify(vk_json: dict, public_inputs: list[int], proof: bytes) -> bool:
    """Groth16 check e(A,B) = e(alpha,beta) e(IC,gamma) e(C,delta) with blst."""
    def g1(text: str):
        return BlstP1Element.uncompress(bytes.fromhex(text))

    def g2(text: str):
        return BlstP2Element.uncompress(bytes.fromhex(text))

    a = BlstP1Element.uncompress(proof[:48])
    b = BlstP2Element.uncompress(proof[48:144])
    c = BlstP1Element.uncompress(proof[144:])
    ic = [g1(h) for h in vk_json["ic"]]
    acc = ic[0]
    for x, point in zip(public_inputs, ic[1:], strict=True):
        acc = acc + point.scalar_mul(x)
    rhs = (miller_loop(g1(vk_json["alpha_g1"]), g2(vk_json["beta_g2"]))
           * miller_loop(acc, g2(vk_json["gamma_g2"]))
           * miller_loop(c, g2(vk_json["delta_g2"])))
    return final_verify(miller_loop(a, b), rhs)


async def snapshot_when(engine: Engine, holds: Callable[[EngineSnapshot], bool], what: str,
                        timeout: float = 10.0) -> EngineSnapshot:
    """The first snapshot of ``engine`` for which ``holds`` is true. Woken by the tracker's
    change notifications: it looks again as soon as anything changed, never on a timer."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def poke() -> None:  # called from the writer's thread
        loop.call_soon_threadsafe(changed.set)

    engine.tracker.add_listener(poke)
    try:
        async with asyncio.timeout(timeout):
            while True:
                changed.clear()  # before reading: a change after the read wakes us again
                snap = engine.snapshot()
                if holds(snap):
                    return snap
                await changed.wait()
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:g}s") from None
    finally:
        engine.tracker.remove_listener(poke)
