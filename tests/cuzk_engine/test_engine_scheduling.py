"""Orchestrator scheduling behaviour with fast in-process stage stand-ins.

The stand-ins replace synthesize/prove_start/prove_finish/verify so that scheduling, budget,
cancellation and status truthfulness can be exercised in milliseconds. They are used ONLY in
these scheduling tests; tests/cuzk_engine/test_engine_e2e.py drives the real tiny prover.
"""

import asyncio
import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from cuzk_engine.config import EngineConfig
from cuzk_engine.engine.orchestrator import Engine
from cuzk_engine.engine.snapshot import CpuSnapshot, EngineSnapshot, snapshot_violations
from cuzk_engine.engine.stages import Stages
from cuzk_engine.errors import (
    EngineNotAccepting,
    InvalidRequest,
    ParameterFileError,
    RequestConflict,
)
from cuzk_engine.native import msm as native_msm
from tests.cuzk_engine.conftest import snapshot_when

PARTS = {"winning-post": 1, "window-post": 1, "snap-update": 16, "porep-c2": 10}
FAIL_SYNTH_SEED = 666  # partition 1 of this seed fails synthesis
FAIL_DEVICE_SEED = 777  # partition 2 of this seed fails prove_start
WORKING_SET = 1000


@dataclass
class StandInVK:
    cid: str

    def to_json(self):
        return {"stand_in": self.cid}


@dataclass
class StandInParams:
    circuit_id: str
    vk: StandInVK
    nbytes: int = 5000


@dataclass
class StandInSynth:
    circuit_id: str
    seed: int
    partition: int
    public_inputs: list
    nbytes: int = 800


@dataclass
class StandInPending:
    synth: StandInSynth
    nbytes: int = 100


def _digest(cid, public_inputs):
    return hashlib.sha256(f"{cid}{public_inputs}".encode()).digest() * 6  # 192 bytes


class StandInStages:
    """Fast in-process stand-ins for the prover stages (scheduling tests only)."""

    def __init__(self, delay=0.0, finish_gate=None, start_gate=None, param_gate=None,
                 missing=(), generation_gate=None):
        self.delay = delay  # how long synthesis and prove_start work: the sleeps below
        self.finish_gate = finish_gate
        self.start_gate = start_gate  # holds prove_start (a partition on the device)
        self.param_gate = param_gate  # holds parameter generation and loading
        self.missing = set(missing)  # circuits whose parameters must be generated first
        self.generation_gate = generation_gate  # holds generation only, not loading
        self.events = []
        self.lock = threading.Lock()
        self.loads = 0

    def log(self, *ev):
        with self.lock:
            self.events.append(ev)

    def synthesize(self, kind, profile, seed, partition):
        time.sleep(self.delay)
        if seed == FAIL_SYNTH_SEED and partition == 1:
            raise ValueError("injected synthesis failure")
        return StandInSynth(f"{kind}.{profile}", seed, partition, [seed, partition])

    def prove_start(self, synth, params, backend):
        self.log("start", synth.seed, synth.partition)
        if self.start_gate is not None:
            self.start_gate.wait(5)
        time.sleep(self.delay)
        if synth.seed == FAIL_DEVICE_SEED and synth.partition == 2:
            raise RuntimeError("injected device failure")
        return StandInPending(synth)

    def prove_finish(self, pending, params):
        if self.finish_gate is not None:
            self.finish_gate.wait(5)
        self.log("finish", pending.synth.seed, pending.synth.partition)
        return _digest(params.circuit_id, pending.synth.public_inputs)

    def verify(self, vk, public_inputs, proof):
        return proof == _digest(vk.cid, public_inputs)

    def ensure(self, cache, kind, profile, progress=None):
        cid = f"{kind}.{profile}"
        if cid in self.missing:
            if progress is not None:
                progress(1, 2)
            for gate in (self.param_gate, self.generation_gate):
                if gate is not None:
                    gate.wait(5)
            self.missing.discard(cid)

    def file_bytes(self, cache, cid):
        if cid in self.missing:
            raise ParameterFileError(f"{cid}.params: missing")
        return 4000

    def load(self, cache, cid):
        if self.param_gate is not None:
            self.param_gate.wait(5)
        self.loads += 1
        return StandInParams(cid, StandInVK(cid))

    def stages(self):
        return Stages(
            synthesize=self.synthesize, prove_start=self.prove_start,
            prove_finish=self.prove_finish, verify=self.verify,
            ensure_parameters=self.ensure,
            load_parameters=self.load, parameters_file_bytes=self.file_bytes,
            circuit_id=lambda kind, profile: f"{kind}.{profile}",
            partition_count=lambda kind, profile: PARTS[kind],
            working_set_bytes=lambda kind, profile: WORKING_SET,
            select_backend=lambda name: None,
            kinds=tuple(PARTS), profiles=("tiny", "small"), max_seed=2**64 - 1,
            name="stand-in",
        )


