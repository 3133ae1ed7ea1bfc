"""Dispatch and results: choosing a host for each queued job, submitting it, waiting for its
result (and verifying it, in `jobs.record_result`), re-queueing what was lost, cancelling."""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from channels.db import database_sync_to_async

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.engine.snapshot import PipelineSnapshot
from cuzk_engine.errors import EngineAPIError, EngineUnreachable, SnapshotFormatError
from cuzk_engine.vocabulary import TERMINAL_STATUSES, UNFINISHED_STATUSES
from vastmgr.autopilot.models import draining_machine_ids
from vastmgr.controller.hosts import ConnectedEngine, Controller
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet.faults import FaultRecorder
from vastmgr.fleet.liveness import LIVE, connection_state
from vastmgr.front import proof_panel
from vastmgr.proofs import jobs, placement
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.models import RemoteMachine

log = logging.getLogger(__name__)


def closed_machine_ids() -> set[int]:
    return draining_machine_ids() | RemoteMachine.outbid_machine_ids()

RESULT_WAIT = 10.0  # seconds per long-poll for a job's result
CONCLUDE_TIMEOUT = 30.0  # seconds a stopping controller gives the results it holds


class Dispatcher:
    """The controller's job side: it reads the hosts the controller watches and sends through
    its publisher; the tasks it starts (one result waiter per job in flight) are its own."""

    def __init__(self, fleet: Controller):
        self.fleet = fleet
        self.waiters: dict[str, asyncio.Task] = {}
        self.cancelling: set[str] = set()  # job ids whose engine cancel is under way
        self.concluding: set[asyncio.Future] = set()  # results being written
        self.result_faults = FaultRecorder("fleet controller result collection")
        self.closed: set[int] = set()  # machines that take no new work now

    async def stop(self) -> None:
        """Write the results already in hand, then stop waiting for the others."""
        if self.concluding:
            await asyncio.wait(set(self.concluding), timeout=CONCLUDE_TIMEOUT)
        waiters = list(self.waiters.values())
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        self.waiters.clear()

    def live(self, machine_id: int) -> MachineLive | None:
        host = self.fleet.hosts.get(machine_id)
        return host.live if host is not None else None

    def connected(self, machine_id: int) -> ConnectedEngine | None:
        """The host's engine, while it is connected and spoken to through our engine API."""
        live = self.live(machine_id)
        if live is None or not live.connected or live.client is None:
            return None
        return ConnectedEngine(live, live.client)

    def live_machines(self) -> list[ConnectedEngine]:
        """Hosts that take work now: live, and spoken to through our engine API."""
        now = self.fleet.clock()
        return [ConnectedEngine(h.live, h.live.client) for h in self.fleet.hosts.values()
                if connection_state(h.live.connected, h.live.last_seen, self.fleet.interval,
                                    now) == LIVE
                and h.live.client is not None]

    async def resume_in_flight(self, machine_ids: set[int]) -> None:
        """On starting to watch machines (at start-up, or taking them over from a controller
        that died): keep waiting for every job dispatched to them before."""
        for job in await database_sync_to_async(jobs.in_flight_jobs)(machine_ids):
            self.watch_result(job)

    async def run_pass(self, now: float) -> None:
        """The tick's job work (re-queue what was lost, dispatch, send cancels) from one read
        of the open jobs: with a thousand hosts each database round trip waits its turn on a
        busy event loop, and an idle queue must cost the tick next to nothing."""
        in_flight, queued = await database_sync_to_async(jobs.open_jobs)()
        await self.requeue_lost(now, in_flight)
        await self.dispatch(queued)
        await self.cancel_requested(jobs.cancel_requests(in_flight))

    async def dispatch(self, queued: list[ProofJob] | None = None) -> None:
        """Hand queued jobs (`queued`, else read now) to engines with room (`placement.place`):
        the rest stay queued here, where a host that becomes running takes its share at once."""
        if queued is None:
            queued = await database_sync_to_async(jobs.queued_jobs)()
        if not queued:
            return
        # Hosts the autopilot drains take no new work (they are destroyed once theirs is done),
        # nor do outbid ones (their jobs were just re-queued from them).
        self.closed = await database_sync_to_async(closed_machine_ids)()
        by_id = {}
        for job in queued:
            if job.machine is not None:
                reason = job.machine.unusable_reason()
                if reason:
                    await self.publish_job(await database_sync_to_async(jobs.fail)(job.pk, reason))
                    continue
            by_id[job.pk] = job
        engines = await self._engines()
        placements = placement.place(
            (placement.Waiting(job.pk, job.priority, job.machine_id) for job in by_id.values()),
            [engine for engine, _ in engines.values()])
        for placed in placements:
            await self._submit(by_id[placed.job], engines[placed.engine][1])

    async def _engines(self) -> dict[int, tuple[placement.Engine, ConnectedEngine]]:
        """The engines that take work now, each with what it holds: the larger of the jobs
        the dashboard has on it (those submitted since its last snapshot included) and the
        unfinished jobs its status lists (those others submitted included)."""
        hosts = [(h, snapshot) for h in self.live_machines()
                 if (snapshot := h.live.engine_snapshot()) is not None and snapshot.accepting
                 and h.machine_id not in self.closed]
        if not hosts:
            return {}
        ours = await database_sync_to_async(jobs.holding_by_machine)()
        engines = {}
        for host, snapshot in hosts:
            listed = sum(1 for p in snapshot.pipelines if p.status in UNFINISHED_STATUSES)
            engines[host.machine_id] = (placement.Engine(
                host.machine_id, len(snapshot.gpu_workers),
                max(ours.get(host.machine_id, 0), listed)), host)
        return engines

    async def _submit(self, job: ProofJob, host: ConnectedEngine) -> None:
        # Claimed before it is submitted: of several controllers, exactly one submits it.
        if await database_sync_to_async(jobs.claim)(job.pk, host.machine_id) is None:
            return
        updated = await self._send(job, host)
        if updated is not None:
            self.watch_result(updated)

    async def _send(self, job: ProofJob, host: ConnectedEngine) -> ProofJob | None:
        """Submit a job claimed for `host` under its own id as the request id, so sending it
        again (a controller that died before it heard the answer) is harmless: the engine
        answers with the job it already has. Returns the job with the engine's id recorded,
        None when it did not get through (it is queued again) or ended meanwhile."""
        try:
            answer = await host.client.submit(
                request_id=str(job.pk), kind=job.kind, profile=job.profile, seed=job.seed,
                priority=job.priority)
        except EngineAPIError as exc:
            await self.publish_job(await database_sync_to_async(jobs.fail)(
                job.pk, f"the engine on {self.fleet.machine_name(host.machine_id)} "
                        f"rejected the job: {exc}"))
            return None
        except EngineUnreachable as exc:
            log.info("submit of %s to machine %s failed: %s", job.pk, host.machine_id, exc)
            await database_sync_to_async(jobs.unclaim)(job.pk, host.machine_id)
            if exc.status == HTTPStatus.SERVICE_UNAVAILABLE:
                await database_sync_to_async(jobs.not_accepted)(job.pk, host.machine_id,
                                                                str(exc))
            return None
        updated = await database_sync_to_async(jobs.mark_submitted)(
            job.pk, host.machine_id, str(answer.get("job_id", "")))
        if updated is not None:
            await self.publish_job(updated)
        return updated

    def watch_result(self, job: ProofJob) -> None:
        key = str(job.pk)
        assert job.machine_id is not None, "a job with a result to wait for is on a machine"
        if key in self.waiters and not self.waiters[key].done():
            return
        self.waiters[key] = asyncio.create_task(
            self._await_result(key, job.machine_id, job.engine_job_id), name=f"result-{key}")

    async def _await_result(self, job_id: str, machine_id: int, engine_job_id: str) -> None:
        try:
            while True:
                live = self.live(machine_id)
                machine = self.fleet.machines.get(machine_id)
                if live is None and self.fleet.leases is not None and machine is not None \
                        and machine.enabled:
                    return  # another controller watches this host now, and its jobs
                if live is None or not live.connected or live.client is None:
                    if not await self._still_in_flight(job_id, machine_id):
                        return
                    await asyncio.sleep(self.fleet.interval)
                    continue
                client = live.client
                record: dict | None
                try:
                    record = await client.get(engine_job_id or job_id, wait=RESULT_WAIT)
                except EngineUnreachable:
                    await asyncio.sleep(self.fleet.interval)
                    continue
                except EngineAPIError as exc:
                    record = None if exc.status == 404 else {
                        "status": "failed", "error": f"engine refused the lookup: {exc}"}
                if record is None and not engine_job_id:
                    # Claimed, but the submit's answer was never recorded (the controller
                    # that sent it died): send it again, which the engine takes as the same
                    # request if it arrived. Only a job the engine confirmed can be lost.
                    sent = await self._resend(job_id, ConnectedEngine(live, client))
                    if sent is None:
                        return
                    engine_job_id = sent.engine_job_id
                    continue
                if record is None or record.get("status") in TERMINAL_STATUSES:
                    # An outcome in hand is written even if the controller is stopping now.
                    concluding = asyncio.ensure_future(
                        self._conclude(job_id, machine_id, client, record))
                    self.concluding.add(concluding)
                    concluding.add_done_callback(self.concluding.discard)
                    await asyncio.shield(concluding)
                    return
                if not await self._still_in_flight(job_id, machine_id):
                    return
        except Exception as exc:  # noqa: BLE001 - the next tick starts a new waiter for it
            await self.result_faults.record(exc, machine_id)
        finally:
            self.waiters.pop(job_id, None)

    async def _conclude(self, job_id: str, machine_id: int, client: EngineClient,
                        record: dict | None) -> None:
        if record is None:
            # The engine answers but no longer knows the job: it restarted and lost it.
            job = await database_sync_to_async(jobs.requeue)(
                job_id, machine_id, "the engine no longer knows this job (restarted?)")
        else:
            pipeline = await self._final_pipeline(client, record, job_id)
            job = await database_sync_to_async(jobs.record_result)(
                job_id, machine_id, record, pipeline)
        await self.publish_job(job)

    async def _final_pipeline(self, client: EngineClient, record: dict,
                              job_id: str) -> PipelineSnapshot | None:
        """The job's last partition timings, from /status while the engine still retains it."""
        try:
            snapshot = await client.snapshot()
        except (EngineUnreachable, EngineAPIError, SnapshotFormatError):
            return None
        for pipeline in snapshot.pipelines:
            if pipeline.request_id == job_id or pipeline.job_id == record.get("job_id"):
                return pipeline
        return None

    async def _resend(self, job_id: str, host: ConnectedEngine) -> ProofJob | None:
        job = await database_sync_to_async(jobs.unconfirmed)(job_id, host.machine_id)
        return None if job is None else await self._send(job, host)

    @database_sync_to_async
    def _still_in_flight(self, job_id: str, machine_id: int) -> bool:
        return ProofJob.objects.in_flight().filter(pk=job_id, machine_id=machine_id).exists()

    async def requeue_lost(self, now: float, in_flight: list[ProofJob]) -> None:
        """Of the jobs `in_flight`, those on a machine that has been unreachable for longer than
        the grace period go back to the queue, for another machine to prove; every other has a
        result waiter (one that failed is started again). A job pinned to its machine keeps
        waiting for it instead: back in the queue it could only wait for the same machine,
        shown queued while that engine may be proving it still (a partition longer than the
        grace, not a lost job); its waiter collects the result once the machine answers, and
        an operator's cancel still takes it out of flight."""
        if not in_flight:
            return
        grace = self.fleet.grace
        expired = {mid for mid, host in self.fleet.hosts.items()
                   if not host.live.connected and host.live.down_since is not None
                   and now - host.live.down_since > grace}
        for job in in_flight:
            assert job.machine_id is not None, "a job in flight is on a machine"
            machine = self.fleet.machines.get(job.machine_id)
            gone = machine is None or not machine.enabled
            waits_for_its_machine = job.pinned and not job.cancel_requested and not gone
            if (job.machine_id in expired and not waits_for_its_machine) or gone:
                reason = (f"machine offline for more than {grace:g} s" if not gone
                          else "machine is disabled or killed")
                requeued = await database_sync_to_async(jobs.requeue)(job.pk, job.machine_id, reason)
                await self.publish_job(requeued)
            elif job.machine_id in self.fleet.hosts:
                self.watch_result(job)  # a waiter that failed is replaced here

    async def cancel_requested(self, requests: list[ProofJob]) -> None:
        """Send DELETE to the engine for each job in `requests` (in flight, an operator asked
        to cancel it). The result waiter then reads the engine's `cancelled` record and moves
        the job, as for any result; a job that finished before the cancel arrived stays done."""
        self.cancelling &= {str(job.pk) for job in requests}
        for job in requests:
            assert job.machine_id is not None, "a job in flight is on a machine"
            engine = self.connected(job.machine_id)
            if str(job.pk) in self.cancelling or engine is None:
                continue  # an offline machine's job is cancelled when it is re-queued
            self.cancelling.add(str(job.pk))
            self.fleet.spawn(self._cancel_job(job, engine.client))

    async def _cancel_job(self, job: ProofJob, client: EngineClient) -> None:
        try:
            await client.cancel(job.engine_job_id or str(job.pk))
        except EngineUnreachable as exc:
            log.info("cancel of %s on machine %s failed, will retry: %s", job.pk, job.machine_id, exc)
            self.cancelling.discard(str(job.pk))
            return
        except EngineAPIError as exc:
            await database_sync_to_async(jobs.cancel_refused)(job.pk, str(exc))
            return
        self.watch_result(job)

    async def cancel_orphan(self, machine_id: int, engine_job_id: str) -> None:
        live = self.live(machine_id)
        if live is None or live.client is None:
            return
        try:
            await live.client.cancel(engine_job_id)
            log.info("cancelled orphaned engine job %s on machine %s", engine_job_id, machine_id)
        except (EngineUnreachable, EngineAPIError) as exc:
            log.info("could not cancel orphaned job %s: %s", engine_job_id, exc)

    async def publish_job(self, job: ProofJob | None) -> None:
        if job is None:
            return
        messages = await database_sync_to_async(_job_updates)(job)
        if job.status == ProofJob.Status.FAILED:
            messages += await database_sync_to_async(proof_panel.proof_failed_notices)(job)
        await self.fleet.publisher.send(messages)


def _job_updates(job: ProofJob) -> list[tuple[str, str]]:
    job = ProofJob.objects.select_related("machine").get(pk=job.pk)
    return proof_panel.proof_updates(job)
