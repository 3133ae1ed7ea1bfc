"""A strict fake of Curio's cuzk daemon as Curio deploys it: gRPC `cuzk.v1.ProvingEngine`.

Written from upstream's `proving.proto` (our copy carries the same contract) and the behaviour of
its server, `extern/cuzk/cuzk-server/src/service.rs` and `cuzk-daemon/src/main.rs` (Curio main,
e0294b0f), never from our client:

- it listens on a unix socket by default (`[daemon] listen = "unix:///run/curio/cuzk.sock"`), or
  on TCP 127.0.0.1 when asked; no TLS, no auth, no reflection, no health service;
- messages above 128 MiB are refused either way (RESOURCE_EXHAUSTED);
- `SubmitProof`: an unknown `proof_kind` is INVALID_ARGUMENT "invalid proof_kind: N"; the job id
  *is* the request id; `assigned_gpu` is always ""; priority 0 means the kind's default;
- `AwaitProof`: NOT_FOUND for a job it does not know; `timeout_ms` is ignored (it waits for the
  end); timings only on a completed proof, zeros otherwise;
- `CancelProof` does nothing and answers `was_running = false`;
- `EvictSRS` does nothing and answers `was_loaded = false, freed_bytes = 0`;
- `GetStatus`: one `GPUStatus` per GPU *worker* (two per device by default), VRAM from
  `nvidia-smi` (here: the configured GPUs; 0 for an ordinal it did not list); `loaded_srs` lists
  only what `PreloadSRS` loaded, each as tier HOT, size 0, ref_count 0; `queues[].pending` counts
  the job-level heap only; `pinned_memory_*` are 0;
- `GetMetrics` writes upstream's exact text: `cuzk_proofs_completed` declared a counter without
  `_total`, and `cuzk_proof_duration_seconds` `_count`/`_sum` computed from a ring of the last
  1,000 durations (not monotonic);
- the HTTP status server is off by default (`status_listen = ""`); turned on, it serves
  upstream's `/status` from a copy of its StatusTracker (status.rs): PoRep and SnapDeals jobs
  walk their partitions through it, PoSt jobs never appear (monolithic), only the partition
  assembler's success counts in its counters, a failed job stays listed, completed jobs leave
  after 30 s.

Stricter than the real one: a PoRep C2 whose `vanilla_proof` is not a JSON object fails (upstream
fails later, in the prover), and an empty `request_id` is INVALID_ARGUMENT.

Proving is simulated: a job holds a GPU worker for the configured synthesis and GPU seconds (the
fake's stand-in for a GPU, scaled down for tests), loading its SRS on demand first when not
preloaded (and, as upstream, not listing it in `loaded_srs` then).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import tempfile
import threading
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import grpc

from tests.vastmgr.fake_upstream import FakeUpstream
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc import proving_pb2_grpc

MAX_MESSAGE = 128 * 1024 * 1024
GIB = 1 << 30
# ProofKind (proto) -> (its Display in /status, its Prometheus label, its SRS circuit prefix,
# default priority).
KINDS = {
    pb.POREP_SEAL_COMMIT: ("porep-c2", "porep_c2", "porep", pb.NORMAL),
    pb.SNAP_DEALS_UPDATE: ("snap-update", "snap_update", "snap", pb.NORMAL),
    pb.WINDOW_POST_PARTITION: ("window-post", "window_post", "wpost", pb.HIGH),
    pb.WINNING_POST: ("winning-post", "winning_post", "winning", pb.CRITICAL),
}
CIRCUITS = ("porep-32g", "snap-32g", "wpost-32g", "winning-32g")
RING = 1000  # engine.rs keeps the last 1000 proof durations
# Partitions of the jobs upstream pipelines per partition (32 GiB sectors); PoSt is monolithic.
PARTITIONS = {pb.POREP_SEAL_COMMIT: 10, pb.SNAP_DEALS_UPDATE: 16}


@dataclass
class FakeGPU:
    ordinal: int
    name: str = "NVIDIA GeForce RTX 5090"
    vram_total_bytes: int = 32 * GIB
    vram_free_bytes: int = 30 * GIB


@dataclass
class Job:
    job_id: str
    kind: int
    priority: int
    circuit: str
    submitted: float
    seq: int
    state: str = "queued"  # queued, running, completed, failed
    result: pb.AwaitProofResponse | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _State:
    """Everything the daemon knows; one lock, as upstream's engine holds its state."""

    def __init__(self, gpus: list[FakeGPU], workers_per_gpu: int, synthesis_s: float,
                 gpu_s: float, srs_load_s: float, ring: int):
        self.lock = threading.Condition()
        self.gpus = gpus
        self.workers: list[tuple[int, Job | None]] = [
            (gpu.ordinal, None) for gpu in gpus for _ in range(workers_per_gpu)]
        self.synthesis_s, self.gpu_s, self.srs_load_s = synthesis_s, gpu_s, srs_load_s
        self.jobs: dict[str, Job] = {}
        self.heap: list[tuple[int, int, str]] = []  # (-priority, seq, job id)
        self.seq = itertools.count()
        self.preloaded: list[str] = []  # PreloadSRS only, in load order
        self.loaded: set[str] = set()  # every SRS in memory, however it got there
        self.completed = self.failed = 0
        self.completed_by_kind: dict[int, int] = {}
        self.failed_by_kind: dict[int, int] = {}
        self.recent: deque[tuple[int, float]] = deque(maxlen=ring)
        self.started = time.monotonic()
        self.fail_next: str | None = None
        self.calls: list[tuple[str, str]] = []  # (method, its key argument), for tests
        self.closed = False
        self.tracker = _Tracker(self.workers, lambda: len(self.heap))

    def settle(self, job: Job, *, failed: bool) -> None:
        """Count a job that ended (the lock is held)."""
        s = self
        if failed:
            s.failed += 1
            s.failed_by_kind[job.kind] = s.failed_by_kind.get(job.kind, 0) + 1
        else:
            s.completed += 1
            s.completed_by_kind[job.kind] = s.completed_by_kind.get(job.kind, 0) + 1
            s.recent.append((job.kind, job.result.total_ms / 1000 if job.result else 0.0))
        job.done.set()