def make_config(**kw):
    cfg = EngineConfig()
    cfg.devices = ["cpu"]
    cfg.synthesis_workers = kw.pop("synth", 2)
    cfg.gpu_workers_per_device = kw.pop("workers", 2)
    cfg.memory.total_budget = kw.pop("budget", 100_000)
    cfg.pipeline.enabled = kw.pop("pipelined", True)
    cfg.pipeline.split_prove = kw.pop("split", True)
    cfg.status.retention = kw.pop("retention", 30.0)
    cfg.memory.eviction_min_idle = kw.pop("min_idle", 300.0)
    assert not kw
    return cfg


class Sampler:
    """Takes snapshots from another thread while the engine runs and checks each one."""

    def __init__(self, engine):
        self.engine = engine
        self.count = 0
        self.violations = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            bad = snapshot_violations(self.engine.tracker.snapshot())
            self.count += 1
            if bad:
                self.violations.append(bad)
            self._stop.wait(0.0005)  # a reader's pace, leaving the engine's threads room

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


async def started(cfg, stand_in):
    engine = Engine(cfg, stages=stand_in.stages(), synth_executor=ThreadPoolExecutor(4))
    await engine.start()
    return engine


async def finish(engine, jobs, timeout=20):
    for j in jobs:
        await asyncio.wait_for(j.ended.wait(), timeout)
    await asyncio.wait_for(asyncio.gather(*(j.settled.wait() for j in jobs)), timeout)


async def until_running(engine, job):
    await snapshot_when(engine, lambda s: any(p.job_id == job.job_id and p.status == "running"
                                              for p in s.pipelines), f"{job.job_id} running")


class AwaitedEvent(asyncio.Event):
    """An event that tells when someone starts waiting on it (``awaited``)."""

    def __init__(self):
        super().__init__()
        self.awaited = asyncio.Event()

    async def wait(self):
        self.awaited.set()
        return await super().wait()


def assert_clean(engine, params_loaded=True):
    snap = engine.snapshot()
    assert snapshot_violations(snap) == []
    assert all(w.state == "idle" for w in snap.gpu_workers)
    # only parameter reservations remain: 5000 bytes per loaded circuit
    assert engine.budget.used == 5000 * len(engine.srs.loaded())
    assert snap.synthesis.active == 0


@pytest.mark.parametrize("split", [True, False])
async def test_all_kinds_complete_with_exact_counters_and_truthful_snapshots(split):
    si = StandInStages(delay=0.001)
    engine = await started(make_config(split=split), si)
    with Sampler(engine) as sampler:
        jobs = [engine.submit(k, "tiny", s)[0] for s in range(3) for k in PARTS]
        await finish(engine, jobs)
    assert sampler.violations == [] and sampler.count > 50
    assert all(j.status == "done" and j.verified for j in jobs)
    assert all(len(b"".join(j.proofs)) == 192 * j.partitions for j in jobs)
    c = engine.snapshot().counters
    assert c.total_completed == 12 and c.total_failed == 0
    assert c.completed_by_kind == dict.fromkeys(PARTS, 3)
    assert si.loads == 4  # parameters loaded once per circuit
    assert_clean(engine)
    await engine.stop()
    assert engine.budget.used == 0


