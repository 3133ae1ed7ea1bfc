"""StatusTracker: the stale-finalizer race, every cuzk §4.2/§4.3 defect, and randomized schedules
checking the DESIGN.md invariants on every snapshot."""

import dataclasses
import json
import random
import re

import pytest

from cuzk_engine.engine.snapshot import (
    CpuSnapshot,
    EngineSnapshot,
    _has_shape,
    snapshot_violations,
)
from cuzk_engine.engine.status import (
    _TRANSITIONS,
    DeviceInfo,
    StatusTracker,
    _Worker,
)
from cuzk_engine.errors import SnapshotFormatError, StatusTransitionError
from cuzk_engine.vocabulary import PARTITION_PHASES, SETTLED_PHASES, WAITING_PHASES

CPU = [DeviceInfo(0, "cpu", "cpu", "test cpu device")]


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def tracker(workers=2, **kw):
    return StatusTracker(CPU, workers, **kw)


def worker(snap, wid):
    return next(w for w in snap.gpu_workers if w.worker_id == wid)


def part(snap, job, idx):
    return next(p for p in snap.pipelines if p.job_id == job).partitions[idx]


def ready(t, job, idx):
    t.synth_start(job, idx)
    t.synth_end(job, idx)


class NaiveEndTracker(StatusTracker):
    """Test double: the unguarded end() that cuzk's gRPC JobTracker still has — the finalizer
    clears whatever its worker is doing now. Kept to show the race test bites."""

    def _release_worker(self, token, now):
        pick = self._pickups.get(token)
        if pick is not None:
            w = self._workers[pick[0]]
            self._workers[pick[0]] = _Worker(w.worker_id, w.gpu_ordinal)


def run_race(t):
    """pickup(A) -> prove_start(A) -> pickup(B) -> finalize(A), the sequence of the seeds' story."""
    for job in ("A", "B"):
        t.register_job(job, kind="snap-update", profile="tiny", circuit_id="snap-update.tiny",
                       priority="normal", partitions=1)
        t.job_started(job)
        ready(t, job, 0)
    token_a = t.worker_pickup(0, "A", 0)
    t.device_done(token_a)
    t.worker_pickup(0, "B", 0)
    t.finalize_done("A", 0, token=token_a)
    return t.snapshot()


def test_late_finalizer_does_not_clear_a_worker_that_moved_on():
    snap = run_race(tracker())
    w = worker(snap, 0)
    assert (w.state, w.current_job, w.current_partition) == ("proving", "B", 0)
    assert part(snap, "B", 0).state == "gpu"
    assert part(snap, "A", 0).state == "done"
    assert snapshot_violations(snap) == []


def test_race_test_bites_against_naive_end():
    snap = run_race(NaiveEndTracker(CPU, 2))
    assert worker(snap, 0).state == "idle"
    assert any("in gpu held by workers []" in v for v in snapshot_violations(snap))


def test_a_live_job_id_cannot_be_registered_twice():
    # cuzk re-registered duplicate ids over the live entry and mixed partitions of two proofs.
    t = tracker()
    t.register_job("J", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=1)
    with pytest.raises(StatusTransitionError):
        t.register_job("J", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="normal", partitions=1)


def test_pickup_tokens_are_unique_even_for_the_same_partition_key():
    t = tracker()
    tokens = set()
    for n in range(3):
        t.register_job(f"r{n}", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="normal", partitions=1)
        t.job_started(f"r{n}")
        ready(t, f"r{n}", 0)
        tok = t.worker_pickup(0, f"r{n}", 0)
        tokens.add(tok)
        t.device_done(tok)
    assert len(tokens) == 3


