"""End to end with the real tiny prover through the HTTP API: process-pool synthesis, device
workers, split proving, finalizers; every proof is re-verified here from the JSON result."""

import asyncio

import pytest

from cuzk_engine.config import EngineConfig
from cuzk_engine.daemon import EngineDaemon
from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.engine.snapshot import EngineSnapshot, snapshot_violations
from cuzk_engine.groth16 import VerifyingKey, verify
from cuzk_engine.vocabulary import KINDS
from tests.cuzk_engine.conftest import snapshot_when


@pytest.fixture(scope="module")
def param_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("params")


def config(param_cache, *, pipelined=True):
    cfg = EngineConfig()
    cfg.devices = ["cpu"]
    cfg.synthesis_workers = 2
    cfg.gpu_workers_per_device = 2
    cfg.memory.total_budget = 1024**3
    cfg.param_cache = param_cache
    cfg.pipeline.enabled = pipelined
    cfg.daemon.listen = "127.0.0.1:0"
    cfg.daemon.stream_interval = 0.02
    return cfg


def check_result(result):
    assert result["status"] == "done", result["error"]
    assert result["verified"] is True
    vk = VerifyingKey.from_json(result["vk"])
    blob = bytes.fromhex(result["proof"])
    assert len(blob) == 192 * result["partitions"]
    for i, inputs in enumerate(result["public_inputs"]):
        assert verify(vk, [int(x) for x in inputs], blob[192 * i:192 * (i + 1)])
    t = result["timings"]
    assert t["total_ms"] >= t["queue_ms"] >= 0 and t["gpu_ms"] > 0 and t["synthesis_ms"] > 0


async def watch(client, stop, seen):
    """Check every streamed snapshot against the status model while jobs run."""
    async for snap in client.stream_snapshots():
        seen["n"] += 1
        seen["bad"] += snapshot_violations(snap)
        for w in snap.gpu_workers:
            if w.state == "proving":
                seen["busy"] += 1
        for p in snap.pipelines:
            for pt in p.partitions:
                seen["states"].add(pt.state)
        if stop.is_set():
            return


def violations_of(snap_json):
    return snapshot_violations(EngineSnapshot.from_json(snap_json))


@pytest.mark.slow
async def test_all_four_kinds_concurrently_through_http(param_cache):
    d = EngineDaemon(config(param_cache))
    await d.start()
    try:
        async with EngineClient(d.url) as c:
            stop = asyncio.Event()
            seen = {"n": 0, "bad": [], "busy": 0, "states": set()}
            watcher = asyncio.create_task(watch(c, stop, seen))
            jobs = [await c.submit(k, "tiny", 11 + i) for i, k in enumerate(KINDS)]
            results = []
            for j in jobs:
                results.append(await c.get(j["job_id"], wait=240))
            stop.set()
            watcher.cancel()
            for r in results:
                check_result(r)
            assert seen["bad"] == [] and seen["n"] > 10
            assert seen["busy"] > 0  # workers were seen proving while they proved
            assert {"synthesizing", "gpu", "finalizing", "done"} <= seen["states"]
            snap = await c.status()
            assert snap["counters"]["total_completed"] == 4
            assert snap["counters"]["completed_by_kind"] == dict.fromkeys(KINDS, 1)
            assert snap["counters"]["total_failed"] == snap["counters"]["total_cancelled"] == 0
            assert all(w["state"] == "idle" for w in snap["gpu_workers"])
            assert snap["synthesis"]["active"] == 0
            params = sum(a["bytes"] for a in snap["allocations"]["srs"])
            assert snap["memory"]["used_bytes"] == params  # only parameters stay reserved
            for circuit in {r["circuit_id"] for r in results}:
                await c.evict(circuit)
            assert (await c.status())["memory"]["used_bytes"] == 0
            metrics = await c.metrics()
            assert 'cuzk_proofs_completed_total{proof_kind="snap_update"} 1.0' in metrics
    finally:
        await d.stop()


@pytest.mark.slow
async def test_cancel_running_snap_update_then_monolithic_engine_still_proves(param_cache):
    d = EngineDaemon(config(param_cache))
    await d.start()
    try:
        async with EngineClient(d.url) as c:
            job = await c.submit("snap-update", "tiny", 5)
            on_device = await snapshot_when(
                d.engine, lambda s: any(pt.state in ("gpu", "finalizing")
                                        for p in s.pipelines for pt in p.partitions),
                "a partition of the snap-update on a device", timeout=60)
            # the job is cancelled while it runs, not while it waits in the queue
            assert on_device.pipelines[0].status == "running"
            cancelled = await c.cancel(job["job_id"])
            assert cancelled["status"] == "cancelled"
            await asyncio.wait_for(d.engine.get(job["job_id"]).settled.wait(), 60)
            snap = await c.status()
            assert violations_of(snap) == []
            assert snap["counters"]["total_cancelled"] == 1
            assert all(w["state"] == "idle" for w in snap["gpu_workers"])
            params = sum(a["bytes"] for a in snap["allocations"]["srs"])
            assert snap["memory"]["used_bytes"] == params
            after = await c.get((await c.submit("winning-post", "tiny", 6))["job_id"], wait=120)
            check_result(after)
    finally:
        await d.stop()
    mono = EngineDaemon(config(param_cache, pipelined=False))
    await mono.start()
    try:
        async with EngineClient(mono.url) as c:
            assert len((await c.status())["gpu_workers"]) == 1
            jobs = [await c.submit(k, "tiny", 21) for k in ("window-post", "porep-c2")]
            for j in jobs:
                check_result(await c.get(j["job_id"], wait=240))
    finally:
        await mono.stop()
