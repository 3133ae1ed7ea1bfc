"""The controller loop: watch engines, push fragments, dispatch jobs, keep history."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from http import HTTPStatus

import aiohttp
from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from cuzk_engine.daemon.client import EngineAPIError, EngineUnreachable
from vastmgr.fleet import fragments
from vastmgr.fleet.faults import FaultRecorder
from vastmgr.fleet.models import Event, HostAction, HostSample, HostStatus, Machine
from vastmgr.proofs.models import ProofJob

from . import jobs
from .leases import Leases
from .liveness import HEARTBEAT_INTERVALS, LIVE, OFFLINE, STALE, connection_state
from .publish import LayerPublisher
from .store import update_rows
from .transport import TransportError, transport_for
from .upstream import watcher_for
from .viewers import ViewerRegistry
from .watcher import HostLive

log = logging.getLogger(__name__)

RESULT_WAIT = 10.0  # seconds per long-poll for a job's result
CONCLUDE_TIMEOUT = 30.0  # seconds a stopping controller gives the results it holds
# Watchers setting up a connection (tunnel, stream, first snapshot) at the same time.
CONNECT_CONCURRENCY = 50


def engine_session() -> aiohttp.ClientSession:
    """One connection pool for every engine. Unbounded: each watched host holds its status
    stream open, and aiohttp's default cap of 100 connections left every host past the 100th
    waiting for a free connection until its requests timed out."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