def test_single_partition_post_is_a_pipeline_and_moves_workers():
    t = tracker()
    t.register_job("w1", kind="winning-post", profile="tiny", circuit_id="winning-post.tiny",
                   priority="critical", partitions=1)
    snap = t.snapshot()
    assert [p.kind for p in snap.pipelines] == ["winning-post"]
    assert snap.counters.queue_depth_by_kind == {"winning-post": 1}
    t.job_started("w1")
    ready(t, "w1", 0)
    tok = t.worker_pickup(1, "w1", 0)
    snap = t.snapshot()
    assert worker(snap, 1).state == "proving" and worker(snap, 1).current_job == "w1"
    t.device_done(tok)
    t.finalize_done("w1", 0)
    t.job_done("w1")
    snap = t.snapshot()
    assert snap.counters.completed_by_kind == {"winning-post": 1}
    assert snap.pipelines[0].status == "done"


def test_failed_partition_fails_job_once_is_counted_and_leaves_after_retention():
    clock = FakeClock()
    t = tracker(retention=30.0, clock=clock)
    t.register_job("s", kind="snap-update", profile="tiny", circuit_id="snap-update.tiny",
                   priority="normal", partitions=3)
    t.job_started("s")
    t.synth_start("s", 0)
    t.synth_start("s", 1)
    t.partition_failed("s", 0, "synthesis failed: boom")
    t.partition_failed("s", 1, "synthesis failed: again")
    snap = t.snapshot()
    p = snap.pipelines[0]
    assert p.status == "failed" and "partition 0" in p.error and "boom" in p.error
    assert [x.state for x in p.partitions] == ["failed", "failed", "cancelled"]
    assert snap.counters.total_failed == 1 and snap.counters.failed_by_kind == {"snap-update": 1}
    # cuzk: synthesis.active only grew on failure
    assert snap.synthesis.active == 0
    clock.t += 29.9
    assert len(t.snapshot().pipelines) == 1
    clock.t += 0.2
    assert t.snapshot().pipelines == []
    assert t.snapshot().counters.total_failed == 1


def test_an_ended_job_stays_listed_while_a_partition_is_on_a_device_and_its_id_stays_taken():
    # cuzk forgot jobs by time alone; here a cancelled job whose partition is still proving keeps
    # its entry (and its id) until that partition settles, so no stale pickup can meet a
    # resubmitted job of the same id
    clock = FakeClock()
    t = tracker(retention=5.0, clock=clock)
    for jid in ("old", "r"):
        t.register_job(jid, kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="normal", partitions=1)
        t.job_started(jid)
        ready(t, jid, 0)
    t.job_cancelled("old")
    tok = t.worker_pickup(0, "r", 0)
    t.job_cancelled("r")
    clock.t += 60.0
    snap = t.snapshot()
    assert [p.job_id for p in snap.pipelines] == ["r"]  # "old" settled and left; "r" did not
    assert worker(snap, 0).current_job == "r" and part(snap, "r", 0).state == "gpu"
    with pytest.raises(StatusTransitionError, match="already tracked"):
        t.register_job("r", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="normal", partitions=1)
    assert t.device_done(tok) is False
    snap = t.snapshot()
    assert snap.pipelines == [] and worker(snap, 0).state == "idle"
    assert snapshot_violations(snap) == []
    t.register_job("r", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=1)
    assert t.snapshot().pipelines[0].partitions[0].state == "pending"


def test_device_failure_shows_failed_not_done_and_frees_the_worker():
    t = tracker()
    t.register_job("p", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=2)
    t.job_started("p")
    ready(t, "p", 0)
    tok = t.worker_pickup(0, "p", 0)
    t.partition_failed("p", 0, "prove_start: device error", token=tok)
    snap = t.snapshot()
    assert part(snap, "p", 0).state == "failed"
    assert worker(snap, 0).state == "idle"
    assert snap.pipelines[0].status == "failed"
    assert snapshot_violations(snap) == []


def test_pickup_of_an_ended_job_is_refused_and_leaves_worker_idle():
    # cuzk marked a worker busy on pickup before its already-failed check.
    t = tracker()
    t.register_job("c", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=2)
    t.job_started("c")
    ready(t, "c", 0)
    t.job_cancelled("c")
    assert t.worker_pickup(0, "c", 0) is None
    snap = t.snapshot()
    assert worker(snap, 0).state == "idle"
    assert [x.state for x in snap.pipelines[0].partitions] == ["cancelled", "cancelled"]


