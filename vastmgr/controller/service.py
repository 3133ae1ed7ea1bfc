"""The controller's life and loops: start and stop a watcher per host, push the fragments
that changed, write the hosts' status, run operator actions, keep history. Jobs (dispatch,
results, cancels) are `dispatch.Dispatcher`'s."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import cast

import aiohttp
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.errors import EngineAPIError, EngineUnreachable
from vastmgr.controller import daemon_actions
from vastmgr.controller import instrumentation as controller_metrics
from vastmgr.controller.dispatch import Dispatcher
from vastmgr.controller.hosts import ConnectedEngine, WatchedMachine
from vastmgr.controller.last_sent import ShownRows, shown_values
from vastmgr.controller.row_writer import update_rows
from vastmgr.controller.upstream import watcher_for
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet.data_disk import DataDiskWatch
from vastmgr.fleet.faults import FaultRecorder
from vastmgr.fleet.leases import Leases
from vastmgr.fleet.liveness import (
    HEARTBEAT_INTERVALS,
    LIVE,
    OFFLINE,
    STALE,
    connection_state,
    seen_at,
)
from vastmgr.fleet.models import Event, Machine, MachineAction, MachineSample, MachineStatus
from vastmgr.fleet.partial_snapshot import PartialSnapshot, idle_with_work_waiting
from vastmgr.fleet.transport import transport_for
from vastmgr.front import fragments, proof_panel, readmodel, viewers
from vastmgr.front.fleet_table import FleetTableForm, fleet_table
from vastmgr.front.publish import LayerPublisher
from vastmgr.front.readmodel import MachineView
from vastmgr.front.viewers import ViewerRegistry
from vastmgr.lib.errors import TransportError
from vastmgr.proofs import jobs
from vastmgr.proofs.models import BenchmarkProof, ProofJob
from vastmgr.remote.cuzk_grpc.client import CuzkClient

log = logging.getLogger(__name__)

# Watchers setting up a connection (tunnel, stream, first snapshot) at the same time.
CONNECT_CONCURRENCY = 50
# Changed rows pushed to a fleet page in one message at most. A browser handles each message
# in one task, swapping its rows one by one (2-4 ms a row on a busy 2-core machine): a page's
# fifty rows in one message made tasks of 100-300 ms, which freeze the page that long.
ROWS_PER_MESSAGE = 10


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
        self.hosts: dict[int, WatchedMachine] = {}  # the hosts watched here
        self.machines: dict[int, Machine] = {}  # every machine with a fleet row, fresh per tick
        self.machines_read = False
        self.actions: set[int] = set()
        self.benchmarks: set[int] = set()  # benchmark proofs followed here now
        self.cancels: set[int] = set()  # benchmark cancels being sent
        self.background: set[asyncio.Task] = set()
        self.notices: list[tuple[str, str]] = []  # toasts to push with the next batch
        self.last_sample = 0.0  # when history was last sampled (some hosts, each tick)
        self.last_trim = 0.0  # when history older than `history_keep` was last dropped
        self.session: aiohttp.ClientSession | None = None
        self.viewers = ViewerRegistry(clock)
        self.dispatcher = Dispatcher(self)
        self.faults = FaultRecorder("fleet controller tick")
        self.data_disk = DataDiskWatch(settings.DATA_DIR)
        self.connect_slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
        # Scale-out: only the hosts leased to this controller are watched (and dispatched to)
        # here; without leases (embedded mode) every enabled machine is.
        self.leases = leases
        self.others: dict[int, MachineStatus] = {}  # statuses of hosts watched elsewhere
        self.others_read = float("-inf")
        self.connection_changed: set[int] = set()  # hosts gone live, stale or offline
        self.shown = ShownRows(refresh=HEARTBEAT_INTERVALS * interval)
        self.page_rows: dict[str, list[int]] = {}  # fleet page group -> its rows, last pushed
        self.tables: dict[str, FleetTableForm] = {}  # fleet page query -> its table
        self.views: dict[int, MachineView] = {}  # the last render's host views, to use again

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        self.session = self.session or engine_session()
        loop = asyncio.get_running_loop()
        try:
            self.spawn(self.publisher.listen(self.viewers.note))
            while not stop.is_set():
                # Ticks start at a fixed rate: a slow tick shortens the wait, so an update
                # waits at most one tick period plus the work of the tick that carries it.
                started = loop.time()
                try:
                    await self.data_disk.check()
                    await self.tick()
                except Exception as exc:  # noqa: BLE001 - one failed tick must not end the loop
                    await self.faults.record(exc)
                controller_metrics.tick_done(self, loop.time() - started)
                remaining = self.tick_seconds - (loop.time() - started)
                try:
                    await asyncio.wait_for(stop.wait(), max(remaining, 0.0))
                except TimeoutError:
                    pass
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        await self.dispatcher.stop()
        tasks = [*(h.watcher for h in self.hosts.values() if h.watcher), *self.background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for host in self.hosts.values():
            host.watcher = None
        if self.leases is not None:
            await self.leases.release()
        await self.publisher.close()
        if self.session is not None:
            await self.session.close()
            self.session = None

    # ---- one tick -------------------------------------------------------------------------

    async def tick(self) -> None:
        """One pass, in the order a reader can follow: what changed, push it, write it, then
        the work that may wait a tick (machines, dispatch, actions, benchmarks, history)."""
        now = self.clock()
        self._resend_after_a_lost_push_socket()
        fresh = self.viewers.take_fresh()
        # The machines are read at the end of a tick, off the push's path. But a page that has
        # just opened was sent its state from the database: the whole page pushed to it now
        # comes from machines read after that, or a machine rented a moment ago would vanish
        # from it until the next tick. A controller that just started knows no machine at all.
        acquired = await self.sync_machines() if fresh or not self.machines_read else set()
        changed = self._collect_changes(now)
        written = {machine_id: self._status_row(machine_id, now) for machine_id in changed}
        for machine_id, status in written.items():
            self.hosts[machine_id].status = status
        # Push first, write after: the fragments come from the state held here (the same
        # state that is written next), so the database write adds nothing to the latency.
        await self._push_to_viewers(fresh, changed, now)
        if written:
            await self._write_statuses(written)
        await self._send_notices()
        # After the writes: a page that finds it missed a fragment re-renders from the rows.
        await self.publisher.sync()
        # Off the push's path: the machines read here (and watchers started or stopped) count
        # from the next tick, which a lifecycle change made by another process can wait for.
        acquired |= await self.sync_machines()
        if acquired:
            await self.dispatcher.resume_in_flight(acquired)
        await self.dispatcher.run_pass(now)
        await self.run_actions()
        await self.run_benchmarks()
        await self.record_history(now)

    def _resend_after_a_lost_push_socket(self) -> None:
        """Whatever was pushed while the push socket was down got lost (the viewers, asked again,
        announce themselves fresh): every row goes out again."""
        if getattr(self.publisher, "reconnected", False):
            self.publisher.reconnected = False
            self.shown.forget()
            for host in self.hosts.values():
                host.live.changed = True

    async def _push_to_viewers(self, fresh: set[str], changed: list[int], now: float) -> None:
        """Render what the watched pages and panels need and send it. Fleet pages: each watched
        page (its query, from its viewers' announcements) gets its own rows and the totals."""
        pages = self.viewers.pages()
        changed_here = set(changed)  # looked up once per machine: a list cost 1,000² a tick
        panels = {machine_id for machine_id in self.machines
                  if (machine_id in changed_here
                      and self.viewers.watched(viewers.machine_group(machine_id)))
                  or (fresh and viewers.machine_group(machine_id) in fresh
                      and self._answers_for(machine_id))}
        if not (pages or panels):
            return
        statuses = {**self.others, **{machine_id: host.status for machine_id, host
                                      in self.hosts.items() if host.status is not None}}
        messages = await database_sync_to_async(self._render)(
            pages, fresh, changed_here, panels, statuses, now)
        if not await self.publisher.send(messages):
            # Not delivered: forget what each page was sent, so the next tick sends it whole.
            self.shown.forget()
            self.page_rows.clear()
            self.viewers.fresh |= fresh
            for machine_id in changed:
                if machine_id in self.hosts:
                    self.hosts[machine_id].live.changed = True

    async def _write_statuses(self, written: dict[int, MachineStatus]) -> None:
        """Store the status rows just pushed, push what storing them decided (job progress),
        follow the jobs seen on engines and cancel the orphans found there."""
        # Machines whose stored snapshot is already the one they have (a quiet engine's
        # heartbeat, a connection change): it is not serialised and written again.
        same_snapshot = {machine_id for machine_id, status in written.items()
                         if status.snapshot is self.hosts[machine_id].stored_snapshot}
        connection_changed, self.connection_changed = self.connection_changed, set()
        messages, cancels, seen_jobs = await database_sync_to_async(self._persist)(
            list(written.values()), connection_changed, same_snapshot)
        for machine_id, status in written.items():
            if machine_id in self.hosts:
                self.hosts[machine_id].stored_snapshot = status.snapshot
        for job in seen_jobs:
            self.dispatcher.watch_result(job)
        await self.publisher.send(messages)
        for machine_id, engine_job_id in cancels:
            self.spawn(self.dispatcher.cancel_orphan(machine_id, engine_job_id))

    async def _send_notices(self) -> None:
        if self.notices:
            notices, self.notices = self.notices, []
            await self.publisher.send(notices)

    def _answers_for(self, machine_id: int) -> bool:
        """Whether this controller pushes the machine's row and panel: it watches it, or it is
        disabled (nobody watches it; every controller may push its greyed row)."""
        return machine_id in self.hosts or not self.machines[machine_id].enabled

    def machine_name(self, machine_id: int) -> str:
        machine = self.machines.get(machine_id)
        return machine.name if machine is not None else str(machine_id)

    def _collect_changes(self, now: float) -> list[int]:
        changed = []
        for machine_id, host in self.hosts.items():
            live = host.live
            state = connection_state(live.connected, live.last_seen, self.interval, now)
            heartbeat = (live.last_seen is not None and live.last_seen - host.pushed_seen
                         >= HEARTBEAT_INTERVALS * self.interval)
            if live.changed or heartbeat or host.pushed_state != state:
                live.changed = False
                if state == OFFLINE and host.pushed_state in (LIVE, STALE):
                    self.notices.extend(fragments.machine_offline_notices(
                        machine_id, self.machine_name(machine_id), live.error))
                if host.pushed_state != state:
                    # Its proof pages say whether their partitions are live or as of when.
                    self.connection_changed.add(machine_id)
                host.pushed_state = state
                if live.last_seen is not None:
                    host.pushed_seen = live.last_seen
                changed.append(machine_id)
        return changed

    def _status_row(self, machine_id: int, now: float) -> MachineStatus:
        """The host's live status as it will be stored, copied on the event loop so the seq
        and the snapshot come from the same engine update."""
        host = self.hosts[machine_id]
        live = host.live
        machine = self.machines[machine_id]
        if live.last_seen is not None:
            machine.last_seen = seen_at(live.last_seen)
        if live.connected and idle_with_work_waiting(live.snapshot_json()):
            if host.idle_since is None:
                host.idle_since = now
        else:
            host.idle_since = None
        since = host.idle_since
        # The row's pk, once the first write has found or made it (saves a query per tick).
        return MachineStatus(pk=host.status.pk if host.status is not None else None,
                          machine=machine, connected=live.connected, via=live.via,
                          interval=self.interval, seq=live.seq, snapshot=live.snapshot_json(),
                          error=live.error, updated=seen_at(now),
                          snapshot_at=None if live.snapshot_at is None else seen_at(live.snapshot_at),
                          idle_waiting_since=None if since is None else seen_at(since))

    def _render(self, pages: dict[str, str], fresh: set[str], changed: set[int],
                panels: set[int], statuses: dict[int, MachineStatus],
                now: float) -> list[tuple[str, str]]:
        """One message per watched fleet page: the whole page when it is fresh or its rows
        changed (a host added, removed, or moved by its sort or filter), else its changed rows
        whose shown values moved and the totals when they moved. The host panels in `panels`."""
        hosts = readmodel.machine_views(list(self.machines.values()), statuses, now, self.views)
        by_id = self.views = {h.machine.pk: h for h in hosts}
        self.tables = {query: self.tables.get(query) or fleet_table(query)
                       for query in pages.values()}
        arranged: dict[tuple[str, str, str], list[MachineView]] = {}
        shown = {group: self._page_machines(self.tables[query], hosts, now, arranged)
                 for group, query in pages.items()}
        rows = {group: [h.machine.pk for h in page] for group, page in shown.items()}
        whole = {group for group in shown if group in fresh or rows[group] != self.page_rows.get(group)}
        self.page_rows = rows
        self.shown.keep(shown)
        # Each row is rendered once a tick, whichever pages show it: the pages pushed whole
        # take their rows from here, and the pages pushed row by row the changed rows this
        # controller answers for (others' hosts are theirs to push), each sent where its
        # shown values moved.
        rendered: dict[int, str] = {}

        def row(view: MachineView) -> str:
            machine_id = view.machine.pk
            if machine_id not in rendered:
                rendered[machine_id] = fragments.render_fleet_row(view)
            return rendered[machine_id]

        on_pages = {machine_id for group in shown.keys() - whole for machine_id in rows[group]}
        changed_rows = {machine_id: row(by_id[machine_id]) for machine_id in changed & on_pages
                        if machine_id in by_id and self._answers_for(machine_id)}
        values = {machine_id: shown_values(html, now) for machine_id, html in changed_rows.items()}
        totals = fragments.render_fleet_totals(hosts, now) if pages and (changed or whole) \
            else ""
        totals_values = shown_values(totals, now)
        messages = []
        for group, page in shown.items():
            if group in whole:
                query = self.tables[pages[group]].query_without("page")
                # The recently killed machines' views come from the database, not `by_id`.
                page_rows = {view.machine.pk: row(view) for view in page
                             if by_id.get(view.machine.pk) is view}
                messages.append((group, fragments.render_fleet_rows(page, query, page_rows)
                                 + totals))
                self.shown.sent_whole(group, totals_values)
                continue
            parts = [changed_rows[machine_id] for machine_id in rows[group]
                     if machine_id in changed_rows
                     and self.shown.row_moved(group, machine_id, values[machine_id], now)]
            if totals and self.shown.totals_moved(group, totals_values):
                parts.append(totals)
            messages.extend((group, "".join(parts[start:start + ROWS_PER_MESSAGE]))
                            for start in range(0, len(parts), ROWS_PER_MESSAGE))
        for machine_id in panels:
            if machine_id in by_id:
                host = by_id[machine_id]
                messages.append((viewers.machine_group(machine_id),
                                 fragments.render_machine_panel(host.machine, now, host)))
        return messages

    @staticmethod
    def _page_machines(table: FleetTableForm, hosts: list[MachineView], now: float,
                       arranged: dict[tuple[str, str, str], list[MachineView]]) -> list[MachineView]:
        """The rows of a fleet page, in order: from the state held here, or, for the recently
        killed machines (which no controller holds), from the database. `arranged`: the
        fleet filtered and sorted for the pages worked out so far this tick (every page of a
        filter and sort is cut from the same list)."""
        if table.shows_killed:
            return list(table.page_rows(now))
        key = table.arrangement()
        if key not in arranged:
            arranged[key] = table.arrange(hosts)
        return list(table.page_of_machines(arranged[key]))

    def _persist(self, statuses: list[MachineStatus], connection_changed: set[int],
                 same_snapshot: frozenset[int] | set[int] = frozenset()):
        """Write the changed hosts' status, copy job progress from their pipelines, and render
        the proof pages that changed: those whose progress changed, and every unfinished job's
        on a host that went live, stale or offline (its page labels the partitions' age).
        `same_snapshot`: hosts whose stored snapshot is already theirs (not written again)."""
        cancels: list[tuple[int, str]] = []
        proof_jobs: dict[str, ProofJob] = {}
        with transaction.atomic():
            existing = dict(MachineStatus.objects.filter(
                machine_id__in=[s.machine_id for s in statuses if s.pk is None])
                .values_list("machine_id", "pk"))
            for status in statuses:
                if status.pk is None and status.machine_id in existing:
                    status.pk = existing[status.machine_id]
                elif status.pk is None:
                    status.save()
                pipelines = status.snapshot.get("pipelines", []) if status.snapshot else []
                if status.connected and pipelines:
                    for job in jobs.record_progress(status.machine_id, pipelines):
                        proof_jobs[str(job.pk)] = job
                    adopted, orphaned = jobs.orphans(status.machine_id, pipelines)
                    for job in adopted:
                        proof_jobs[str(job.pk)] = job
                    cancels.extend((status.machine_id, engine_job) for engine_job in orphaned)
            by_machine = {status.machine_id: status for status in statuses}
            for job in ProofJob.objects.in_flight().filter(machine_id__in=connection_changed):
                status = by_machine[job.machine_id]
                listed = {p.get("request_id") for p in (status.snapshot or {}).get(
                    "pipelines", [])}
                if status.connected and str(job.pk) not in listed:
                    # Back without it (an engine restart loses its jobs): the page keeps its
                    # stale label until the result waiter re-queues the job, rather than show
                    # the lost partitions as live.
                    continue
                proof_jobs.setdefault(str(job.pk), job)
            fields = ["connected", "via", "interval", "seq", "error", "updated", "snapshot_at",
                      "idle_waiting_since"]
            update_rows(MachineStatus, [s for s in statuses if s.machine_id not in same_snapshot],
                        [*fields, "snapshot"])
            update_rows(MachineStatus, [s for s in statuses if s.machine_id in same_snapshot],
                        fields)
            update_rows(Machine, [s.machine for s in statuses if s.machine.last_seen is not None],
                        ["last_seen"])
        messages = [message for job in proof_jobs.values()
                    for message in proof_panel.proof_updates(job)]
        return messages, cancels, list(proof_jobs.values())

    # ---- machines and watchers ------------------------------------------------------------

    async def sync_machines(self) -> set[int]:
        """Start and stop watchers to match the machines this controller answers for; return
        the machine ids it has just started watching."""
        machines = await database_sync_to_async(self._read_machines)()
        for machine in machines:
            # A change made by another process (lifecycle, price, Vast's figures: whatever
            # moved the change marker, so the machine was read again) is shown at once, not
            # with the engine's next update: that may never come for an offline host.
            before = self.machines.get(machine.pk)
            if before is not None and before is not machine and machine.pk in self.hosts:
                self.hosts[machine.pk].live.changed = True
        self.machines = {m.pk: m for m in machines}
        self.machines_read = True
        wanted = {m.pk: m for m in machines if m.enabled}
        if self.leases is not None:
            owned = await self.leases.refresh(set(wanted))
            wanted = {pk: m for pk, m in wanted.items() if pk in owned}
        await self._read_others()
        acquired = set()
        for machine_id in [m for m in self.hosts if m not in wanted]:
            self.forget(machine_id)
        for machine_id, machine in wanted.items():
            host = self.hosts.get(machine_id)
            if host is not None and host.watcher is not None:
                continue
            acquired.add(machine_id)
            if host is None:
                host = self.hosts[machine_id] = WatchedMachine(
                    MachineLive(machine_id, down_since=self.clock()))
            try:
                transport = transport_for(machine)
            except TransportError as exc:
                host.live.lost(str(exc), self.clock())
                continue
            assert self.session is not None, "run() opens the engines' session before watching"
            watcher = watcher_for(machine, host.live, transport, self.session, self.clock,
                                  self.interval, self.connect_slots)
            host.watcher = asyncio.create_task(watcher.run(), name=f"watch-{machine_id}")
        return acquired

    def _read_machines(self) -> list[Machine]:
        """Every machine with a fleet row, in the fleet's order. Only the machines whose change
        marker moved (or that are new here) are read whole: at a thousand hosts, reading every
        machine each tick cost more than the rest of the tick."""
        # Disabled machines are not watched, but they keep a (greyed) row in the fleet view.
        markers = {pk: tuple(marker) for pk, *marker in Machine.objects
                   .exclude(state=Machine.State.KILLED).values_list("pk", *CHANGE_MARKER)}
        moved = [pk for pk, marker in markers.items()
                 if pk not in self.machines or _change_marker(self.machines[pk]) != marker]
        read = {machine.pk: machine for machine in Machine.objects.select_related("remote")
                .filter(pk__in=moved)} if moved else {}
        # A machine killed or deleted between the two queries is left out (and forgotten).
        return [read[pk] if pk in moved else self.machines[pk] for pk in markers
                if pk in read or pk not in moved]

    def forget(self, machine_id: int) -> None:
        """Stop watching a host and drop everything kept about it."""
        host = self.hosts.pop(machine_id)
        if host.watcher is not None:
            host.watcher.cancel()

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
            MachineStatus.objects.filter(machine_id__in=[m for m in self.machines
                                                      if m not in watched_here])})()

    def connected_engine(self, machine_id: int) -> ConnectedEngine | None:
        """A watched host's engine while it is connected (None: not connected)."""
        return self.dispatcher.connected(machine_id)

    def spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.background.discard)

    # ---- operator actions and history -----------------------------------------------------

    async def run_actions(self) -> None:
        pending = await database_sync_to_async(list)(
            MachineAction.objects.filter(done_at__isnull=True).exclude(pk__in=self.actions))
        for action in pending:
            engine = self.dispatcher.connected(action.machine_id)
            host = self.hosts.get(action.machine_id)
            daemon = host.live.daemon if host is not None and host.live.connected else None
            if engine is None and daemon is None:
                continue
            self.actions.add(action.pk)
            if engine is not None:
                self.spawn(self._run_action(action, engine.client))
            else:
                self.spawn(self._run_daemon_action(action, cast(CuzkClient, daemon)))

    async def run_benchmarks(self) -> None:
        """Submit or follow the benchmark proofs of the upstream daemons watched here, and send
        the cancels operators asked for."""
        daemons = {machine_id: host.live for machine_id, host in self.hosts.items()
                   if host.live.connected and host.live.daemon is not None}
        if not daemons:
            return
        open_ones = await database_sync_to_async(list)(
            BenchmarkProof.objects.filter(
                machine_id__in=daemons, status__in=(BenchmarkProof.Status.QUEUED,
                                                    BenchmarkProof.Status.SUBMITTED))
            .values_list("pk", "machine_id", "status", "cancel_requested", "cancel_answer"))
        for pk, machine_id, status, cancel_requested, cancel_answer in open_ones:
            live = daemons[machine_id]
            daemon = cast(CuzkClient, live.daemon)
            if pk not in self.benchmarks:
                self.benchmarks.add(pk)
                price = self.machines[machine_id].price_per_hour
                self.spawn(self._follow_benchmark(pk, daemon, live, price))
            if (status == BenchmarkProof.Status.SUBMITTED and cancel_requested
                    and not cancel_answer and pk not in self.cancels):
                self.cancels.add(pk)
                self.spawn(self._cancel_benchmark(pk, daemon, live))

    async def _follow_benchmark(self, pk: int, daemon: CuzkClient, live: MachineLive,
                                price) -> None:
        try:
            await daemon_actions.follow_benchmark(pk, daemon, live.detector, price)
        finally:
            self.benchmarks.discard(pk)

    async def _cancel_benchmark(self, pk: int, daemon: CuzkClient, live: MachineLive) -> None:
        try:
            await daemon_actions.cancel_benchmark(pk, daemon, live.detector)
        finally:
            self.cancels.discard(pk)

    async def _run_daemon_action(self, action: MachineAction, daemon: CuzkClient) -> None:
        """An SRS action on an upstream daemon, through its gRPC API; what it answered is
        recorded as it said it (EvictSRS is not implemented upstream and says so)."""
        outcome, error = await daemon_actions.srs_action(daemon, action.action, action.circuit_id)
        await database_sync_to_async(_finish_action)(action, error, outcome)
        self.actions.discard(action.pk)

    async def _run_action(self, action: MachineAction, client: EngineClient) -> None:
        try:
            if action.action == MachineAction.Action.PRELOAD:
                await client.preload(action.circuit_id)
            else:
                await client.evict(action.circuit_id)
            error = ""
        except (EngineUnreachable, EngineAPIError) as exc:
            error = str(exc)
        await database_sync_to_async(_finish_action)(action, error)
        self.actions.discard(action.pk)

    async def record_history(self, now: float) -> None:
        """A history sample of each connected host every `history_every` seconds, spread over
        the ticks: each call samples the hosts longest due, as many as the time since the last
        call makes due at that rate (a thousand hosts sampled in one tick held it, and every
        push waiting behind it, for up to half a second). A host's first snapshot is sampled at
        once: rates are counter differences between samples, so work done before a host's
        first sample would never show on its charts."""
        connected = [host for host in self.hosts.values()
                     if host.live.connected and host.live.snapshot_json()]
        due = sorted((host for host in connected if host.sampled_at is not None
                      and now - host.sampled_at >= self.history_every),
                     key=lambda host: cast(float, host.sampled_at))
        share = math.ceil(len(connected) * max(now - self.last_sample, 0.0) / self.history_every)
        self.last_sample = now
        chosen = [host for host in connected if host.sampled_at is None] + due[:share]
        if not chosen:
            return
        samples = []
        for host in chosen:
            samples.append(_sample(host.live, cast(PartialSnapshot, host.live.snapshot_json()),
                                   now))
            host.sampled_at = now
        watched = [host.live.machine_id for host in chosen
                   if self.viewers.watched(viewers.machine_group(host.live.machine_id))]
        trim = now - self.last_trim >= self.history_every
        if trim:
            self.last_trim = now
        messages = await database_sync_to_async(_store_history)(
            samples, now, self.history_keep if trim else None, watched)
        await self.publisher.send(messages)