async def test_split_prove_worker_picks_up_next_partition_before_finalizer_ends():
    gate = threading.Event()
    si = StandInStages(finish_gate=gate)
    engine = await started(make_config(workers=1, synth=1), si)
    job, _, _ = engine.submit("porep-c2", "tiny", 1)
    # the one worker took partition 1 onto the device while partition 0's prove_finish is
    # still blocked in the finalizer
    snap = await snapshot_when(
        engine, lambda s: [p.state for p in s.pipelines[0].partitions][:2] == [
            "finalizing", "gpu"], "partition 1 on the device while partition 0 finalizes")
    assert snap.pipelines[0].partitions[1].worker_id == 0
    assert [e[0] for e in si.events if e[1:] == (1, 0)] == ["start"]  # not finished
    assert snapshot_violations(snap) == []
    gate.set()
    await finish(engine, [job])
    assert job.status == "done"
    await engine.stop()


async def test_a_jobs_result_and_its_pipeline_read_one_record_on_one_clock():
    engine = await started(make_config(), StandInStages())
    job = engine.submit("porep-c2", "tiny", 1)[0]
    await finish(engine, [job])
    result = engine.result(job)
    pipeline = engine.snapshot().pipelines[0]
    assert (result["status"], result["error"]) == (pipeline.status, pipeline.error) == (
        "done", None)
    assert result["timings"]["queue_ms"] == pipeline.queued_ms
    assert result["timings"]["srs_load_ms"] == pipeline.srs_load_ms
    assert result["timings"]["total_ms"] >= result["timings"]["queue_ms"]
    assert abs(result["submitted_at"] - time.time()) < 60  # wall-clock seconds
    assert set(result) == {
        "job_id", "request_id", "kind", "profile", "seed", "priority", "circuit_id",
        "partitions", "status", "cancelled_by", "submitted_at", "timings", "proof",
        "public_inputs", "vk", "verified", "error", "settled", "partition_states"}
    assert result["settled"] is True
    assert result["partition_states"] == [p._asdict() for p in pipeline.partitions]
    await engine.stop()


async def test_priorities_order_job_starts_and_ready_partitions():
    si = StandInStages(delay=0.002)
    engine = await started(make_config(synth=1, workers=1), si)
    first = engine.submit("porep-c2", "tiny", 1)[0]
    low = engine.submit("snap-update", "tiny", 2, priority="low")[0]
    normal = engine.submit("porep-c2", "tiny", 3)[0]
    crit, pos, _ = engine.submit("winning-post", "tiny", 4)
    assert crit.priority == "critical" and pos == 0
    await finish(engine, [first, low, normal, crit])
    order = [e[1] for e in si.events if e[0] == "start"]
    assert order.index(4) < order.index(3) < order.index(2)
    await engine.stop()


async def test_cancel_queued_and_running_jobs_returns_budget_and_keeps_serving():
    gate = threading.Event()
    si = StandInStages(delay=0.002, finish_gate=gate)
    engine = await started(make_config(synth=1, workers=1), si)
    running = engine.submit("snap-update", "tiny", 1)[0]
    queued = engine.submit("snap-update", "tiny", 2)[0]
    # one synthesis slot: the second job waits until all 16 partitions of the first are taken
    snap = await snapshot_when(
        engine, lambda s: any(p.state == "gpu" for p in s.pipelines[0].partitions),
        "a partition of the first job on the device")
    assert [p.status for p in snap.pipelines] == ["running", "queued"]
    engine.cancel(queued.job_id)
    engine.cancel(running.job_id)
    gate.set()
    await finish(engine, [running, queued])
    assert running.status == queued.status == "cancelled"
    assert "cancelled" in running.error
    snap = engine.snapshot()
    assert snap.counters.total_cancelled == 2 and snap.counters.cancelled_by_kind == {
        "snap-update": 2}
    assert all(p.state in ("cancelled", "done") for pl in snap.pipelines for p in pl.partitions)
    assert_clean(engine)
    again = engine.submit("winning-post", "tiny", 3)[0]
    await finish(engine, [again])
    assert again.status == "done"
    await engine.stop()