def test_srs_list_shows_loading_entries_and_in_use_is_not_evictable():
    # cuzk returned [] whenever the SRS mutex was held, e.g. for the whole of a load.
    t = tracker()
    t.srs_update("porep-c2.tiny", 1000, "loading", 1)
    s = t.snapshot().allocations["srs"]
    assert [(a.circuit_id, a.state, a.evictable) for a in s] == [("porep-c2.tiny", "loading",
                                                                  False)]
    t.srs_update("porep-c2.tiny", 1200, "loaded", 0)
    assert t.snapshot().allocations["srs"][0].evictable is True
    t.srs_removed("porep-c2.tiny")
    assert t.snapshot().allocations["srs"] == []


def test_seq_increases_with_every_change_and_forbidden_transitions_raise():
    t = tracker()
    s0 = t.snapshot().seq
    t.register_job("x", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="low", partitions=1)
    assert t.snapshot().seq > s0
    with pytest.raises(StatusTransitionError):
        t.synth_end("x", 0)
    with pytest.raises(StatusTransitionError):
        t.job_done("x")


def test_the_transition_table_names_every_partition_phase_and_settled_ones_are_final():
    named = set(_TRANSITIONS).union(*_TRANSITIONS.values())
    assert named == set(PARTITION_PHASES)
    assert not set(_TRANSITIONS) & SETTLED_PHASES
    assert WAITING_PHASES <= set(_TRANSITIONS)


def test_memory_reader_is_reported_and_checked():
    t = tracker(memory=lambda: (100, 40))
    m = t.snapshot().memory
    assert (m.total_bytes, m.used_bytes, m.available_bytes) == (100, 40, 60)
    bad = StatusTracker(CPU, 1, memory=lambda: (100, 140)).snapshot()
    assert any("memory used" in v for v in snapshot_violations(bad))


def test_snapshot_json_keeps_cuzk_names_and_adds_timeline_fields():
    t = tracker()
    t.register_job("j", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=1, request_id="req-1")
    d = t.snapshot().to_json()
    for key in ("uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers", "allocations",
                "counters", "buffers", "seq", "version", "devices"):
        assert key in d
    pl = d["pipelines"][0]
    assert pl["request_id"] == "req-1" and pl["proof_kind"] == "porep-c2"
    assert set(pl["partitions"][0]) >= {"index", "state", "synth_ms", "gpu_ms", "finalize_ms",
                                        "synth_start_ms", "gpu_start_ms", "finalize_start_ms"}
    assert set(d["gpu_workers"][0]) >= {"worker_id", "gpu_ordinal", "state", "current_job",
                                        "current_partition", "busy_secs"}
    assert d["devices"][0]["description"] == "test cpu device"


def _plain(value):
    """Reference conversion: every dataclass and named tuple to a dict, recursively."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_to_json_is_the_whole_snapshot_field_by_field():
    t = tracker(memory=lambda: (100, 10))
    t.srs_update("porep-c2.tiny", 50, "loaded", 1)
    for job, n in (("a", 3), ("b", 1)):
        t.register_job(job, kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="high", partitions=n)
    t.job_started("a")
    ready(t, "a", 0)
    t.synth_start("a", 1)
    t.worker_pickup(1, "a", 0)
    snap = t.snapshot()
    d = snap.to_json()
    assert d == _plain(snap)
    assert json.loads(json.dumps(d)) == d
    d["counters"]["queue_depth_by_kind"]["x"] = 1  # the JSON is a copy, not a view
    assert "x" not in snap.counters.queue_depth_by_kind


def proving_one_partition(t):
    """`t` with an SRS loaded and job "a"'s partition 0 on worker 0: every part a snapshot has."""
    t.srs_update("porep-c2.tiny", 50, "loaded", 0)
    t.register_job("a", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="high", partitions=2)
    t.job_started("a")
    ready(t, "a", 0)
    t.worker_pickup(0, "a", 0)
    return t