class FleetController:
    def __init__(self, *, publisher=None, clock: Callable[[], float] = time.time,
                 tick: float = 0.5, interval: float = 1.0, grace: float = 60.0,
                 history_every: float = 10.0, history_keep: float = 24 * 3600,
                 leases: Leases | None = None):
        self.publisher = publisher or LayerPublisher()
        self.clock = clock
        self.tick_seconds = tick
        self.interval = interval
        self.grace = grace
        self.history_every = history_every
        self.history_keep = history_keep
        self.hosts: dict[int, HostLive] = {}
        self.pushed: dict[int, str] = {}  # connection state last pushed per host
        self.pushed_seen: dict[int, float] = {}  # last_seen last pushed and written per host
        self.watchers: dict[int, asyncio.Task] = {}
        self.waiters: dict[str, asyncio.Task] = {}
        self.actions: set[int] = set()
        self.cancelling: set[str] = set()  # job ids whose engine cancel is under way
        self.background: set[asyncio.Task] = set()
        self.concluding: set[asyncio.Future] = set()  # results being written
        self.machine_names: dict[int, str] = {}
        self.machines: dict[int, Machine] = {}  # every machine with a fleet row, fresh per tick
        self.statuses: dict[int, HostStatus] = {}  # what was last pushed (and written) per host
        self.idle_since: dict[int, float] = {}  # a worker idle while synthesized work waits
        self.notices: list[tuple[str, str]] = []  # toasts to push with the next batch
        self.last_sample = 0.0
        self.sampled: set[int] = set()  # hosts with at least one history sample from here
        self.session: aiohttp.ClientSession | None = None
        self.viewers = ViewerRegistry(clock)
        self.faults = FaultRecorder("fleet controller tick")
        self.result_faults = FaultRecorder("fleet controller result collection")
        self.connect_slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
        # Scale-out: only the hosts leased to this controller are watched (and dispatched to)
        # here; without leases (embedded mode) every enabled machine is.
        self.leases = leases
        self.others: dict[int, HostStatus] = {}  # statuses of hosts watched elsewhere
        self.others_read = float("-inf")

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        self.session = self.session or engine_session()
        loop = asyncio.get_running_loop()
        try:
            self._spawn(self.publisher.listen(self.viewers.note))
            while not stop.is_set():
                # Ticks start at a fixed rate: a slow tick shortens the wait, so an update
                # waits at most one tick period plus the work of the tick that carries it.
                started = loop.time()
                try:
                    await self.tick()
                except Exception as exc:  # noqa: BLE001 - one failed tick must not end the loop
                    await self.faults.record(exc)
                remaining = self.tick_seconds - (loop.time() - started)
                try:
                    await asyncio.wait_for(stop.wait(), max(remaining, 0.0))
                except TimeoutError:
                    pass
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        if self.concluding:
            await asyncio.wait(set(self.concluding), timeout=CONCLUDE_TIMEOUT)
        tasks = [*self.watchers.values(), *self.waiters.values(), *self.background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.watchers.clear()
        self.waiters.clear()
        if self.leases is not None:
            await self.leases.release()
        await self.publisher.close()
        if self.session is not None:
            await self.session.close()
            self.session = None

    # ---- one tick -------------------------------------------------------------------------

    async def tick(self) -> None:
        now = self.clock()
        acquired = await self.sync_machines()
        if acquired:
            await self.resume_in_flight(acquired)
        if getattr(self.publisher, "reconnected", False):
            # Whatever was pushed or announced while the relay was down got lost.
            self.publisher.reconnected = False
            self.viewers.forget()
            for live in self.hosts.values():
                live.changed = True
        fresh = self.viewers.take_fresh()
        changed = self._collect_changes(now)
        fleet = fragments.fleet_group()
        if self.viewers.watched(fleet):
            # A new viewer gets every row this controller answers for: its own hosts and the
            # (greyed) disabled ones. Others' hosts are theirs to push, from fresher state.
            rows = [m for m in self.machines if self._answers_for(m)] if fleet in fresh \
                else changed
        else:
            rows = []
        panels = {machine_id for machine_id in self.machines if self._answers_for(machine_id)
                  and fragments.host_group(machine_id) in fresh
                  or (machine_id in changed
                      and self.viewers.watched(fragments.host_group(machine_id)))}
        for machine_id in changed:
            self.statuses[machine_id] = self._status_row(machine_id, now)
        # Push first, write after: the fragments come from the state held here (the same
        # state that is written next), so the database write adds nothing to the latency.
        if rows or panels:
            statuses = {**self.others, **self.statuses}
            messages = await database_sync_to_async(self._render)(rows, panels, statuses, now)
            if not await self.publisher.send(messages):
                self.viewers.fresh |= fresh
                for machine_id in changed:
                    if machine_id in self.hosts:
                        self.hosts[machine_id].changed = True
        if changed:
            rows_to_write = [self.statuses[machine_id] for machine_id in changed]
            messages, cancels, seen_jobs = await database_sync_to_async(self._persist)(
                rows_to_write)
            for job in seen_jobs:
                self._watch_result(job)
            await self.publisher.send(messages)
            for machine_id, engine_job_id in cancels:
                self._spawn(self._cancel_orphan(machine_id, engine_job_id))
        if self.notices:
            notices, self.notices = self.notices, []
            await self.publisher.send(notices)
        await self.requeue_lost(now)
        await self.dispatch()
        await self.cancel_requested()
        await self.run_actions()
        # A host's first snapshot is sampled at once: rates are counter differences between
        # samples, so work done before a host's first sample would never show on its charts.
        first_seen = any(live.connected and live.snapshot and machine_id not in self.sampled
                         for machine_id, live in self.hosts.items())
        if now - self.last_sample >= self.history_every or first_seen:
            self.last_sample = now
            await self.record_history(now)

    def _answers_for(self, machine_id: int) -> bool:
        """Whether this controller pushes the machine's row and panel: it watches it, or it is
        disabled (nobody watches it; every controller may push its greyed row)."""
        return machine_id in self.hosts or not self.machines[machine_id].enabled

    def _collect_changes(self, now: float) -> list[int]:
        changed = []
        for machine_id, live in self.hosts.items():
            state = connection_state(live.connected, live.last_seen, self.interval, now)
            heartbeat = (live.last_seen is not None and live.last_seen
                         - self.pushed_seen.get(machine_id, float("-inf"))
                         >= HEARTBEAT_INTERVALS * self.interval)
            if live.changed or heartbeat or self.pushed.get(machine_id) != state:
                live.changed = False
                if state == OFFLINE and self.pushed.get(machine_id) in (LIVE, STALE):
                    name = self.machine_names.get(machine_id, machine_id)
                    self.notices.extend(fragments.host_offline_notices(
                        machine_id, name, live.error))
                self.pushed[machine_id] = state
                if live.last_seen is not None:
                    self.pushed_seen[machine_id] = live.last_seen
                changed.append(machine_id)
        return changed

    def _status_row(self, machine_id: int, now: float) -> HostStatus:
        """The host's live status as it will be stored, copied on the event loop so the seq
        and the snapshot come from the same engine update."""
        live = self.hosts[machine_id]
        machine = self.machines[machine_id]
        if live.last_seen is not None:
            machine.last_seen = jobs.seen_at(live.last_seen)
        if live.connected and fragments.idle_with_work_waiting(live.snapshot):
            since = self.idle_since.setdefault(machine_id, now)
        else:
            self.idle_since.pop(machine_id, None)
            since = None
        return HostStatus(machine=machine, connected=live.connected, via=live.via,
                          interval=self.interval, seq=live.seq, snapshot=live.snapshot,
                          error=live.error, updated=jobs.seen_at(now),
                          snapshot_at=live.snapshot_at and jobs.seen_at(live.snapshot_at),
                          idle_waiting_since=since and jobs.seen_at(since))

    def _render(self, rows: list[int], panels: set[int], statuses: dict[int, HostStatus],
                now: float) -> list[tuple[str, str]]:
        """The fleet rows in `rows` (with the totals) and the host panels in `panels`."""
        machines = list(self.machines.values())
        hosts = fragments.host_views(machines, statuses, now)
        by_id = {h.machine.pk: h for h in hosts}
        messages = []
        if rows:
            fleet_html = [fragments.render_fleet_row(by_id[m]) for m in rows if m in by_id]
            fleet_html.append(fragments.render_fleet_totals(hosts, now))
            messages.append((fragments.fleet_group(), "".join(fleet_html)))
        for machine_id in panels:
            if machine_id in by_id:
                host = by_id[machine_id]
                messages.append((fragments.host_group(machine_id),
                                 fragments.render_host_panel(host.machine, now, host)))
        return messages

    def _persist(self, statuses: list[HostStatus]):
        """Write the changed hosts' status, copy job progress from their pipelines, and render
        the proof pages that changed."""
        cancels = []
        proof_jobs: dict[str, ProofJob] = {}
        with transaction.atomic():
            existing = dict(HostStatus.objects.filter(
                machine_id__in=[s.machine_id for s in statuses]).values_list("machine_id", "pk"))
            for status in statuses:
                if status.machine_id in existing:
                    status.pk = existing[status.machine_id]
                else:
                    status.save()
                pipelines = (status.snapshot or {}).get("pipelines") or []
                if status.connected and pipelines:
                    for job in jobs.record_progress(status.machine_id, pipelines):
                        proof_jobs[str(job.pk)] = job
                    adopted, orphaned = jobs.orphans(status.machine_id, pipelines)
                    for job in adopted:
                        proof_jobs[str(job.pk)] = job
                    cancels.extend((status.machine_id, engine_job) for engine_job in orphaned)
            update_rows(HostStatus, statuses,
                        ["connected", "via", "interval", "seq", "snapshot", "error", "updated",
                         "snapshot_at", "idle_waiting_since"])
            update_rows(Machine, [s.machine for s in statuses if s.machine.last_seen is not None],
                        ["last_seen"])
        messages = [(fragments.proof_group(job.pk), fragments.render_proof(job))
                    for job in proof_jobs.values()]
        return messages, cancels, list(proof_jobs.values())

    # ---- machines and watchers ------------------------------------------------------------

    async def sync_machines(self) -> set[int]:
        """Start and stop watchers to match the machines this controller answers for; return
        the machine ids it has just started watching."""
        # Disabled machines are not watched, but they keep a (greyed) row in the fleet view.
        machines = await database_sync_to_async(list)(
            Machine.objects.select_related("remote").exclude(state=Machine.State.KILLED))
        for machine in machines:
            # A lifecycle change (made by another process) is shown at once, not with the
            # engine's next update: that may never come for an offline host.
            before = self.machines.get(machine.pk)
            if (before is not None and machine.pk in self.hosts
                    and (before.state, before.enabled, before.price_per_hour)
                    != (machine.state, machine.enabled, machine.price_per_hour)):
                self.hosts[machine.pk].changed = True
        self.machines = {m.pk: m for m in machines}
        wanted = {m.pk: m for m in machines if m.enabled}
        if self.leases is not None:
            owned = await self.leases.refresh(set(wanted))
            wanted = {pk: m for pk, m in wanted.items() if pk in owned}
        await self._read_others()
        acquired = set()
        for machine_id in list(self.watchers):
            if machine_id not in wanted:
                self.watchers.pop(machine_id).cancel()
                self.hosts.pop(machine_id, None)
                self.pushed.pop(machine_id, None)
                self.statuses.pop(machine_id, None)
                self.pushed_seen.pop(machine_id, None)
                self.sampled.discard(machine_id)
        for machine_id, machine in wanted.items():
            self.machine_names[machine_id] = machine.name
            if machine_id in self.watchers:
                continue
            acquired.add(machine_id)
            live = self.hosts.setdefault(machine_id, HostLive(machine_id, down_since=self.clock()))
            try:
                transport = transport_for(machine)
            except TransportError as exc:
                live.lost(str(exc), self.clock())
                continue
            watcher = watcher_for(machine, live, transport, self.session, self.clock,
                                  self.interval, self.connect_slots)
            self.watchers[machine_id] = asyncio.create_task(watcher.run(), name=f"watch-{machine_id}")
        return acquired

    async def _read_others(self) -> None:
        """The stored status of every machine not watched here (disabled, or another
        controller's), for the fleet totals; read at most once an interval."""
        now = time.monotonic()
        if now - self.others_read < self.interval:
            return
        self.others_read = now
        watched_here = set(self.hosts)
        self.others = await database_sync_to_async(lambda: {
            status.machine_id: status for status in
            HostStatus.objects.filter(machine_id__in=[m for m in self.machines
                                                      if m not in watched_here])})()

    def live_hosts(self) -> list[HostLive]:
        now = self.clock()
        return [h for h in self.hosts.values()
                if connection_state(h.connected, h.last_seen, self.interval, now) == LIVE
                and h.client is not None]

    # ---- dispatch and results -------------------------------------------------------------

    async def resume_in_flight(self, machine_ids: set[int]) -> None:
        """On starting to watch machines (at start-up, or taking them over from a controller
        that died): keep waiting for every job dispatched to them before."""
        for job in await database_sync_to_async(jobs.in_flight_jobs)(machine_ids):
            self._watch_result(job)

    async def dispatch(self) -> None:
        queued = await database_sync_to_async(jobs.queued_jobs)()
        if not queued:
            return
        # Jobs handed out this tick count towards load, so a burst spreads over the fleet.
        planned: dict[int, int] = {}
        for job in queued:
            if job.machine_id is not None:
                reason = jobs.unusable_reason(job.machine)
                if reason:
                    await self._publish_job(await database_sync_to_async(jobs.fail)(job.pk, reason))
                    continue
            host = self._choose_host(job, planned)
            if host is None:
                continue
            # Claimed before it is submitted: of several controllers, exactly one submits it.
            if await database_sync_to_async(jobs.claim)(job.pk, host.machine_id) is None:
                continue
            planned[host.machine_id] = planned.get(host.machine_id, 0) + 1
            try:
                answer = await host.client.submit(
                    request_id=str(job.pk), kind=job.kind, profile=job.profile, seed=job.seed,
                    priority=job.priority)
            except EngineAPIError as exc:
                name = self.machine_names.get(host.machine_id, host.machine_id)
                await self._publish_job(await database_sync_to_async(jobs.fail)(
                    job.pk, f"the engine on {name} rejected the job: {exc}"))
                continue
            except EngineUnreachable as exc:
                log.info("submit of %s to machine %s failed: %s", job.pk, host.machine_id, exc)
                await database_sync_to_async(jobs.unclaim)(job.pk, host.machine_id)
                if exc.status == HTTPStatus.SERVICE_UNAVAILABLE:
                    await database_sync_to_async(jobs.not_accepted)(job.pk, host.machine_id,
                                                                    str(exc))
                continue
            updated = await database_sync_to_async(jobs.mark_submitted)(
                job.pk, host.machine_id, str(answer.get("job_id", "")))
            if updated is not None:
                self._watch_result(updated)
                await self._publish_job(updated)

    def _choose_host(self, job: ProofJob, planned: dict[int, int]) -> HostLive | None:
        # A draining engine refuses new jobs: leave it out until its replacement is live.
        candidates = [h for h in self.live_hosts() if (h.snapshot or {}).get("accepting", True)]
        if job.machine_id is not None:
            candidates = [h for h in candidates if h.machine_id == job.machine_id]
        if not candidates:
            return None

        def load(host: HostLive) -> tuple:
            snapshot = host.snapshot or {}
            busy = sum(1 for p in snapshot.get("pipelines") or []
                       if p.get("status") in ("queued", "running"))
            queue = (snapshot.get("counters") or {}).get("queue_depth", 0)
            return (busy + queue + planned.get(host.machine_id, 0), host.machine_id)

        return min(candidates, key=load)

    def _watch_result(self, job: ProofJob) -> None:
        key = str(job.pk)
        if key in self.waiters and not self.waiters[key].done():
            return
        self.waiters[key] = asyncio.create_task(
            self._await_result(key, job.machine_id, job.engine_job_id), name=f"result-{key}")

    async def _await_result(self, job_id: str, machine_id: int, engine_job_id: str) -> None:
        try:
            while True:
                live = self.hosts.get(machine_id)
                if live is None and self.leases is not None and machine_id in self.machines \
                        and self.machines[machine_id].enabled:
                    return  # another controller watches this host now, and its jobs
                if live is None or not live.connected or live.client is None:
                    if not await self._still_in_flight(job_id, machine_id):
                        return
                    await asyncio.sleep(self.interval)
                    continue
                client = live.client
                try:
                    record = await client.get(engine_job_id or job_id, wait=RESULT_WAIT)
                except EngineUnreachable:
                    await asyncio.sleep(self.interval)
                    continue
                except EngineAPIError as exc:
                    record = None if exc.status == 404 else {
                        "status": "failed", "error": f"engine refused the lookup: {exc}"}
                if record is None or record.get("status") in ("done", "failed", "cancelled"):
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

    async def _conclude(self, job_id: str, machine_id: int, client, record: dict | None) -> None:
        if record is None:
            # The engine answers but no longer knows the job: it restarted and lost it.
            job = await database_sync_to_async(jobs.requeue)(
                job_id, machine_id, "the engine no longer knows this job (restarted?)")
        else:
            pipeline = await self._final_pipeline(client, record, job_id)
            job = await database_sync_to_async(jobs.record_result)(
                job_id, machine_id, record, pipeline)
        await self._publish_job(job)

    async def _final_pipeline(self, client, record: dict, job_id: str) -> dict | None:
        """The job's last partition timings, from /status while the engine still retains it."""
        try:
            snapshot = await client.status()
        except (EngineUnreachable, EngineAPIError):
            return None
        for pipeline in snapshot.get("pipelines") or []:
            if pipeline.get("request_id") == job_id or pipeline.get("job_id") == record.get("job_id"):
                return pipeline
        return None

    @database_sync_to_async
    def _still_in_flight(self, job_id: str, machine_id: int) -> bool:
        return ProofJob.objects.filter(pk=job_id, machine_id=machine_id,
                                       status__in=jobs.IN_FLIGHT).exists()

    async def requeue_lost(self, now: float) -> None:
        """Jobs on a machine that has been unreachable for longer than the grace period go back
        to the queue (the engine's request-id idempotency makes a later duplicate harmless);
        every other in-flight job has a result waiter (one that failed is started again)."""
        expired = {mid for mid, live in self.hosts.items()
                   if not live.connected and live.down_since is not None
                   and now - live.down_since > self.grace}
        in_flight = await database_sync_to_async(jobs.in_flight_jobs)()
        for job in in_flight:
            machine = self.machines.get(job.machine_id)
            gone = machine is None or not machine.enabled
            if job.machine_id in expired or gone:
                reason = (f"machine offline for more than {self.grace:g} s" if not gone
                          else "machine is disabled or killed")
                requeued = await database_sync_to_async(jobs.requeue)(job.pk, job.machine_id, reason)
                await self._publish_job(requeued)
            elif job.machine_id in self.hosts:
                self._watch_result(job)  # a waiter that failed is replaced here

    async def cancel_requested(self) -> None:
        """Send DELETE to the engine for each job an operator asked to cancel. The result
        waiter then reads the engine's `cancelled` record and moves the job, as for any result;
        a job that finished before the cancel arrived stays done."""
        requests = await database_sync_to_async(jobs.cancel_requests)()
        self.cancelling &= {str(job.pk) for job in requests}
        for job in requests:
            live = self.hosts.get(job.machine_id)
            if str(job.pk) in self.cancelling or live is None or not live.connected \
                    or live.client is None:
                continue  # an offline machine's job is cancelled when it is re-queued
            self.cancelling.add(str(job.pk))
            self._spawn(self._cancel_job(job, live))

    async def _cancel_job(self, job: ProofJob, live: HostLive) -> None:
        try:
            await live.client.cancel(job.engine_job_id or str(job.pk))
        except EngineUnreachable as exc:
            log.info("cancel of %s on machine %s failed, will retry: %s", job.pk, job.machine_id, exc)
            self.cancelling.discard(str(job.pk))
            return
        except EngineAPIError as exc:
            await database_sync_to_async(jobs.cancel_refused)(job.pk, str(exc))
            return
        self._watch_result(job)

    async def _cancel_orphan(self, machine_id: int, engine_job_id: str) -> None:
        live = self.hosts.get(machine_id)
        if live is None or live.client is None:
            return
        try:
            await live.client.cancel(engine_job_id)
            log.info("cancelled orphaned engine job %s on machine %s", engine_job_id, machine_id)
        except (EngineUnreachable, EngineAPIError) as exc:
            log.info("could not cancel orphaned job %s: %s", engine_job_id, exc)

    async def _publish_job(self, job: ProofJob | None) -> None:
        if job is None:
            return
        html = await database_sync_to_async(_render_job)(job)
        messages = [(fragments.proof_group(job.pk), html)]
        if job.status == ProofJob.Status.FAILED:
            messages += await database_sync_to_async(fragments.proof_failed_notices)(job)
        await self.publisher.send(messages)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.background.discard)

    # ---- operator actions and history -----------------------------------------------------

    async def run_actions(self) -> None:
        pending = await database_sync_to_async(list)(
            HostAction.objects.filter(done_at__isnull=True).exclude(pk__in=self.actions))
        for action in pending:
            live = self.hosts.get(action.machine_id)
            if live is None or not live.connected or live.client is None:
                continue
            self.actions.add(action.pk)
            self._spawn(self._run_action(action, live))

    async def _run_action(self, action: HostAction, live: HostLive) -> None:
        try:
            if action.action == HostAction.Action.PRELOAD:
                await live.client.preload(action.circuit_id)
            else:
                await live.client.evict(action.circuit_id)
            error = ""
        except (EngineUnreachable, EngineAPIError) as exc:
            error = str(exc)
        await database_sync_to_async(_finish_action)(action, error)
        self.actions.discard(action.pk)

    async def record_history(self, now: float) -> None:
        samples = []
        for live in self.hosts.values():
            if not live.connected or not live.snapshot:
                continue
            samples.append(_sample(live, now))
            self.sampled.add(live.machine_id)
        watched = [machine_id for machine_id in self.hosts
                   if self.viewers.watched(fragments.host_group(machine_id))]
        messages = await database_sync_to_async(_store_history)(
            samples, now, self.history_keep, watched)
        await self.publisher.send(messages)