@pytest.mark.parametrize("seed,where", [(FAIL_SYNTH_SEED, "synthesis failed"),
                                        (FAIL_DEVICE_SEED, "device cpu failed")])
async def test_injected_failure_fails_only_its_job_with_reason(seed, where):
    si = StandInStages(delay=0.001)
    engine = await started(make_config(), si)
    with Sampler(engine) as sampler:
        bad = engine.submit("porep-c2", "tiny", seed)[0]
        good = engine.submit("snap-update", "tiny", 5)[0]
        await finish(engine, [bad, good])
    assert sampler.violations == []
    assert bad.status == "failed" and where in bad.error and "injected" in bad.error
    assert bad.result()["proof"] is None
    assert good.status == "done"
    snap = engine.snapshot()
    assert snap.counters.total_failed == 1 and snap.counters.failed_by_kind == {"porep-c2": 1}
    failed_pl = next(p for p in snap.pipelines if p.job_id == bad.job_id)
    assert "failed" in [p.state for p in failed_pl.partitions]
    assert "pending" not in [p.state for p in failed_pl.partitions]
    assert_clean(engine)
    await engine.stop()


async def test_request_larger_than_budget_fails_at_once_and_engine_serves_on():
    si = StandInStages()
    small = await started(make_config(budget=4500), si)  # parameters (5000 in memory) never fit
    job = small.submit("winning-post", "tiny", 1)[0]
    await finish(small, [job], timeout=5)
    assert job.status == "failed" and "whole memory budget" in job.error
    assert small.budget.used == 0
    assert small.snapshot().counters.total_failed == 1
    await small.stop()


async def test_parameters_plus_working_set_over_budget_fail_at_once_with_the_sizes():
    si = StandInStages()
    # parameters (5000) fit alone and a working set (1000) fits alone, but never both at once
    engine = await started(make_config(budget=5500), si)
    job = engine.submit("porep-c2", "tiny", 1)[0]
    await finish(engine, [job], timeout=2)
    assert job.status == "failed"
    assert "parameters 4.88 KiB plus one partition's working set 1000 B" in job.error
    assert "whole memory budget is 5.37 KiB" in job.error
    snap = engine.snapshot()
    assert snap.pipelines[0].status == "failed" and snap.counters.failed_by_kind == {
        "porep-c2": 1}
    assert [p.state for p in snap.pipelines[0].partitions] == ["cancelled"] * 10
    assert_clean(engine)
    # the parameters are idle again: evicting them is allowed
    assert engine.evict("porep-c2.tiny") == 5000
    await engine.stop()


async def test_budget_backpressure_never_exceeds_total():
    si = StandInStages(delay=0.002)
    # parameters 5000 + at most two working sets of 1000 at a time
    engine = await started(make_config(budget=7000, synth=4), si)
    with Sampler(engine) as sampler:
        jobs = [engine.submit("snap-update", "tiny", s)[0] for s in range(2)]
        await finish(engine, jobs)
    assert sampler.violations == []
    assert all(j.status == "done" for j in jobs)
    await engine.stop()