class _Servicer(proving_pb2_grpc.ProvingEngineServicer):
    def __init__(self, state: _State):
        self.s = state

    # ---- proofs -----------------------------------------------------------------------

    def _accept(self, request: pb.SubmitProofRequest, context) -> Job:
        if request.proof_kind not in KINDS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"invalid proof_kind: {request.proof_kind}")
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is empty")
        _display, _label, prefix, default_priority = KINDS[request.proof_kind]
        size = request.sector_size
        circuit = f"{prefix}-{size // GIB}g" if size and size % GIB == 0 else f"{prefix}-{size}b"
        s = self.s
        with s.lock:
            if request.request_id in s.jobs and not s.jobs[request.request_id].done.is_set():
                context.abort(grpc.StatusCode.INTERNAL,
                              f"job {request.request_id} is already in flight")
            job = Job(request.request_id, request.proof_kind,
                      request.priority or default_priority, circuit, time.monotonic(),
                      next(s.seq))
            if request.proof_kind == pb.POREP_SEAL_COMMIT and not _json_object(
                    request.vanilla_proof):
                job.state = "failed"
                job.result = pb.AwaitProofResponse(
                    job_id=job.job_id, status=pb.AwaitProofResponse.FAILED,
                    error_message="parse C1 output: not a JSON object")
            s.jobs[job.job_id] = job
            s.calls.append(("SubmitProof", job.job_id))
            if job.result is not None:
                s.settle(job, failed=True)
            else:
                heapq.heappush(s.heap, (-job.priority, job.seq, job.job_id))
                s.lock.notify_all()
        return job

    def SubmitProof(self, request, context):
        job = self._accept(request, context)
        with self.s.lock:
            position = sum(1 for _, _, jid in self.s.heap if jid != job.job_id)
        return pb.SubmitProofResponse(job_id=job.job_id, queue_position=position,
                                      assigned_gpu="")

    def AwaitProof(self, request, context):
        with self.s.lock:
            self.s.calls.append(("AwaitProof", request.job_id))
            job = self.s.jobs.get(request.job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job not found: {request.job_id}")
        while not job.done.wait(0.05):
            if not context.is_active():
                return pb.AwaitProofResponse()
        assert job.result is not None
        return job.result

    def Prove(self, request, context):
        if not request.HasField("submit"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing submit field")
        job = self._accept(request.submit, context)
        job.done.wait()
        return pb.ProveResponse(result=job.result)

    def CancelProof(self, request, context):
        with self.s.lock:
            self.s.calls.append(("CancelProof", request.job_id))
        return pb.CancelProofResponse(was_running=False)

    # ---- status and metrics -----------------------------------------------------------

    def GetStatus(self, request, context):
        s = self.s
        with s.lock:
            pending: dict[int, int] = {}
            for _, _, jid in s.heap:
                pending[s.jobs[jid].kind] = pending.get(s.jobs[jid].kind, 0) + 1
            running: dict[int, int] = {}
            for _, job in s.workers:
                if job is not None:
                    running[job.kind] = running.get(job.kind, 0) + 1
            detected = {gpu.ordinal: gpu for gpu in s.gpus}
            gpus = []
            for ordinal, job in s.workers:
                gpu = detected.get(ordinal)
                gpus.append(pb.GPUStatus(
                    ordinal=ordinal, name=gpu.name if gpu else f"GPU {ordinal}",
                    vram_total_bytes=gpu.vram_total_bytes if gpu else 0,
                    vram_free_bytes=gpu.vram_free_bytes if gpu else 0,
                    current_job_id=job.job_id if job else "",
                    current_proof_kind=KINDS[job.kind][0] if job else ""))
            return pb.GetStatusResponse(
                gpus=gpus,
                loaded_srs=[pb.SRSStatus(circuit_id=c, tier=pb.SRSStatus.HOT, size_bytes=0,
                                         ref_count=0) for c in s.preloaded],
                queues=[pb.QueueStatus(proof_kind=KINDS[kind][0], pending=count,
                                       in_progress=running.get(kind, 0))
                        for kind, count in sorted(pending.items())],
                total_proofs_completed=s.completed, total_proofs_failed=s.failed,
                uptime_seconds=int(time.monotonic() - s.started),
                pinned_memory_bytes=0, pinned_memory_limit_bytes=0)

    def GetMetrics(self, request, context):
        s = self.s
        with s.lock:
            running = sum(1 for _, job in s.workers if job is not None)
            lines = [
                "# HELP cuzk_proofs_completed_total Total proofs completed",
                "# TYPE cuzk_proofs_completed_total counter",
                f"cuzk_proofs_completed_total {s.completed}",
                "# HELP cuzk_proofs_failed_total Total proofs failed",
                "# TYPE cuzk_proofs_failed_total counter",
                f"cuzk_proofs_failed_total {s.failed}",
                "# HELP cuzk_uptime_seconds Daemon uptime",
                "# TYPE cuzk_uptime_seconds gauge",
                f"cuzk_uptime_seconds {int(time.monotonic() - s.started)}",
                "# HELP cuzk_queue_depth Current queue depth",
                "# TYPE cuzk_queue_depth gauge",
                f"cuzk_queue_depth {len(s.heap)}",
                "# HELP cuzk_proofs_completed Per proof-kind completions",
                "# TYPE cuzk_proofs_completed counter",
                *(f'cuzk_proofs_completed{{proof_kind="{KINDS[k][1]}"}} {n}'
                  for k, n in s.completed_by_kind.items()),
                "# HELP cuzk_proofs_failed Per proof-kind failures",
                "# TYPE cuzk_proofs_failed counter",
                *(f'cuzk_proofs_failed{{proof_kind="{KINDS[k][1]}"}} {n}'
                  for k, n in s.failed_by_kind.items()),
            ]
            if s.recent:
                lines += ["# HELP cuzk_proof_duration_seconds Proof duration",
                          "# TYPE cuzk_proof_duration_seconds summary"]
                by_kind: dict[int, tuple[int, float]] = {}
                for kind, seconds in s.recent:
                    count, total = by_kind.get(kind, (0, 0.0))
                    by_kind[kind] = (count + 1, total + seconds)
                for kind, (count, total) in by_kind.items():
                    label = KINDS[kind][1]
                    lines += [f'cuzk_proof_duration_seconds_count{{proof_kind="{label}"}} {count}',
                              f'cuzk_proof_duration_seconds_sum{{proof_kind="{label}"}} {total:.3f}']
            lines += ["# HELP cuzk_running_jobs Currently running proofs",
                      "# TYPE cuzk_running_jobs gauge", f"cuzk_running_jobs {running}",
                      "# HELP cuzk_gpu_workers Number of GPU workers",
                      "# TYPE cuzk_gpu_workers gauge", f"cuzk_gpu_workers {len(s.workers)}"]
        return pb.GetMetricsResponse(prometheus_text="\n".join(lines) + "\n")

    # ---- SRS ----------------------------------------------------------------------------

    def PreloadSRS(self, request, context):
        s = self.s
        with s.lock:
            s.calls.append(("PreloadSRS", request.circuit_id))
        if request.circuit_id not in CIRCUITS:
            context.abort(grpc.StatusCode.INTERNAL,
                          f"unknown circuit id: {request.circuit_id}")
        with s.lock:
            already = request.circuit_id in s.loaded
        started = time.monotonic()
        if not already:
            time.sleep(s.srs_load_s)  # the fake's stand-in for reading the parameters
        with s.lock:
            s.loaded.add(request.circuit_id)
            if request.circuit_id not in s.preloaded:
                s.preloaded.append(request.circuit_id)
        return pb.PreloadSrsResponse(already_loaded=already,
                                     load_time_ms=int((time.monotonic() - started) * 1000))

    def EvictSRS(self, request, context):
        with self.s.lock:
            self.s.calls.append(("EvictSRS", request.circuit_id))
        return pb.EvictSrsResponse(was_loaded=False, freed_bytes=0)


def _json_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


def _worker_loop(s: _State, slot: int) -> None:
    """One GPU worker: take the highest-priority job, load its SRS, synthesize, prove."""
    while True:
        with s.lock:
            while not s.heap and not s.closed:
                s.lock.wait()
            if s.closed:
                return
            _, _, job_id = heapq.heappop(s.heap)
            job = s.jobs[job_id]
            job.state = "running"
            ordinal = s.workers[slot][0]
            s.workers[slot] = (ordinal, job)
            needs_srs = job.circuit not in s.loaded
            fail = s.fail_next
            s.fail_next = None
        picked = time.monotonic()
        srs_s = s.srs_load_s if needs_srs else 0.0
        partitions = PARTITIONS.get(job.kind, 0)
        # The fake's stand-in for proving: sleeps as long as the configured phases. A
        # partitioned job (PoRep, SnapDeals) walks its partitions through the status tracker, as
        # upstream's pipeline does; a monolithic one (PoSt) never touches it.
        if partitions:
            s.tracker.register(job.job_id, KINDS[job.kind][0], partitions)
        time.sleep(srs_s)
        with s.lock:
            s.loaded.add(job.circuit)  # on demand: in memory, never listed in loaded_srs
        if partitions:
            s.tracker.synthesize(job.job_id)
        time.sleep(s.synthesis_s)
        if partitions:
            s.tracker.synthesized(job.job_id)
            for index in range(partitions):
                s.tracker.gpu_start(job.job_id, index, slot)
                time.sleep(s.gpu_s / partitions)
                # As upstream, a partition whose GPU step failed is marked done all the same.
                s.tracker.gpu_end(job.job_id, index, slot)
        else:
            time.sleep(s.gpu_s)
        with s.lock:
            s.workers[slot] = (ordinal, None)
            if fail:
                job.state = "failed"
                job.result = pb.AwaitProofResponse(job_id=job.job_id,
                                                   status=pb.AwaitProofResponse.FAILED,
                                                   error_message=fail)
            else:
                job.state = "completed"
                total = time.monotonic() - job.submitted
                job.result = pb.AwaitProofResponse(
                    job_id=job.job_id, status=pb.AwaitProofResponse.COMPLETED,
                    proof=hashlib.sha512(job.job_id.encode()).digest() * 3,  # 192 bytes
                    queue_wait_ms=int((picked - job.submitted) * 1000),
                    srs_load_ms=int(srs_s * 1000), synthesis_ms=int(s.synthesis_s * 1000),
                    gpu_compute_ms=int(s.gpu_s * 1000), total_ms=int(total * 1000))
            s.settle(job, failed=bool(fail))
        if partitions and not fail:
            # Only the partition assembler's success path reaches job_completed: a failed job
            # stays listed forever and is never counted failed in /status.
            s.tracker.completed(job.job_id, KINDS[job.kind][0])


class _Tracker:
    """Upstream's StatusTracker (cuzk-core/src/status.rs) for the fake's `/status`: partitioned
    jobs only, counters only from job_completed, completed jobs dropped after 30 s."""

    def __init__(self, workers: list[tuple[int, Job | None]], queue_depth):
        self.lock = threading.Lock()
        self.jobs: dict[str, dict] = {}
        self.synth_active = 0
        self.workers = [{"worker_id": slot, "gpu_ordinal": ordinal, "job": None, "partition": None,
                         "since": None} for slot, (ordinal, _) in enumerate(workers)]
        self.total_completed = self.total_failed = 0
        self.completed_by_kind: dict[str, int] = {}
        self.queue_depth = queue_depth
        self.started = time.monotonic()

    def register(self, job_id: str, kind: str, partitions: int) -> None:
        with self.lock:
            self.jobs[job_id] = {"kind": kind, "started": time.monotonic(), "completed": None,
                                 "partitions": [{"state": "pending", "synth": [None, None],
                                                 "gpu": [None, None]}
                                                for _ in range(partitions)]}

    def synthesize(self, job_id: str) -> None:
        with self.lock:
            for part in self.jobs[job_id]["partitions"]:
                part["state"], part["synth"][0] = "synthesizing", time.monotonic()
                self.synth_active += 1

    def synthesized(self, job_id: str) -> None:
        with self.lock:
            for part in self.jobs[job_id]["partitions"]:
                part["state"], part["synth"][1] = "synth_done", time.monotonic()
                self.synth_active -= 1

    def gpu_start(self, job_id: str, index: int, slot: int) -> None:
        with self.lock:
            part = self.jobs[job_id]["partitions"][index]
            part["state"], part["gpu"][0] = "gpu", time.monotonic()
            self.workers[slot].update(job=job_id, partition=index, since=time.monotonic())

    def gpu_end(self, job_id: str, index: int, slot: int) -> None:
        with self.lock:
            part = self.jobs[job_id]["partitions"][index]
            part["state"], part["gpu"][1] = "done", time.monotonic()
            self.workers[slot].update(job=None, partition=None, since=None)

    def completed(self, job_id: str, kind: str) -> None:
        with self.lock:
            self.total_completed += 1
            self.completed_by_kind[kind] = self.completed_by_kind.get(kind, 0) + 1
            self.jobs[job_id]["completed"] = time.monotonic()

    def snapshot(self, srs: list[str]) -> dict:
        now = time.monotonic()

        def elapsed(span) -> int | None:
            start, end = span
            return None if start is None else int(((end or now) - start) * 1000)

        with self.lock:
            self.jobs = {jid: job for jid, job in self.jobs.items()
                         if job["completed"] is None or now - job["completed"] < 30}
            states = [p["state"] for job in self.jobs.values() for p in job["partitions"]]
            return {
                "uptime_secs": now - self.started,
                "memory": {"total_bytes": 96 * GIB, "used_bytes": 0, "available_bytes": 96 * GIB},
                "synthesis": {"max_concurrent": 16, "active": self.synth_active},
                "pipelines": [{
                    "job_id": jid, "proof_kind": job["kind"],
                    "started_secs_ago": now - job["started"],
                    "total_partitions": len(job["partitions"]),
                    "partitions_done": sum(p["state"] == "done" for p in job["partitions"]),
                    "partitions": [{"index": i, "state": p["state"], "synth_ms": elapsed(p["synth"]),
                                    "gpu_ms": elapsed(p["gpu"])}
                                   for i, p in enumerate(job["partitions"])]}
                    for jid, job in self.jobs.items()],
                "gpu_workers": [{
                    "worker_id": w["worker_id"], "gpu_ordinal": w["gpu_ordinal"],
                    "state": "idle" if w["job"] is None else "proving",
                    "current_job": w["job"], "current_partition": w["partition"],
                    "busy_secs": None if w["since"] is None else now - w["since"]}
                    for w in self.workers],
                "allocations": {"srs": [{"circuit_id": c, "bytes": 47 * GIB,
                                         "last_used_secs_ago": 0.0, "evictable": False}
                                        for c in srs], "pce": []},
                "counters": {"total_completed": self.total_completed,
                             "total_failed": self.total_failed,
                             "completed_by_kind": dict(self.completed_by_kind),
                             "failed_by_kind": {}, "queue_depth": self.queue_depth()},
                "buffers": {"synth_in_flight": states.count("synthesizing"),
                            "provers_in_flight": states.count("gpu"),
                            "aux_in_flight": states.count("gpu"),
                            "shells_in_flight": states.count("gpu"),
                            "pending_handles": states.count("synth_done")},
            }


class _StatusServer(FakeUpstream):
    """The daemon's HTTP status server (`status_listen`): upstream's hand-rolled GET /status
    (fake_upstream.py's handler), answering with the tracker's snapshot."""

    def __init__(self, state: _State):
        super().__init__([])
        self.state = state

    def body(self) -> dict:
        with self.state.lock:
            srs = sorted(self.state.loaded)
        return self.state.tracker.snapshot(srs)


class FakeCuzkDaemon:
    """`with FakeCuzkDaemon() as daemon:` serves on `daemon.url` until the block ends."""

    def __init__(self, *, socket_path: str | Path | None = None, tcp: bool = False,
                 gpus: list[FakeGPU] | None = None, workers_per_gpu: int = 2,
                 synthesis_s: float = 0.2, gpu_s: float = 0.2, srs_load_s: float = 0.1,
                 ring: int = RING, status_listen: bool = False):
        self.state = _State(gpus if gpus is not None else [FakeGPU(0)], workers_per_gpu,
                            synthesis_s, gpu_s, srs_load_s, ring)
        self._tmp: tempfile.TemporaryDirectory | None = None
        if not tcp and socket_path is None:
            # A short path: unix socket paths are limited to ~107 bytes.
            self._tmp = tempfile.TemporaryDirectory(prefix="cuzk-")
            socket_path = Path(self._tmp.name) / "cuzk.sock"
        self.socket_path = None if tcp else str(socket_path)
        self.port = 0
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            options=[("grpc.max_send_message_length", MAX_MESSAGE),
                     ("grpc.max_receive_message_length", MAX_MESSAGE)])
        proving_pb2_grpc.add_ProvingEngineServicer_to_server(_Servicer(self.state), self._server)
        if self.socket_path is not None:
            self._server.add_insecure_port(f"unix://{self.socket_path}")
        else:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
        # Off by default, as upstream's `[daemon] status_listen = ""`.
        self.status_server = _StatusServer(self.state) if status_listen else None
        self._threads = [threading.Thread(target=_worker_loop, args=(self.state, slot),
                                          daemon=True, name=f"fake-cuzk-worker-{slot}")
                         for slot in range(len(self.state.workers))]

    @property
    def url(self) -> str:
        if self.socket_path is not None:
            return f"unix://{self.socket_path}"
        return f"grpc://127.0.0.1:{self.port}"

    def calls(self, method: str) -> list[str]:
        with self.state.lock:
            return [key for name, key in self.state.calls if name == method]

    def fail_next(self, message: str) -> None:
        """The next proof a worker picks up fails with `message`."""
        with self.state.lock:
            self.state.fail_next = message

    @property
    def status_port(self) -> int:
        assert self.status_server is not None, "the status server is off (status_listen)"
        return self.status_server.port

    def __enter__(self) -> Self:
        self._server.start()
        if self.status_server is not None:
            self.status_server.__enter__()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.state.lock:
            self.state.closed = True
            self.state.lock.notify_all()
        self._server.stop(grace=None).wait()
        if self.status_server is not None:
            self.status_server.__exit__()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._tmp is not None:
            self._tmp.cleanup()