def _sample(live: HostLive, now: float) -> HostSample:
    snapshot = live.snapshot
    workers = snapshot.get("gpu_workers") or []
    by_device: dict[str, list[int]] = {}
    for worker in workers:
        counts = by_device.setdefault(str(worker.get("gpu_ordinal")), [0, 0])
        counts[0] += worker.get("state") == "proving"
        counts[1] += 1
    counters = snapshot.get("counters") or {}
    memory = snapshot.get("memory") or {}
    busy = sum(c[0] for c in by_device.values())
    # Device seconds up to `now`: a worker still proving has worked on since the snapshot.
    since_snapshot = max(now - (live.snapshot_at or now), 0.0)
    busy_seconds = sum((w.get("busy_total_secs") or 0.0)
                       + (since_snapshot if w.get("state") == "proving" else 0.0)
                       for w in workers)
    return HostSample(
        machine_id=live.machine_id, time=jobs.seen_at(now),
        busy_fraction=busy / len(workers) if workers else 0.0,
        busy_by_device={k: v[0] / v[1] for k, v in by_device.items()},
        busy_seconds=busy_seconds, workers=len(workers),
        proofs_completed=counters.get("total_completed", 0),
        proofs_failed=counters.get("total_failed", 0),
        queue_depth=counters.get("queue_depth", 0),
        memory_used=memory.get("used_bytes", 0), memory_total=memory.get("total_bytes", 0))


def _store_history(samples: list[HostSample], now: float, keep: float, watched: list[int]):
    HostSample.objects.bulk_create(samples)
    HostSample.objects.filter(time__lt=jobs.seen_at(now) - timedelta(seconds=keep)).delete()
    sampled = {s.machine_id for s in samples}
    machines = Machine.objects.filter(pk__in=[m for m in watched if m in sampled])
    return [(fragments.host_group(m.pk), fragments.render_host_charts(m, now)) for m in machines]


def _finish_action(action: HostAction, error: str) -> None:
    action.done_at = timezone.now()
    action.error = error
    action.save(update_fields=["done_at", "error"])
    verb = "preloaded" if action.action == HostAction.Action.PRELOAD else "evicted"
    Event.record("srs", f"{action.machine.name}: SRS {action.circuit_id} "
                 + (f"not {verb}: {error}" if error else verb),
                 machine=action.machine, level=Event.Level.ERROR if error else Event.Level.INFO)


def _render_job(job: ProofJob) -> str:
    job = ProofJob.objects.select_related("machine").get(pk=job.pk)
    return fragments.render_proof(job)