async def test_request_id_is_idempotent_and_conflicts_are_refused():
    engine = await started(make_config(), StandInStages())
    a, _, created_a = engine.submit("winning-post", "tiny", 9, request_id="req-1")
    b, _, created_b = engine.submit("winning-post", "tiny", 9, request_id="req-1")
    assert a is b and a.job_id == "req-1" and created_a and not created_b
    with pytest.raises(RequestConflict):
        engine.submit("winning-post", "tiny", 10, request_id="req-1")
    await finish(engine, [a])
    assert engine.snapshot().counters.total_completed == 1
    await engine.stop()


@pytest.mark.parametrize("args", [
    ("nope", "tiny", 1), ("porep-c2", "huge", 1), ("porep-c2", "tiny", -1),
    ("porep-c2", "tiny", 2**64), ("porep-c2", "tiny", "1"), ("porep-c2", "tiny", True),
])
async def test_bad_requests_are_refused_with_a_message(args):
    engine = await started(make_config(), StandInStages())
    with pytest.raises(InvalidRequest) as e:
        engine.submit(*args)
    assert str(e.value)
    with pytest.raises(InvalidRequest):
        engine.submit("porep-c2", "tiny", 1, priority="urgent")
    await engine.stop()


async def test_drain_finishes_running_cancels_queued_and_refuses_new():
    si = StandInStages(delay=0.003)
    engine = await started(make_config(synth=1, workers=1), si)
    running = engine.submit("porep-c2", "tiny", 1)[0]
    queued = [engine.submit("porep-c2", "tiny", s)[0] for s in range(2, 5)]
    await until_running(engine, running)
    await asyncio.wait_for(engine.drain(), 20)
    assert running.status == "done"
    assert any(j.status == "cancelled" and "shutting down" in j.error for j in queued)
    with pytest.raises(EngineNotAccepting):
        engine.submit("winning-post", "tiny", 1)
    assert engine.snapshot().accepting is False
    await engine.stop()
    assert engine.budget.used == 0


async def test_a_drain_marks_its_cancels_as_the_engines_and_waits_for_results_to_be_fetched():
    """A client must tell a shutdown's cancel (run it again elsewhere) from a user's (final),
    and must get the chance to fetch what finished during the drain before the engine exits."""
    si = StandInStages(delay=0.003)
    cfg = make_config(synth=1, workers=1)
    cfg.daemon.drain_linger = 20.0
    engine = await started(cfg, si)
    running = engine.submit("porep-c2", "tiny", 1, request_id="run")[0]
    queued = [engine.submit("porep-c2", "tiny", s, request_id=f"q{s}")[0] for s in range(2, 5)]
    user_cancelled = engine.cancel(queued.pop().job_id)
    assert user_cancelled.result()["cancelled_by"] == "request"
    await until_running(engine, running)
    for job in [running, *queued]:
        job.collected = AwaitedEvent()
    drain = asyncio.create_task(engine.drain())
    # every job has settled and the drain waits for each result to be fetched
    await asyncio.wait_for(
        asyncio.gather(*(j.collected.awaited.wait() for j in [running, *queued])), 20)
    assert all(j.settled.is_set() for j in [running, *queued])
    assert not drain.done(), "the drain ended before anyone fetched its results"
    for job in [running, *queued]:
        await engine.wait(job.job_id, 0)
    await asyncio.wait_for(drain, 5)
    assert running.status == "done" and running.cancelled_by is None
    shut = [j for j in queued if j.status == "cancelled"]
    assert shut and all(j.result()["cancelled_by"] == "engine" for j in shut)
    # Resubmitting a request the shutdown cancelled is refused as "not accepting", never
    # answered with the cancelled record as though that were its outcome.
    with pytest.raises(EngineNotAccepting):
        engine.submit("porep-c2", "tiny", shut[0].seed, request_id=shut[0].request_id)
    await engine.stop()


async def test_a_drain_gives_up_waiting_for_unfetched_results_after_the_linger():
    cfg = make_config(synth=1, workers=1)
    cfg.daemon.drain_linger = 0.2
    engine = await started(cfg, StandInStages())
    engine.submit("winning-post", "tiny", 1, request_id="never-fetched")
    await asyncio.wait_for(engine.drain(), 5)
    await engine.stop()


