"""The asyncio orchestrator: admission, synthesis pool, device workers and finalizers.

Pipelined mode: jobs leave the priority queue when the synthesis stage has room; their
partitions are synthesized in a process pool under the memory budget, then proved by N workers
per device. Split proving: a worker holds the device lock only for prove_start, gives back the
a/b/c budget, hands the pending proof to a finalizer (prove_finish + self-verify) and picks up
its next partition at once. Monolithic mode: one worker per device synthesizes and proves one
whole job at a time.

Each partition is settled exactly once on the engine side (done, failed or dropped), which is
when its reservation returns and, for the last one, the job's parameter reference is released.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from cuzk_engine.config import EngineConfig
from cuzk_engine.engine.devices import Device, open_devices
from cuzk_engine.engine.memory import MemoryBudget, Reservation, format_bytes
from cuzk_engine.engine.pool import synthesis_pool
from cuzk_engine.engine.queues import JobQueue, PartitionQueue
from cuzk_engine.engine.snapshot import CpuSnapshot, EngineSnapshot, PartitionSnapshot
from cuzk_engine.engine.srs import SrsManager
from cuzk_engine.engine.stages import Stages, real_stages
from cuzk_engine.engine.status import JobRecord, StatusTracker
from cuzk_engine.errors import (
    BudgetExceeded,
    CuzkError,
    EngineNotAccepting,
    InvalidRequest,
    JobNotFound,
    RequestConflict,
)
from cuzk_engine.native.msm import set_process_threads as set_msm_process_threads
from cuzk_engine.vocabulary import PRIORITY_RANK

log = logging.getLogger("cuzk_engine.engine")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# Jobs started apart while their parameters are generated: enough that a generation never
# holds back the queue, few enough that queued circuits are not all generated ahead of need.
GENERATING_AT_ONCE = 2
UNCOLLECTED_RECENT = 60.0  # seconds: a drain also waits for uncollected results this recent


def _shown(value: Any, limit: int = 60) -> str:
    """A client's value quoted in an error message, cut short: a 60 kB string is not echoed."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return "a number too large to show"
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(eq=False)
class Job:
    """A job as the engine runs it. Its state — status, error, times — is the tracker's record,
    read here; the engine adds only what the tracker does not hold: the seed, the proofs, the
    per-stage timings, the parameters it holds and the events its waiters wait on."""

    record: JobRecord
    seed: int
    seq: int
    submitted_at: float  # wall-clock seconds, for people
    # Who cancelled it: "request" (DELETE /v1/proofs/{id}) or "engine" (its own shutdown). A
    # client re-queues an engine-cancelled job elsewhere; only a request's cancel is final.
    cancelled_by: str | None = None
    synthesis_ms: float = 0.0
    gpu_ms: float = 0.0
    device_lock_ms: float = 0.0  # prove_start with the device lock held (no lock wait)
    finalize_ms: float = 0.0
    proofs: list[bytes | None] = field(default_factory=list)
    public_inputs: list[list[int] | None] = field(default_factory=list)
    verified: bool | None = None
    vk: dict | None = None
    unsettled: int = 0
    params: Any = None
    holds_srs: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    collected: asyncio.Event = field(default_factory=asyncio.Event)  # final result fetched

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def request_id(self) -> str | None:
        return self.record.request_id

    @property
    def kind(self) -> str:
        return self.record.kind

    @property
    def profile(self) -> str:
        return self.record.profile

    @property
    def priority(self) -> str:
        return self.record.priority

    @property
    def circuit_id(self) -> str:
        return self.record.circuit_id

    @property
    def partitions(self) -> int:
        return len(self.record.parts)

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def error(self) -> str | None:
        return self.record.error

    @property
    def terminal(self) -> bool:
        return self.record.terminal

    def same_request(self, kind: str, profile: str, seed: int) -> bool:
        return (self.kind, self.profile, self.seed) == (kind, profile, seed)

    def result(self, partitions: list[PartitionSnapshot] | None = None) -> dict:
        """The job's record for its client; ``partitions`` (from the tracker) are its
        partitions' states and times now (``partition_states``), so an ended job's record says
        where each one settled, and ``settled`` whether all have (none is still on a device
        or finalizing)."""
        rec = self.record
        done = rec.status == "done"
        total = None if rec.finished is None else (rec.finished - rec.submitted) * 1000.0
        queue = None if rec.started is None else (rec.started - rec.submitted) * 1000.0
        return {
            "job_id": rec.job_id,
            "request_id": rec.request_id,
            "kind": rec.kind,
            "profile": rec.profile,
            "seed": self.seed,
            "priority": rec.priority,
            "circuit_id": rec.circuit_id,
            "partitions": self.partitions,
            "status": rec.status,
            "cancelled_by": self.cancelled_by,
            "submitted_at": self.submitted_at,
            "timings": {
                "queue_ms": _r(queue),
                # 0 until the parameters are loaded, then the load (0 when already resident)
                "srs_load_ms": _r(0.0 if rec.srs_load_ms is None else rec.srs_load_ms),
                "synthesis_ms": _r(self.synthesis_ms),
                "gpu_ms": _r(self.gpu_ms),
                "finalize_ms": _r(self.finalize_ms),
                "total_ms": _r(total),
            },
            # done: every partition's proof and public inputs are in
            "proof": b"".join(cast("list[bytes]", self.proofs)).hex() if done else None,
            "public_inputs": ([[str(x) for x in pi]
                               for pi in cast("list[list[int]]", self.public_inputs)]
                              if done else None),
            "vk": self.vk if done else None,
            # true only for a proof that exists and verified; a failed self-check stays false
            "verified": self.verified if done or self.verified is False else None,
            "error": rec.error,
            "settled": rec.settled(),
            "partition_states": (None if partitions is None
                                 else [p._asdict() for p in partitions]),
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


@dataclass
class _Item:
    """A partition travelling through the pipeline."""

    job: Job
    index: int
    reservation: Reservation | None = None
    synth: Any = None

    def keep_reserved(self, nbytes: int) -> None:
        """Shrink the partition's reservation to what it still holds in memory."""
        if self.reservation is not None:
            self.reservation.shrink_to(nbytes)


class Engine:
    def __init__(self, config: EngineConfig, *, stages: Stages | None = None,
                 synth_executor: Executor | None = None):
        self.config = config
        self.stages = stages or real_stages()
        self.pipelined = config.pipeline.enabled
        self.devices: list[Device] = open_devices(config.devices, self.stages)
        self.workers_per_device = config.gpu_workers_per_device if self.pipelined else 1
        self.synth_workers = config.resolved_synthesis_workers()
        # every worker may run MSMs on the CPU at once: on a CPU device its whole proof, on a
        # GPU its finalizer's G2 MSM; they share the cores with the synthesis processes
        provers = len(self.devices) * self.workers_per_device
        self.msm_threads = config.resolved_msm_threads(provers)
        set_msm_process_threads(self.msm_threads)
        self.budget = MemoryBudget(config.memory.resolve_total())
        self.tracker = StatusTracker(
            [d.info() for d in self.devices], self.workers_per_device,
            memory=self.budget.usage, synthesis_max_concurrent=self.synth_workers,
            cpu=CpuSnapshot(os.cpu_count() or 1, self.synth_workers, self.msm_threads, provers),
            retention=config.status.retention,
        )
        self.srs = SrsManager(config.param_cache, self.budget, self.tracker, self.stages,
                              min_idle=config.memory.eviction_min_idle, clock=self.tracker.now)
        self.budget.evictor = self.srs.evict_idle
        self._own_synth_executor = synth_executor is None
        self._synth_executor = synth_executor
        self._jobs: dict[str, Job] = {}
        self._job_seq = 0
        self._job_queue = JobQueue()
        self._synth_queue = PartitionQueue()
        self._gpu_queue = PartitionQueue()
        self._wake_admit = asyncio.Event()
        self._generating = 0  # jobs started apart while their parameters are generated
        self._wake_synth = asyncio.Event()
        self._wake_gpu = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._device_pools: dict[int, ThreadPoolExecutor] = {}
        self._finalizer_pool: ThreadPoolExecutor | None = None
        self._accepting = False
        self.job_listeners: list[Callable[[Job], None]] = []
        self._clock = self.tracker.now

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._synth_executor is None:
            self._synth_executor = synthesis_pool(self.synth_workers)
        n_workers = len(self.devices) * self.workers_per_device
        self._finalizer_pool = ThreadPoolExecutor(max(n_workers, 1),
                                                  thread_name_prefix="finalizer")
        for d in self.devices:
            self._device_pools[d.ordinal] = ThreadPoolExecutor(
                self.workers_per_device, thread_name_prefix=f"device{d.ordinal}")
        wid = 0
        for d in self.devices:
            for _ in range(self.workers_per_device):
                coro = self._device_worker(wid, d) if self.pipelined else self._mono_worker(wid, d)
                self._tasks.append(asyncio.create_task(coro, name=f"worker{wid}"))
                wid += 1
        if self.pipelined:
            self._tasks.append(asyncio.create_task(self._admit_loop(), name="admit"))
            self._tasks.append(asyncio.create_task(self._synth_loop(), name="synth"))
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        self._accepting = True
        self.tracker.set_accepting(True)

    async def drain(self) -> None:
        """Stop accepting, cancel what has not started, let running jobs finish, then give
        clients up to ``daemon.drain_linger`` seconds to fetch every result that ended during
        the drain (a controller learns which jobs finished and which to queue again)."""
        self._accepting = False
        self.tracker.set_accepting(False)
        # Jobs ending now, or ended just before, whose outcome a client may still be waiting for.
        recent = self._clock() - UNCOLLECTED_RECENT
        ending = [j for j in self._jobs.values() if j.request_id is not None
                  and not j.collected.is_set()
                  and (j.record.finished is None or j.record.finished >= recent)]
        for job_id in self._job_queue.ids():
            self._cancel_job(self._jobs[job_id], "engine shutting down", by="engine")
        await asyncio.gather(*(j.settled.wait() for j in list(self._jobs.values())))
        uncollected = [j.collected.wait() for j in ending if not j.collected.is_set()]
        if uncollected:
            try:
                await asyncio.wait_for(asyncio.gather(*uncollected),
                                       self.config.daemon.drain_linger)
            except TimeoutError:
                log.warning("%d result(s) of the drain were not fetched within %gs",
                            sum(not j.collected.is_set() for j in ending),
                            self.config.daemon.drain_linger)

    async def stop(self, *, fast: bool = False) -> None:
        """Stop the engine. ``fast`` cancels running jobs instead of letting them finish."""
        self._accepting = False
        self.tracker.set_accepting(False)
        if fast:
            for job in list(self._jobs.values()):
                if not job.terminal:
                    self._cancel_job(job, "engine stopped", by="engine")
        else:
            await self.drain()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if fast:
            for t in list(self._background):
                t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for pool in self._device_pools.values():
            pool.shutdown(wait=not fast, cancel_futures=True)
        if self._finalizer_pool is not None:
            self._finalizer_pool.shutdown(wait=not fast, cancel_futures=True)
        if self._own_synth_executor and self._synth_executor is not None:
            self._synth_executor.shutdown(wait=not fast, cancel_futures=True)
        self.srs.evict_all_idle()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("engine task failed", exc_info=task.exception())

    # ------------------------------------------------------------------ public API

    def validate(self, kind: Any, profile: Any, seed: Any, priority: Any,
                 request_id: Any) -> None:
        # Types first: a list or dict from JSON must never reach a dict lookup (unhashable).
        st = self.stages
        if not isinstance(kind, str) or kind not in st.kinds:
            raise InvalidRequest(f"unknown kind {_shown(kind)} (kinds: {', '.join(st.kinds)})")
        if not isinstance(profile, str) or profile not in st.profiles:
            raise InvalidRequest(
                f"unknown profile {_shown(profile)} (profiles: {', '.join(st.profiles)})")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= st.max_seed:
            raise InvalidRequest(
                f"seed must be an integer in [0, {st.max_seed}], got {_shown(seed)}")
        if priority is not None and (not isinstance(priority, str)
                                     or priority not in PRIORITY_RANK):
            raise InvalidRequest(
                f"unknown priority {_shown(priority)} (use one of {', '.join(PRIORITY_RANK)})")
        if request_id is not None and (not isinstance(request_id, str)
                                       or not _REQUEST_ID.fullmatch(request_id)):
            raise InvalidRequest("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : @ -")

    def submit(self, kind: str, profile: str, seed: int, *, priority: str | None = None,
               request_id: str | None = None) -> tuple[Job, int, bool]:
        """Queue a proof; returns (job, queue_position, created). The same request_id always
        returns the same job and never submits twice."""
        self.validate(kind, profile, seed, priority, request_id)
        if request_id is not None and request_id in self._jobs:
            job = self._jobs[request_id]
            if not job.same_request(kind, profile, seed):
                raise RequestConflict(
                    f"request_id {request_id!r} was already used for {job.kind}/{job.profile} "
                    f"seed {job.seed}")
            if job.cancelled_by == "engine":
                # Our shutdown cancelled it: it must run elsewhere (or here after a restart),
                # not be answered with the cancelled record as if that were its outcome.
                raise EngineNotAccepting(
                    "the engine is shutting down and cancelled this request; submit it again "
                    "later or to another engine")
            return job, self._position(job), False
        if not self._accepting:
            raise EngineNotAccepting("the engine is shutting down and accepts no new proofs")
        circuit = self.stages.circuit_id(kind, profile)
        n = self.stages.partition_count(kind, profile)
        job_id = request_id or str(uuid.uuid4())
        prio = priority or self.config.priorities.get(kind, "normal")
        record = self.tracker.register_job(job_id, kind=kind, profile=profile,
                                           circuit_id=circuit, priority=prio, partitions=n,
                                           request_id=request_id)
        job = Job(record, seed, self._job_seq, self.tracker.wall_time(record.submitted),
                  proofs=[None] * n, public_inputs=[None] * n, unsettled=n)
        self._job_seq += 1
        self._jobs[job_id] = job
        position = self._job_queue.push(job_id, prio)
        self._wake_admit.set()
        return job, position, True

    def _position(self, job: Job) -> int:
        if job.job_id not in self._job_queue:
            return 0
        return self._job_queue.position(job.job_id)

    def get(self, job_id: str) -> Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise JobNotFound(f"no job {_shown(job_id, 140)}") from None

    async def wait(self, job_id: str, timeout: float | None) -> Job:
        """The job, once it ended and every partition settled (a cancelled job's partition
        on a device lets go when the device does), or after `timeout`; the caller hands its
        result over, so an ended job counts as collected (a drain lingers until those it
        ended are)."""
        job = self.get(job_id)
        if not (job.terminal and job.record.settled()) and timeout:
            try:
                await asyncio.wait_for(self._ended_and_settled(job), timeout)
            except TimeoutError:
                pass
        if job.terminal:
            job.collected.set()
        return job

    @staticmethod
    async def _ended_and_settled(job: Job) -> None:
        await job.ended.wait()
        if not job.record.settled():
            await job.settled.wait()

    def result(self, job: Job) -> dict:
        """A job's record for its client, with its partitions as the tracker has them now."""
        return job.result(self.tracker.partitions_of(job.record))

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if not job.terminal:
            self._cancel_job(job, "cancelled by request", by="request")
        job.collected.set()  # whoever cancelled it gets the result in the answer
        return job

    def snapshot(self) -> EngineSnapshot:
        return self.tracker.snapshot()

    async def preload(self, circuit_id: str) -> tuple[bool, float]:
        return await self.srs.preload(circuit_id)

    def evict(self, circuit_id: str) -> int:
        return self.srs.evict(circuit_id)

    def info(self) -> dict:
        from cuzk_engine import __version__

        return {
            "version": __version__,
            "mode": ("pipelined, split prove" if self.config.pipeline.split_prove
                     else "pipelined") if self.pipelined else "monolithic",
            "devices": [{"ordinal": d.ordinal, "name": d.name, "description": d.description}
                        for d in self.devices],
            "gpu_workers_per_device": self.workers_per_device,
            "synthesis_workers": self.synth_workers,
            "msm_threads": self.msm_threads,
            "memory_budget_bytes": self.budget.total,
            "kinds": list(self.stages.kinds),
            "profiles": list(self.stages.profiles),
            "priorities": dict(self.config.priorities),
            "self_verify": self.config.pipeline.self_verify,
            "accepting": self._accepting,
            "started_at": self.tracker.wall_time(self.tracker.started),
        }

    @property
    def accepting(self) -> bool:
        return self._accepting

    # ------------------------------------------------------------------ job endings

    def _cancel_job(self, job: Job, reason: str, *, by: str) -> None:
        if not job.terminal:
            job.cancelled_by = by
        was_queued = self._job_queue.remove(job.job_id)
        self._end_job(job, "cancelled", reason)
        if was_queued:  # none of its partitions ever started: they all settle now
            self._settle(job, job.unsettled)

    def _fail_partition(self, item: _Item, reason: str, token: int | None = None) -> None:
        """A partition failed, which fails its job: the other way a job ends."""
        self._release(item)
        if self.tracker.partition_failed(item.job.job_id, item.index, reason, token=token):
            self._job_ended(item.job)
        self._settle(item.job)

    def _end_job(self, job: Job, status: str, reason: str = "") -> None:
        """End a job (unless it has ended already): the tracker records how (``reason``: why it
        failed or was cancelled), then the engine lets go of what the job still holds."""
        if status == "done":
            self.tracker.job_done(job.job_id)  # raises if it had ended: a bug
        elif status == "failed":
            if not self.tracker.job_failed(job.job_id, reason):
                return
        elif not self.tracker.job_cancelled(job.job_id, reason):
            return
        self._job_ended(job)

    def _job_ended(self, job: Job) -> None:
        """What follows a job's ending on the engine side, once."""
        # partitions still waiting in a queue settle now; their budget returns at once
        for queue in (self._synth_queue, self._gpu_queue):
            for item in queue.remove_job(job.job_id):
                self._release(item)
                self._settle(job)
        job.ended.set()
        self._wake_admit.set()
        for fn in self.job_listeners:
            fn(job)

    def _settle(self, job: Job, n: int = 1) -> None:
        job.unsettled -= n
        if job.unsettled < 0:
            raise AssertionError(f"job {job.job_id} settled more partitions than it has")
        if job.unsettled == 0:
            if job.holds_srs:
                job.holds_srs = False
                job.params = None
                self.srs.release(job.circuit_id)
            job.settled.set()

    @staticmethod
    def _release(item: _Item) -> None:
        if item.reservation is not None:
            item.reservation.close()
            item.reservation = None
        item.synth = None

    # ------------------------------------------------------------------ pipelined path

    async def _admit_loop(self) -> None:
        while True:
            await self._wake_admit.wait()
            self._wake_admit.clear()
            # Keep the synthesis stage fed without draining the priority queue into it. A job
            # whose parameters must be generated first (a minute or more) starts on its own,
            # so the jobs behind it, whose parameters are ready, do not wait for it.
            while (len(self._synth_queue) < self.synth_workers
                   and (job_id := self._job_queue.pop()) is not None):
                job = self._jobs[job_id]
                if (self._generating < GENERATING_AT_ONCE
                        and self.srs.must_generate(job.circuit_id)):
                    self._generating += 1
                    self._spawn(self._start_generating(job))
                else:
                    await self._start_job(job)

    async def _start_generating(self, job: Job) -> None:
        try:
            await self._start_job(job)
        finally:
            self._generating -= 1
            self._wake_admit.set()

    async def _start_job(self, job: Job) -> bool:
        self.tracker.job_started(job.job_id)
        try:
            job.params, load_ms, _ = await self.srs.acquire(job.circuit_id)
        except CuzkError as e:
            self._fail_all(job, f"loading parameters failed: {e}")
            return False
        except Exception as e:
            log.exception("parameter load for %s failed", job.job_id)
            self._fail_all(job, f"loading parameters failed: {type(e).__name__}: {e}")
            return False
        job.holds_srs = True
        self.tracker.srs_loaded_for(job.job_id, load_ms)
        try:
            self._check_job_fits(job)
        except BudgetExceeded as e:
            self._fail_all(job, str(e))
            return False
        job.vk = job.params.vk.to_json() if hasattr(job.params.vk, "to_json") else None
        if job.terminal:  # cancelled while its parameters loaded
            self._settle(job, job.unsettled)
            return False
        if self.pipelined:
            rank = PRIORITY_RANK[job.priority]
            for i in range(job.partitions):
                self._synth_queue.push(_Item(job, i), job_id=job.job_id, rank=rank,
                                       job_seq=job.seq, partition=i)
            self._wake_synth.set()
        return True

    def _check_job_fits(self, job: Job) -> None:
        """A job's parameters stay reserved while its partitions run, so it needs both at once:
        if they can never fit together it would wait forever, so it fails now instead."""
        params = self.srs.resident_bytes(job.circuit_id)
        working = self.stages.working_set_bytes(job.kind, job.profile)
        self.budget.check_fits(
            params + working,
            f"{job.circuit_id} (parameters {format_bytes(params)} plus one partition's working "
            f"set {format_bytes(working)})")

    def _fail_all(self, job: Job, reason: str) -> None:
        self._end_job(job, "failed", reason)
        self._settle(job, job.unsettled)

    async def _synth_loop(self) -> None:
        slots = asyncio.Semaphore(self.synth_workers)
        while True:
            await slots.acquire()
            while (item := self._synth_queue.pop()) is None:
                self._wake_synth.clear()
                await self._wake_synth.wait()
            self._wake_admit.set()
            task = self._spawn(self._synthesize(item))
            task.add_done_callback(lambda _t: slots.release())

    async def _reserve_and_synthesize(self, item: _Item) -> bool:
        """Budget, then synthesis in the pool; False when the partition settled instead."""
        job = item.job
        st = self.stages
        try:
            item.reservation = await self.budget.reserve(
                st.working_set_bytes(job.kind, job.profile),
                f"{job.circuit_id} partition {item.index}")
        except CuzkError as e:
            self._fail_partition(item, str(e))
            return False
        if not self.tracker.synth_start(job.job_id, item.index):
            self._release(item)
            self._settle(job)
            return False
        t0 = self._clock()
        try:
            item.synth = await asyncio.get_running_loop().run_in_executor(
                self._synth_executor, st.synthesize, job.kind, job.profile, job.seed, item.index)
        except Exception as e:  # noqa: BLE001 - a failed partition fails its job, engine serves on
            self._fail_partition(item, f"synthesis failed: {type(e).__name__}: {e}")
            return False
        job.synthesis_ms += (self._clock() - t0) * 1000.0
        # account the real size once known; an underestimate keeps the estimate
        item.reservation.shrink_to(max(int(item.synth.nbytes), 0))
        if not self.tracker.synth_end(job.job_id, item.index):
            self._release(item)
            self._settle(job)
            return False
        return True

    async def _synthesize(self, item: _Item) -> None:
        if await self._reserve_and_synthesize(item):
            job = item.job
            self._gpu_queue.push(item, job_id=job.job_id, rank=PRIORITY_RANK[job.priority],
                                 job_seq=job.seq, partition=item.index)
            self._wake_gpu.set()

    async def _next_gpu_item(self) -> _Item:
        while True:
            item = self._gpu_queue.pop()
            if item is not None:
                return item
            self._wake_gpu.clear()
            await self._wake_gpu.wait()

    def _device_step(self, item: _Item, device: Device,
                     split: bool) -> tuple[Any, float, float, float]:
        """Runs in the device's thread pool. Returns (pending or proof, start_ms, finish_ms,
        held_ms): start_ms includes waiting for the device lock, held_ms is the time it was
        held."""
        params = item.job.params
        t0 = self._clock()
        with device.lock:
            locked = self._clock()
            pending = self.stages.prove_start(item.synth, params, device.backend)
        t1 = self._clock()
        held_ms = (t1 - locked) * 1000.0
        if split:
            return pending, (t1 - t0) * 1000.0, 0.0, held_ms
        proof = self.stages.prove_finish(pending, params)
        return proof, (t1 - t0) * 1000.0, (self._clock() - t1) * 1000.0, held_ms

    async def _device_worker(self, worker_id: int, device: Device) -> None:
        split = self.config.pipeline.split_prove
        while True:
            item = await self._next_gpu_item()
            ran = await self._run_on_device(worker_id, device, item, split)
            if ran is not None:
                out, token = ran
                self._spawn(self._finalize(item, out, token, split))

    async def _run_on_device(self, worker_id: int, device: Device, item: _Item,
                             split: bool) -> tuple[Any, int] | None:
        """Pick `item` up on a worker, run its device step and hand the worker back.

        Returns (output, pickup token) for the finalizer, or None when the item ended here: its
        job ended meanwhile, or the device failed (both already recorded)."""
        job = item.job
        token = self.tracker.worker_pickup(worker_id, job.job_id, item.index)
        if token is None:
            self._release(item)
            self._settle(job)
            return None
        try:
            out, start_ms, finish_ms, held_ms = await asyncio.get_running_loop().run_in_executor(
                self._device_pools[device.ordinal], self._device_step, item, device, split)
        except Exception as e:  # noqa: BLE001 - device failure fails the job, not the engine
            self._fail_partition(item, f"device {device.name} failed: "
                                       f"{type(e).__name__}: {e}", token)
            return None
        job.gpu_ms += start_ms + finish_ms
        job.device_lock_ms += held_ms
        # split: the a/b/c evaluations are consumed, only what the pending proof holds stays;
        # else the proof is done and nothing of the partition's working set stays
        item.keep_reserved(int(getattr(out, "nbytes", 0)) if split else 0)
        if not self.tracker.device_done(token):
            self._release(item)
            self._settle(job)
            return None
        return out, token

    def _finish_step(self, item: _Item, out: Any, split: bool) -> tuple[bytes, bool | None]:
        """Runs in the finalizer pool: prove_finish (split mode) and self-verification."""
        job = item.job
        proof = self.stages.prove_finish(out, job.params) if split else out
        verified = None
        if self.config.pipeline.self_verify:
            verified = bool(self.stages.verify(job.params.vk, item.synth.public_inputs, proof))
        return proof, verified

    async def _finalize(self, item: _Item, out: Any, token: int | None, split: bool) -> None:
        job = item.job
        t0 = self._clock()
        try:
            proof, verified = await asyncio.get_running_loop().run_in_executor(
                self._finalizer_pool, self._finish_step, item, out, split)
        except Exception as e:  # noqa: BLE001
            self._fail_partition(item, f"finalize failed: {type(e).__name__}: {e}", token)
            return
        job.finalize_ms += (self._clock() - t0) * 1000.0
        if verified is False:
            self._fail_partition(item, "self-verification failed: the proof does not verify",
                                 token)
            return
        public_inputs = list(item.synth.public_inputs)
        self._release(item)
        if not self.tracker.finalize_done(job.job_id, item.index, token):
            self._settle(job)
            return
        job.proofs[item.index] = proof
        job.public_inputs[item.index] = public_inputs
        if verified is not None:
            job.verified = verified if job.verified is None else job.verified and verified
        self._settle(job)
        if all(p is not None for p in job.proofs):
            self._end_job(job, "done")

    # ------------------------------------------------------------------ monolithic path

    async def _next_job(self) -> Job:
        while True:
            job_id = self._job_queue.pop()
            if job_id is not None:
                return self._jobs[job_id]
            self._wake_admit.clear()
            await self._wake_admit.wait()

    async def _mono_worker(self, worker_id: int, device: Device) -> None:
        """One job at a time, partitions in order, synthesis and proof never overlapping."""
        while True:
            job = await self._next_job()
            if not await self._start_job(job):
                continue
            for i in range(job.partitions):
                item = _Item(job, i)
                if job.terminal:
                    self._settle(job)
                    continue
                if not await self._reserve_and_synthesize(item):
                    continue
                ran = await self._run_on_device(worker_id, device, item, False)
                if ran is not None:
                    proof, token = ran
                    await self._finalize(item, proof, token, False)

    # ------------------------------------------------------------------ housekeeping

    async def _housekeeping(self) -> None:
        """Forget results after their retention; wake the admission loop periodically."""
        keep = self.config.status.result_retention
        while True:
            await asyncio.sleep(min(5.0, max(keep / 4, 0.05)))
            now = self._clock()
            for jid, job in list(self._jobs.items()):
                finished = job.record.finished
                if finished is not None and job.settled.is_set() and now - finished > keep:
                    del self._jobs[jid]