def test_from_json_reads_back_exactly_what_to_json_wrote():
    t = proving_one_partition(tracker(memory=lambda: (100, 10)))
    snap = t.snapshot()
    wire = json.loads(json.dumps({**snap.to_json(), "added_by_a_newer_engine": 1}))
    assert EngineSnapshot.from_json(wire) == snap


def test_the_cpu_split_travels_and_must_agree_with_synthesis():
    t = tracker(synthesis_max_concurrent=2, cpu=CpuSnapshot(cores=2, synthesis_processes=2,
                                                             msm_threads=1, provers=2))
    snap = t.snapshot()
    assert snapshot_violations(snap) == []
    wire = json.loads(json.dumps(snap.to_json()))
    assert wire["cpu"] == {"cores": 2, "synthesis_processes": 2, "msm_threads": 1, "provers": 2}
    assert EngineSnapshot.from_json(wire) == snap
    del wire["cpu"]  # an engine from before the split
    assert EngineSnapshot.from_json(wire).cpu is None
    lying = dataclasses.replace(snap, cpu=CpuSnapshot(2, 3, 1, 2))
    assert any("synthesis_processes 3" in v for v in snapshot_violations(lying))
    assert any("below 1" in v for v in snapshot_violations(
        dataclasses.replace(snap, cpu=CpuSnapshot(2, 2, 0, 2))))
    with pytest.raises(SnapshotFormatError, match=re.escape("cpu: missing msm_threads")):
        EngineSnapshot.from_json({**snap.to_json(), "cpu": {"cores": 2, "synthesis_processes": 2,
                                                            "provers": 2}})


@pytest.mark.parametrize("damage, named", [
    (lambda d: d.pop("counters"), "counters"),
    (lambda d: d["pipelines"][0]["partitions"][1].pop("state"), "pipelines[0].partitions[1]"),
    (lambda d: d.__setitem__("gpu_workers", {}), "gpu_workers"),
])
def test_from_json_names_the_part_that_is_missing_or_misshapen(damage, named):
    t = tracker()
    t.register_job("a", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="high", partitions=2)
    wire = t.snapshot().to_json()
    damage(wire)
    with pytest.raises(SnapshotFormatError, match=re.escape(named)):
        EngineSnapshot.from_json(wire)


def _complete_wire() -> dict:
    """A snapshot's JSON with one of every part from_json reads: pipelines with partitions,
    workers, devices, allocations of both lists, the CPU split, the optional fields."""
    t = proving_one_partition(
        tracker(cpu=CpuSnapshot(cores=2, synthesis_processes=4, msm_threads=1, provers=2)))
    wire = json.loads(json.dumps(t.snapshot().to_json()))
    wire["allocations"].setdefault("pce", []).append(dict(wire["allocations"]["srs"][0]))
    return wire


def _damaged(node, path=()):
    """Every (path, copy of the snapshot) with one part damaged: each key of each object taken
    away or given another shape, each list item given another shape."""
    keys = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in list(keys):
        where = (*path, key)
        wrongs = [None, "x", 7, [], {}]
        for wrong in ([_GONE] if isinstance(node, dict) else []) + wrongs:
            if type(wrong) is type(value) or (wrong is None and value is None):
                continue
            wire = _complete_wire()
            target = wire
            for step in path:
                target = target[step]
            if wrong is _GONE:
                del target[key]
            else:
                target[key] = wrong
            yield where, wire
        if isinstance(value, dict | list) and value:
            yield from _damaged(value, where)


_GONE = object()


def test_check_json_refuses_exactly_what_from_json_refuses_with_its_message():
    """The controller checks each streamed snapshot with check_json and decodes it only when
    it needs the typed form: no damage from_json refuses may get past check_json, and what it
    refuses is named as from_json names it."""
    wire = _complete_wire()
    EngineSnapshot.check_json(wire)
    refused = 0
    for where, damaged in _damaged(wire):
        try:
            EngineSnapshot.from_json(damaged)
        except SnapshotFormatError as exc:
            refused += 1
            with pytest.raises(SnapshotFormatError) as checked:
                EngineSnapshot.check_json(damaged)
            assert str(checked.value) == str(exc), where
            assert not _has_shape(damaged), where
        else:
            EngineSnapshot.check_json(damaged)
    assert refused > 100  # every part of the snapshot was damaged somewhere