async def test_status_shows_how_msm_threads_and_synthesis_share_the_cpu(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv(native_msm.THREADS_ENV, raising=False)
    monkeypatch.setattr(native_msm, "_process_threads", None)  # restored after the test
    for pipelined, provers in ((True, 2), (False, 1)):
        engine = Engine(make_config(synth=3, workers=2, pipelined=pipelined),
                        stages=StandInStages().stages(), synth_executor=ThreadPoolExecutor(1))
        split = engine.snapshot().cpu
        assert split == CpuSnapshot(cores=8, synthesis_processes=3, msm_threads=8 // provers,
                                    provers=provers)
        assert native_msm.default_threads() == 8 // provers  # what the MSMs will use
        assert engine.snapshot().to_json()["cpu"]["msm_threads"] == 8 // provers
        assert engine.info()["msm_threads"] == 8 // provers


async def test_monolithic_mode_proves_sequentially_with_one_worker_per_device():
    si = StandInStages(delay=0.001)
    engine = await started(make_config(pipelined=False), si)
    assert len(engine.snapshot().gpu_workers) == 1
    with Sampler(engine) as sampler:
        jobs = [engine.submit(k, "tiny", 1)[0] for k in PARTS]
        await finish(engine, jobs)
    assert sampler.violations == []
    assert all(j.status == "done" and j.verified for j in jobs)
    starts = [e for e in si.events if e[0] == "start"]
    assert len(starts) == sum(PARTS.values())
    assert_clean(engine)
    await engine.stop()


async def test_randomized_load_with_cancels_keeps_every_invariant():
    import random

    rng = random.Random(7)
    si = StandInStages(delay=0.0005)
    # room for one circuit's parameters plus working sets: circuits take turns via eviction
    engine = await started(make_config(budget=9000, synth=3, workers=2, min_idle=0.0), si)
    jobs = []
    with Sampler(engine) as sampler:
        for n in range(40):
            kind = rng.choice(list(PARTS))
            seed = rng.choice([n, n, n, FAIL_SYNTH_SEED, FAIL_DEVICE_SEED]) if n % 7 == 0 else n
            jobs.append(engine.submit(kind, "tiny", seed + 1000 * (seed == n))[0])
            if rng.random() < 0.3:
                engine.cancel(rng.choice(jobs).job_id)
            await asyncio.sleep(rng.random() * 0.01)  # the load's shape: random arrivals
        await finish(engine, jobs, timeout=60)
    assert sampler.violations == [], sampler.violations[:3]
    c = engine.snapshot().counters
    assert c.total_completed + c.total_failed + c.total_cancelled == len(jobs)
    assert c.total_completed == sum(j.status == "done" for j in jobs)
    assert_clean(engine)
    await engine.stop()


# ---------------------------------------------------------------------- job phases


def pipeline_of(snap, job):
    return next(p for p in snap.pipelines if p.job_id == job.job_id)


async def test_a_job_cancelled_on_the_device_is_cancelling_until_the_device_lets_go():
    gate = threading.Event()
    engine = await started(make_config(workers=1, synth=1), StandInStages(start_gate=gate))
    job, _, _ = engine.submit("porep-c2", "tiny", 1)
    await snapshot_when(engine, lambda s: any(p.state == "gpu" for p in s.pipelines[0].partitions),
                        "a partition on the device")
    answer = engine.result(engine.cancel(job.job_id))
    # the cancel's answer: cancelled, no proof, not verified, one partition still on the device
    assert (answer["status"], answer["proof"], answer["verified"]) == ("cancelled", None, None)
    assert answer["settled"] is False
    assert [p["state"] for p in answer["partition_states"]].count("gpu") == 1
    snap = engine.snapshot()
    assert pipeline_of(snap, job).phase == "cancelling"
    assert snap.gpu_workers[0].state == "proving"
    assert snapshot_violations(snap) == []
    waiting = asyncio.create_task(engine.wait(job.job_id, 5))
    await asyncio.sleep(0)
    assert not waiting.done()  # a long-poll for the result waits for the device to let go
    gate.set()
    final = engine.result(await waiting)
    assert final["settled"] is True and final["verified"] is None
    assert {p["state"] for p in final["partition_states"]} == {"cancelled"}
    snap = engine.snapshot()
    pipeline = pipeline_of(snap, job)
    assert pipeline.phase == "cancelled"
    assert [p.state for p in pipeline.partitions] == [p["state"] for p in final["partition_states"]]
    assert all(w.state == "idle" for w in snap.gpu_workers)
    assert snapshot_violations(snap) == []
    await engine.stop()


async def test_jobs_waiting_for_parameters_say_generating_or_loading_with_progress():
    gate = threading.Event()
    si = StandInStages(param_gate=gate, missing={"winning-post.tiny"})
    engine = await started(make_config(), si)
    first = engine.submit("winning-post", "tiny", 1)[0]
    second = engine.submit("window-post", "tiny", 1)[0]  # present on disk: loaded, not generated
    # the second does not wait for the first's generation: it loads its own meanwhile
    snap = await snapshot_when(engine, lambda s: [(p.phase, p.params_progress) for p in s.pipelines]
                               == [("generating_parameters", 0.5), ("loading_parameters", None)],
                               "the first job generating its parameters, half done")
    assert sorted((a.circuit_id, a.state, a.progress) for a in snap.allocations["srs"]) == [
        ("window-post.tiny", "loading", None), ("winning-post.tiny", "generating", 0.5)]
    assert pipeline_of(snap, first).params_progress == 0.5
    assert all(p.phase_secs is not None and p.phase_secs >= 0 for p in snap.pipelines)
    assert snapshot_violations(snap) == []
    # the JSON carries the phase and reads back the same
    assert EngineSnapshot.from_json(snap.to_json()).pipelines[0].phase == "generating_parameters"
    # an older engine's snapshot, without the phase fields, still reads (as unknown)
    old = snap.to_json()
    for key in ("phase", "phase_secs", "params_bytes", "params_progress"):
        del old["pipelines"][0][key]
    assert EngineSnapshot.from_json(old).pipelines[0].phase is None
    gate.set()
    await finish(engine, [first, second])
    snap = engine.snapshot()
    assert [p.phase for p in snap.pipelines] == ["done", "done"]
    assert {a.state for a in snap.allocations["srs"]} == {"loaded"}
    await engine.stop()

    gate.clear()
    engine = await started(make_config(), StandInStages(param_gate=gate))
    job = engine.submit("window-post", "tiny", 1)[0]
    snap = await snapshot_when(engine, lambda s: s.pipelines[0].phase == "loading_parameters",
                               "the job loading its parameters")
    assert pipeline_of(snap, job).params_progress is None
    assert snapshot_violations(snap) == []
    gate.set()
    await finish(engine, [job])
    await engine.stop()


async def test_a_job_whose_parameters_are_ready_does_not_wait_for_another_jobs_generation():
    gate = threading.Event()
    si = StandInStages(generation_gate=gate, missing={"porep-c2.tiny"})
    engine = await started(make_config(synth=1), si)
    generating = engine.submit("porep-c2", "tiny", 1)[0]
    ready = engine.submit("winning-post", "tiny", 2, priority="low")[0]  # on disk: loads at once
    await asyncio.wait_for(ready.ended.wait(), 3)  # the generation is held 5 s
    assert ready.status == "done"
    assert pipeline_of(engine.snapshot(), generating).phase == "generating_parameters"
    gate.set()
    await finish(engine, [generating, ready])
    assert generating.status == "done"
    assert_clean(engine)
    await engine.stop()