# What moves when a machine's fleet row may change: `updated` (every save and update of a
# machine moves it), the billing its spend is counted from, and when Vast last listed it (its
# GPU figures: the fleet's "Vast data N s old" must hold for the rows too).
CHANGE_MARKER = ("updated", "remote__billing_started", "remote__billing_ended",
                 "remote__vast_seen_at")


def _change_marker(machine: Machine) -> tuple:
    """`CHANGE_MARKER` of a machine as read."""
    remote = getattr(machine, "remote", None)  # None: it has no remote record
    return (machine.updated, remote and remote.billing_started, remote and remote.billing_ended,
            remote and remote.vast_seen_at)


def _sample(live: MachineLive, snapshot: PartialSnapshot, now: float) -> MachineSample:
    """One history point from the host's snapshot; a figure the daemon does not report (an
    upstream one may not) is sampled as 0."""
    workers = snapshot.get("gpu_workers", [])
    by_device: dict[str, list[int]] = {}
    for worker in workers:
        counts = by_device.setdefault(str(worker.get("gpu_ordinal")), [0, 0])
        counts[0] += worker.get("state") == "proving"
        counts[1] += 1
    counters = snapshot.get("counters", {})
    memory = snapshot.get("memory", {})
    busy = sum(c[0] for c in by_device.values())
    # Device seconds up to `now`: a worker still proving has worked on since the snapshot.
    since_snapshot = max(now - (live.snapshot_at or now), 0.0)
    busy_seconds = sum(w.get("busy_total_secs", 0.0)
                       + (since_snapshot if w.get("state") == "proving" else 0.0)
                       for w in workers)
    return MachineSample(
        machine_id=live.machine_id, time=seen_at(now),
        busy_fraction=busy / len(workers) if workers else 0.0,
        busy_by_device={k: v[0] / v[1] for k, v in by_device.items()},
        busy_seconds=busy_seconds, workers=len(workers),
        proofs_completed=counters.get("total_completed", 0),
        proofs_failed=counters.get("total_failed", 0),
        queue_depth=counters.get("queue_depth", 0),
        memory_used=memory.get("used_bytes", 0), memory_total=memory.get("total_bytes", 0))


def _store_history(samples: list[MachineSample], now: float, keep: float | None,
                   watched: list[int]):
    """Store the samples; drop those older than `keep` seconds (None: not this time); the
    charts of the `watched` hosts (sampled now), to push."""
    MachineSample.objects.bulk_create(samples)
    if keep is not None:
        MachineSample.objects.filter(time__lt=seen_at(now) - timedelta(seconds=keep)).delete()
    machines = Machine.objects.filter(pk__in=watched)
    return [(viewers.machine_group(m.pk), fragments.render_machine_charts(m, now)) for m in machines]


def _finish_action(action: MachineAction, error: str, outcome: str = "") -> None:
    action.done_at = timezone.now()
    action.error = error
    action.save(update_fields=["done_at", "error"])
    verb = "preloaded" if action.action == MachineAction.Action.PRELOAD else "evicted"
    Event.record("srs", f"{action.machine.name}: SRS {action.circuit_id} "
                 + (f"not {verb}: {error}" if error else outcome or verb),
                 machine=action.machine, level=Event.Level.ERROR if error else Event.Level.INFO)