def test_running_timers_advance_while_unchanged_partitions_are_reused():
    clock = FakeClock()
    t = tracker(clock=clock)
    t.register_job("j", kind="snap-update", profile="tiny", circuit_id="snap-update.tiny",
                   priority="normal", partitions=3)
    t.job_started("j")
    ready(t, "j", 0)
    t.synth_start("j", 1)
    clock.t += 0.25
    first = t.snapshot().pipelines[0]
    clock.t += 0.5
    second = t.snapshot().pipelines[0]
    # the running synthesis and the pipeline's age follow the clock ...
    assert (first.partitions[1].synth_ms, second.partitions[1].synth_ms) == (250.0, 750.0)
    assert second.started_secs_ago == first.started_secs_ago + 0.5
    # ... settled and waiting partitions are the same immutable objects
    assert second.partitions[0] is first.partitions[0]
    assert second.partitions[2] is first.partitions[2]
    t.synth_end("j", 1)
    clock.t += 1.0
    third = t.snapshot().pipelines[0]
    assert (third.partitions[1].state, third.partitions[1].synth_ms) == ("synth_done", 750.0)


def test_a_job_id_reused_after_retention_is_rendered_from_its_own_state():
    clock = FakeClock()
    t = tracker(retention=1.0, clock=clock)
    for attempt in range(2):
        t.register_job("r", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                       priority="normal", partitions=1)
        snap = t.snapshot()
        assert [p.partitions[0].state for p in snap.pipelines] == ["pending"], attempt
        t.job_cancelled("r")
        assert t.snapshot().pipelines[0].partitions[0].state == "cancelled"
        clock.t += 2.0
        assert t.snapshot().pipelines == []


# ---------------------------------------------------------------------- randomized schedules


class Model:
    """Drives a tracker through a random but legal interleaving of engine events — including
    finalizers that run long after their worker moved on — and checks every snapshot."""

    def __init__(self, rng, n_workers, clock):
        self.rng = rng
        self.clock = clock
        self.t = StatusTracker(
            [DeviceInfo(0, "cpu", "cpu", "a"), DeviceInfo(1, "cuda:1", "cuda", "b")],
            n_workers // 2, memory=lambda: (1000, rng.randint(0, 1000)), retention=5.0,
            clock=clock,
        )
        self.n_workers = n_workers
        self.jobs = {}  # job -> n partitions
        self.status = {}
        self.ready = set()  # jobs with their parameters in hand
        self.state = {}  # (job, i) -> phase, as the engine believes
        self.free_workers = list(range(n_workers))
        self.held = {}  # worker -> (token, job, i)
        self.finalizing = []  # (token or None, job, i)
        self.terminal = {"done": 0, "failed": 0, "cancelled": 0}
        self.next_id = 0
        self.last_seq = -1
        self.snapshots = 0

    def submit(self):
        jid = f"j{self.next_id}"
        self.next_id += 1
        kind, n = self.rng.choice([("winning-post", 1), ("window-post", 1), ("snap-update", 16),
                                   ("porep-c2", 10)])
        self.t.register_job(jid, kind=kind, profile="tiny", circuit_id=f"{kind}.tiny",
                            priority="normal", partitions=n)
        self.jobs[jid] = n
        self.status[jid] = "queued"
        for i in range(n):
            self.state[(jid, i)] = "pending"

    def alive(self, jid):
        return self.status[jid] not in ("done", "failed", "cancelled")

    def end(self, jid, status):
        if self.alive(jid):
            self.status[jid] = status
            self.terminal[status] += 1
            for key, st in self.state.items():
                if key[0] == jid and st in ("pending", "synth_done"):
                    self.state[key] = "cancelled"

    def phase(self, jid):
        """The job's phase as the model knows it."""
        st = self.status[jid]
        if st == "running":
            return "running" if jid in self.ready else "loading_parameters"
        unsettled = any(self.state[(jid, i)] not in SETTLED_PHASES
                        for i in range(self.jobs[jid]))
        if st in ("failed", "cancelled") and unsettled:
            return {"failed": "failing", "cancelled": "cancelling"}[st]
        return st

    def candidates(self, phase):
        return [k for k, s in self.state.items() if s == phase]

    def step(self):
        r = self.rng.random()
        self.clock.t += self.rng.random() * 0.5
        if r < 0.06:
            if sum(self.alive(j) for j in self.status) < 5:
                self.submit()
        elif r < 0.12:
            queued = [j for j, s in self.status.items() if s == "queued"]
            if queued:
                j = self.rng.choice(queued)
                self.t.job_started(j)
                self.status[j] = "running"
                if self.rng.random() < 0.5:  # else its first synthesis says it has them
                    self.t.srs_loaded_for(j, 1.0)
                    self.ready.add(j)
        elif r < 0.30:
            c = [k for k in self.candidates("pending") if self.status[k[0]] == "running"]
            if c:
                k = self.rng.choice(c)
                assert self.t.synth_start(*k)
                self.state[k] = "synthesizing"
                self.ready.add(k[0])
        elif r < 0.45:
            c = self.candidates("synthesizing")
            if c:
                k = self.rng.choice(c)
                if self.rng.random() < 0.02:
                    self.t.partition_failed(*k, "synthesis failed: injected")
                    self.state[k] = "failed"
                    self.end(k[0], "failed")
                else:
                    ok = self.t.synth_end(*k)
                    assert ok == self.alive(k[0])
                    self.state[k] = "synth_done" if ok else "cancelled"
        elif r < 0.60:
            c = self.candidates("synth_done")
            if c and self.free_workers:
                k = self.rng.choice(c)
                w = self.free_workers.pop(self.rng.randrange(len(self.free_workers)))
                tok = self.t.worker_pickup(w, *k)
                assert tok is not None
                self.held[w] = (tok, *k)
                self.state[k] = "gpu"
        elif r < 0.75:
            if self.held:
                w = self.rng.choice(list(self.held))
                tok, j, i = self.held.pop(w)
                self.free_workers.append(w)
                if self.rng.random() < 0.02:
                    self.t.partition_failed(j, i, "device error: injected", token=tok)
                    self.state[(j, i)] = "failed"
                    self.end(j, "failed")
                elif self.t.device_done(tok):
                    self.state[(j, i)] = "finalizing"
                    self.finalizing.append((tok, j, i))
                else:
                    self.state[(j, i)] = "cancelled"
        elif r < 0.90:
            if self.finalizing:
                tok, j, i = self.finalizing.pop(self.rng.randrange(len(self.finalizing)))
                # the late finalizer passes its old token, as in the seeds' race
                ok = self.t.finalize_done(j, i, token=tok)
                self.state[(j, i)] = "done" if ok else "cancelled"
                if ok and all(self.state[(j, x)] == "done" for x in range(self.jobs[j])):
                    self.t.job_done(j)
                    self.end(j, "done")
        elif r < 0.93:
            live = [j for j in self.status if self.alive(j)]
            if live:
                j = self.rng.choice(live)
                assert self.t.job_cancelled(j)
                self.end(j, "cancelled")
        self.check()

    def check(self):
        snap = self.t.snapshot()
        self.snapshots += 1
        assert snapshot_violations(snap) == [], snapshot_violations(snap)
        # what the reuse of rendered partitions shows equals a render from scratch
        self.t._pipe_cache = {}
        assert self.t.snapshot().to_json()["pipelines"] == snap.to_json()["pipelines"]
        assert snap.seq >= self.last_seq
        self.last_seq = snap.seq
        c = snap.counters
        assert (c.total_completed, c.total_failed, c.total_cancelled) == (
            self.terminal["done"], self.terminal["failed"], self.terminal["cancelled"]
        )
        shown = {p.job_id: p for p in snap.pipelines}
        gone = []
        for jid, st in self.status.items():
            if jid in shown:
                assert shown[jid].status == st
                for pt in shown[jid].partitions:
                    assert pt.state == self.state[(jid, pt.index)]
                assert shown[jid].phase == self.phase(jid)
            else:
                # only settled terminal jobs may leave the list
                assert st in ("done", "failed", "cancelled")
                assert all(self.state[(jid, i)] in ("done", "failed", "cancelled")
                           for i in range(self.jobs[jid]))
                gone.append(jid)
        for jid in gone:
            del self.status[jid]
            for i in range(self.jobs.pop(jid)):
                del self.state[(jid, i)]
        for w in snap.gpu_workers:
            if w.worker_id in self.held:
                _, j, i = self.held[w.worker_id]
                assert (w.state, w.current_job, w.current_partition) == ("proving", j, i)
            else:
                assert w.state == "idle"


@pytest.mark.parametrize("seed", [1, 2])
def test_randomized_schedules_keep_every_invariant(seed):
    rng = random.Random(seed)
    m = Model(rng, 4, FakeClock())
    for _ in range(3):
        m.submit()
    while m.snapshots < 6000:  # x2 seeds: 12,000 checked snapshots
        m.step()
    assert m.terminal["done"] > 10 and m.terminal["failed"] > 0 and m.terminal["cancelled"] > 0


# ---------------------------------------------------------------------- job phases


def test_a_job_waiting_for_its_parameters_says_which_and_since_when():
    clock = FakeClock()
    t = tracker(clock=clock)
    t.register_job("A", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=2)
    assert t.snapshot().pipelines[0].phase == "queued"
    t.job_started("A")
    clock.t += 1
    t.srs_update("porep-c2.tiny", 0, "generating", 1, progress=0.25)
    clock.t += 2
    t.srs_update("porep-c2.tiny", 0, "generating", 1, progress=0.5)  # same state: same since
    snap = t.snapshot()
    p = snap.pipelines[0]
    assert (p.phase, p.phase_secs, p.params_progress) == ("generating_parameters", 2.0, 0.5)
    assert snap.allocations["srs"][0].state_secs == 2.0
    assert snapshot_violations(snap) == []
    # a page that showed "generating" while the SRS list says loading contradicts the engine
    t.srs_update("porep-c2.tiny", 4000, "loading", 1)
    snap = t.snapshot()
    assert (snap.pipelines[0].phase, snap.pipelines[0].params_bytes) == ("loading_parameters", 4000)
    lying = dataclasses.replace(snap, pipelines=[
        dataclasses.replace(snap.pipelines[0], phase="generating_parameters")])
    assert any("generating" in v for v in snapshot_violations(lying))
    t.srs_loaded_for("A", 3000.0)
    clock.t += 1
    p = t.snapshot().pipelines[0]
    assert (p.phase, p.phase_secs, p.params_bytes) == ("running", 1.0, None)


def test_a_cancelled_job_is_cancelling_while_a_partition_is_on_a_device():
    t = tracker()
    t.register_job("A", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                   priority="normal", partitions=3)
    t.job_started("A")
    ready(t, "A", 0)
    ready(t, "A", 1)
    token = t.worker_pickup(0, "A", 0)
    t.job_cancelled("A")
    snap = t.snapshot()
    assert snap.pipelines[0].phase == "cancelling"
    assert [pt.state for pt in snap.pipelines[0].partitions] == ["gpu", "cancelled", "cancelled"]
    assert worker(snap, 0).state == "proving"
    assert snapshot_violations(snap) == []
    # a cancelled job shown as settled while its partition is still on the device is a lie
    lying = dataclasses.replace(snap, pipelines=[
        dataclasses.replace(snap.pipelines[0], phase="cancelled")])
    assert snapshot_violations(lying)
    t.device_done(token)
    snap = t.snapshot()
    assert snap.pipelines[0].phase == "cancelled"
    assert {pt.state for pt in snap.pipelines[0].partitions} == {"cancelled"}
    assert worker(snap, 0).state == "idle"
    assert snapshot_violations(snap) == []
