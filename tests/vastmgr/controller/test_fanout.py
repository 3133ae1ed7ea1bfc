"""The fan-out path in one process, as `bench_fanout` runs it: the load generator's simulated
engines → the fleet controller → the consumers → viewers. Every host's final seq must reach
every viewer, no row may go back in seq, and host panels go only where someone watches."""

import asyncio
import collections
import functools
import itertools
import json
import math
import os
import re
import secrets
import time

import aiohttp
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.engine.snapshot import EngineSnapshot, StreamHeartbeat
from devtools.loadgen import LoadGenerator, ViewerLog
from tests.vastmgr.live_engine import session_cookie, wait_until, ws_headers
from vastmgr.asgi import application
from vastmgr.controller import service
from vastmgr.controller.last_sent import MONEY, MOVING, TICK, ShownRows, shown_values
from vastmgr.controller.service import FleetController
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.front import viewers
from vastmgr.front.publish import (
    SYNC_EVERY,
    SYNC_KEEP,
    LayerPublisher,
    Sequencer,
    push_batches,
)

pytestmark = pytest.mark.django_db(transaction=True)

HOSTS, FLEET_VIEWERS, RATE, LOAD_SNAPSHOTS = 5, 2, 10.0, 20
PANEL_SEQ = re.compile(r'id="host-(\d+)-panel".*?· seq (\d+)', re.DOTALL)
REDIS_URL = os.environ.get("TEST_REDIS_URL")
ROW_ELEMENT = re.compile(r'<tr id="host-\d+-row"')


@pytest.fixture(params=["in-memory", pytest.param("redis", marks=[
    pytest.mark.scaleout,
    pytest.mark.skipif(not REDIS_URL, reason="TEST_REDIS_URL is unset (.ci/run starts Redis)")])])
def channel_layer(request, settings):
    """The in-process layer of embedded mode, or Redis as several daphne processes share it
    (watch announcements then travel through Redis to the controller's own channel)."""
    if request.param == "redis":
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"fanout-{secrets.token_hex(4)}"}}}
    return request.param


class RecordingPublisher(LayerPublisher):
    def __init__(self):
        super().__init__()
        self.groups: list[str] = []
        self.fleet_rows: list[int] = []  # rows in each push of changed rows to a fleet page

    async def send(self, messages):
        self.groups.extend(group for group, _ in messages)
        self.fleet_rows.extend(len(ROW_ELEMENT.findall(html)) for group, html in messages
                               if group.startswith("fleet.page.")
                               and 'id="fleet-rows"' not in html)  # not a whole page
        return await super().send(messages)


async def read_into(ws: WebsocketCommunicator, record) -> None:
    # No short timeout: on a timeout the communicator cancels the consumer it drives.
    while True:
        record(await ws.receive_from(timeout=3600), time.time())


async def test_every_final_state_reaches_every_viewer_in_seq_order(channel_layer, monkeypatch):
    # A tick's changed rows go out in messages of a few rows (each one browser task): here two,
    # so the five hosts' rows are split, and every final state must still arrive.
    monkeypatch.setattr(service, "ROWS_PER_MESSAGE", 2)
    loadgen = LoadGenerator(HOSTS, RATE)
    loadgen.running = False
    await loadgen.start()
    machines = await database_sync_to_async(lambda: [
        Machine.objects.create(name=f"lg-{i}", provider="local", host="127.0.0.1",
                               engine_port=port) for i, port in enumerate(loadgen.ports)])()
    index = {m.pk: i for i, m in enumerate(machines)}
    watched = machines[0].pk
    publisher = RecordingPublisher()
    controller = FleetController(publisher=publisher, tick=0.2)
    ticks = [0]
    tick = controller.tick

    async def counted_tick():
        await tick()
        ticks[0] += 1

    controller.tick = counted_tick
    stop = asyncio.Event()
    running = asyncio.create_task(controller.run(stop))

    def sent_at(machine_id, seq):
        return loadgen.sent_at[index[machine_id]].get(seq)

    cookie = await database_sync_to_async(session_cookie)()
    sockets, readers = [], []
    fleet_logs = [ViewerLog() for _ in range(FLEET_VIEWERS)]
    panel_seqs: list[int] = []

    def record_panel(html, _now):
        panel_seqs.extend(int(seq) for machine_id, seq in PANEL_SEQ.findall(html)
                          if int(machine_id) == watched)

    try:
        for path, record in [*(("/ws/fleet/", log.record) for log in fleet_logs),
                             (f"/ws/machines/{watched}/", record_panel)]:
            ws = WebsocketCommunicator(application, path, headers=ws_headers(cookie))
            assert (await ws.connect())[0]
            sockets.append(ws)
            readers.append(asyncio.create_task(read_into(ws, record)))
        await wait_until(lambda: all(controller.hosts.get(m.pk) and controller.hosts[m.pk].live.connected
                                     for m in machines))
        # Every viewer has announced itself and got its first whole page: from here on, pages
        # are rendered only for the viewers that announced themselves.
        done = ticks[0]
        await wait_until(lambda: ticks[0] >= done + 2)
        publisher.groups.clear()

        loadgen.running = True
        await wait_until(lambda: min(loadgen.seq) >= LOAD_SNAPSHOTS)
        loadgen.running = False
        final = {m.pk: loadgen.seq[index[m.pk]] for m in machines}
        assert all(seq > 0 for seq in final.values())

        await wait_until(lambda: all(log.shown == final for log in fleet_logs)
                         and panel_seqs and panel_seqs[-1] == final[watched], timeout=20)
        for log in fleet_logs:
            assert log.out_of_order == 0
            assert log.latencies(sent_at)  # the rows carried seqs the load generator sent
        assert panel_seqs == sorted(panel_seqs)
        pushed_panels = {g for g in publisher.groups if g.startswith("host.")}
        assert pushed_panels == {viewers.machine_group(watched)}
        assert max(publisher.fleet_rows) == 2
    finally:
        for task in readers:
            task.cancel()
        stop.set()
        await running
        for ws in sockets:
            await ws.disconnect()
        await loadgen.stop()


# Pages of the fleet table that all show the same machines, each its own filter or sort.
SAME_ROWS_PAGES = ["", "sort=-name", "sort=dph", "sort=-done", "q=lg-"]
ROW_TEMPLATE = "fleet/fragments/fleet_row.html"  # the row's template before it was Python


async def test_a_row_is_rendered_once_a_tick_however_many_pages_show_it(monkeypatch):
    """The controller's work grows with what changed, not with how many pages watch it: each
    row is rendered at most once a tick, whether the pages showing it are sent whole (new
    viewers, at first) or row by row (the engines' changes, under load), and however many
    of them show it."""
    from django.test.signals import template_rendered

    from vastmgr.front import fragments

    loadgen = LoadGenerator(HOSTS, RATE)
    loadgen.running = False
    await loadgen.start()
    machines = await database_sync_to_async(lambda: [
        Machine.objects.create(name=f"lg-{i}", provider="local", host="127.0.0.1",
                               engine_port=port) for i, port in enumerate(loadgen.ports)])()
    controller = FleetController(publisher=RecordingPublisher(), tick=0.2)
    renders: list[collections.Counter] = []  # per tick's render: machine id -> row renders
    # The controller renders on the database thread, which the consumers' own renders (a
    # page's first state) share, one at a time: rows are counted inside the controller's.
    counting = [False]
    render, row = controller._render, fragments.render_fleet_row

    def counted_render(*args):
        renders.append(collections.Counter())
        counting[0] = True
        try:
            return render(*args)
        finally:
            counting[0] = False

    def counted_row(view):
        if not counting[0]:
            return row(view)
        renders[-1][view.machine.pk] += 1
        counting[0] = False  # one render, whatever it is made of
        try:
            return row(view)
        finally:
            counting[0] = True

    def on_template(sender, template, context, **kwargs):
        if counting[0] and template.name == ROW_TEMPLATE:
            renders[-1][context["h"].machine.pk] += 1

    monkeypatch.setattr(controller, "_render", counted_render)
    monkeypatch.setattr(fragments, "render_fleet_row", counted_row)
    template_rendered.connect(on_template)
    stop = asyncio.Event()
    running = asyncio.create_task(controller.run(stop))
    cookie = await database_sync_to_async(session_cookie)()
    sockets, readers = [], []
    logs = [ViewerLog() for _ in SAME_ROWS_PAGES]
    try:
        for query, log in zip(SAME_ROWS_PAGES, logs):
            ws = WebsocketCommunicator(application, f"/ws/fleet/?{query}",
                                       headers=ws_headers(cookie))
            assert (await ws.connect())[0]
            sockets.append(ws)
            readers.append(asyncio.create_task(read_into(ws, log.record)))
        await wait_until(lambda: len(controller.viewers.pages()) == len(SAME_ROWS_PAGES)
                         and all(controller.hosts.get(m.pk) and controller.hosts[m.pk].live.connected
                                 for m in machines))
        loadgen.running = True
        await wait_until(lambda: min(loadgen.seq) >= LOAD_SNAPSHOTS)
        loadgen.running = False
        final = {m.pk: loadgen.seq[i] for i, m in enumerate(machines)}
        await wait_until(lambda: all(log.shown == final for log in logs), timeout=20)
        # Every page showed every row: sent whole by the controller (after the consumer's
        # first state), then row by row.
        assert all(log.page == set(final) and log.full_states >= 2 for log in logs)
        rendered = [count for count in renders if count]
        assert rendered, "the controller rendered no row"
        assert max(max(count.values()) for count in rendered) == 1, [
            dict(count) for count in rendered if max(count.values()) > 1]
    finally:
        template_rendered.disconnect(on_template)
        for task in readers:
            task.cancel()
        stop.set()
        await running
        for ws in sockets:
            await ws.disconnect()
        await loadgen.stop()


def test_each_group_is_numbered_and_its_last_number_repeated_for_a_while():
    now = [100.0]
    sequencer = Sequencer(clock=lambda: now[0])
    numbered = sequencer.number([("fleet", "a"), ("host.1", "b"), ("fleet", "c")])
    assert numbered == [("fleet", "a", 1), ("host.1", "b", 1), ("fleet", "c", 2)]
    assert sorted(sequencer.due()) == [("fleet", 2), ("host.1", 1)]
    now[0] += SYNC_EVERY / 2
    assert sequencer.due() == []  # not yet again
    now[0] += SYNC_KEEP
    sequencer.number([("fleet", "d")])
    assert sequencer.due() == [("fleet", 3)]  # host.1 has been quiet too long to repeat
    batches = [json.loads(b) for b in push_batches(numbered, sequencer.source, [("fleet", 3)],
                                                     limit=40)]
    assert [m for b in batches for m in b["messages"]] == [list(m) for m in numbered]
    assert [b["syncs"] for b in batches] == [[], [], [["fleet", 3]]]


def test_a_row_is_resent_when_a_shown_value_changed_or_its_refresh_is_due():
    """The seq, the receipt time and the clocks the browser runs forward are not what a
    person reads: a row that differs only in them is not sent again until its refresh is
    due; any other difference is sent at once, to each page that has not had it."""
    def row(seq, uptime, busy, spent=1.0, now=100.0):
        return shown_values(
            f'<tr id="host-1-row" data-seq="{seq}" data-snapshot-at="{seq}.5">'
            f'<span class="tick" data-tick-base="{uptime:.3f}" data-tick-age="0.000" '
            f'data-tick-rendered="{now:.3f}" data-tick-digits="0">{uptime} s</span><small class="seen" data-ago="0">last '
            f'seen 0 s ago</small><span class="money" data-amount="{spent:.6f}" '
            f'data-per-hour="36.000000">${spent:.2f}</span><b>{busy}</b> busy</tr>', now)

    shown = ShownRows(refresh=1.5)
    assert shown.row_moved("a", 1, row(1, 10, 0), now=100.0)
    # A second later: the clock and the spend ran on with it (36 $/h is a cent a second).
    assert not shown.row_moved("a", 1, row(2, 11, 0, spent=1.01, now=101.0), now=101.0)
    assert shown.row_moved("a", 1, row(3, 11.2, 1, spent=1.012, now=101.2), now=101.2)
    assert shown.row_moved("a", 1, row(4, 0, 1, spent=1.02, now=102.0), now=102.0)  # restarted
    assert not shown.row_moved("a", 1, row(5, 0.5, 1, spent=1.025, now=102.5), now=102.5)
    assert shown.row_moved("a", 1, row(6, 1.5, 1, spent=1.035, now=103.5), now=103.5)  # refresh
    assert shown.row_moved("b", 1, row(6, 1.5, 1, spent=1.035, now=103.5), now=103.5)  # new page
    shown.sent_whole("b", "")  # b got the row as it is now, which a never got
    assert shown.row_moved("b", 1, row(7, 1.6, 1, spent=1.036, now=103.6), now=103.6)
    assert not shown.row_moved("a", 1, row(7, 1.6, 1, spent=1.036, now=103.6), now=103.6)
    assert shown.totals_moved("a", "<p>3 live</p>") and not shown.totals_moved("a", "<p>3 live</p>")
    shown.forget()  # the push socket reconnected: what was sent may be lost
    assert shown.row_moved("a", 1, row(7, 1.6, 1, now=103.7), now=103.7)
    assert shown.totals_moved("a", "<p>3 live</p>")


FMT_AGE = [(90, lambda s: f"{round(s)} s"), (5400, lambda s: f"{round(s / 60)} min")]
# The markup's patterns are the diff's own (one format); what a browser makes of them is modelled
# here independently of the diff's reading.


def as_the_browser_shows(html: str, rendered_at: float, at: float) -> str:
    """The row a browser shows at `at`, `html` having arrived at `rendered_at`: fleet.js runs
    its clocks and spend forward (as `tick()` does). Left out: the seq and receipt time
    (machine-readable), and "last seen", which the row's refresh keeps current."""
    def tick(match):
        base, age, digits, down = float(match[2]), float(match[3]), int(match[4]), match[5]
        elapsed = age + at - rendered_at
        value = max(0.0, base - elapsed) if down else base + elapsed
        if digits:
            return f"<span>{value:.{digits}f} s"
        text = next((fmt(value) for limit, fmt in FMT_AGE if value < limit), f"{value / 3600:.1f} h")
        return f"<span>{text}"

    def money(match):
        return f"<span>${float(match[1]) + float(match[2]) * (at - rendered_at) / 3600:.2f}"

    return MOVING.sub("", MONEY.sub(money, TICK.sub(tick, html)))


def test_the_row_diff_never_holds_back_a_value_the_row_shows():
    """A real fleet row through a run of engine updates, each changing one thing a person reads
    (a count, a state, a figure), with updates that change nothing read in between: whenever
    the row as a browser would show it differs from the one last sent, the row is sent."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from vastmgr.front.fragments import render_fleet_row
    from vastmgr.front.readmodel import MachineView

    machine = Machine.objects.create(name="diffed", provider="local", host="127.0.0.1",
                                     price_per_hour=Decimal("0.5"))
    base = {"seq": 1, "memory": {"total_bytes": 1000, "used_bytes": 700},
            "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "proving"}],
            "pipelines": [], "buffers": {"pending_handles": 12}}
    steps = [  # (what changes, snapshot fields, machine fields, connected, proofs done in
        # 24 h); each step keeps what the ones before it changed
        ("nothing read", {}, {}, True, 0),
        ("parts ready", {"buffers": {"pending_handles": 13}}, {}, True, 0),
        ("nothing read", {}, {}, True, 0),
        ("parts ready back", {"buffers": {"pending_handles": 12}}, {}, True, 0),
        ("a worker idle", {"gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "idle"}]},
         {}, True, 0),
        ("a job waiting", {"pipelines": [{"job_id": "j", "status": "queued", "partitions": []}]},
         {}, True, 0),
        ("engine restarted", {}, {}, True, 0),
        ("nothing read", {}, {}, True, 0),
        ("memory", {"memory": {"total_bytes": 1000, "used_bytes": 900}}, {}, True, 0),
        ("a proof done", {}, {}, True, 1),
        ("price", {}, {"price_per_hour": Decimal("0.75")}, True, 1),
        ("lifecycle state", {}, {"state": Machine.State.STOPPED}, True, 1),
        ("disconnected", {}, {}, False, 1),
    ]
    started = 1_000_000.0 - 7200  # when the engine started: its uptime runs from there
    shown = ShownRows(refresh=1.5)
    last_sent: tuple[str, float] | None = None
    sent = []
    for step, (what, snapshot, fields, connected, done) in enumerate(steps):
        now = 1_000_000.0 + 0.4 * step
        if what == "engine restarted":
            started = now - 3.0
        base.update(snapshot)
        for name, value in fields.items():
            setattr(machine, name, value)
        if "price_per_hour" in fields:  # what bills is the ledger's, written at the change
            ledger.bill(machine, "running", fields["price_per_hour"], cause="price change",
                        at=datetime.fromtimestamp(now, UTC))
        machine.last_seen = datetime.fromtimestamp(now - 0.05, UTC)
        status = MachineStatus(machine=machine, connected=connected, interval=1.0, seq=step + 1,
                            snapshot={**base, "seq": step + 1,
                                      "uptime_secs": now - 0.05 - started},
                            snapshot_at=datetime.fromtimestamp(now - 0.05, UTC))
        html = render_fleet_row(MachineView(machine, status, now, done_24h=done))
        moved = shown.row_moved("page", machine.pk, shown_values(html, now), now)
        differs = last_sent is None or any(
            as_the_browser_shows(html, now, at) != as_the_browser_shows(*last_sent, at)
            for at in (now + 0.2, now + 1.2, now + 60.2))  # off the display's rounding edges
        assert moved or not differs, f"{what}: the row changed but was not sent"
        if moved:
            last_sent = (html, now)
            sent.append(what)
    assert "nothing read" not in sent[1:]  # and the rest were sent because something changed
    assert sent[1:] == [what for what, *_ in steps[1:] if what != "nothing read"]



def test_a_host_view_kept_from_an_earlier_render_is_the_one_a_new_render_makes():
    """The controller keeps its host views from one render to the next (its thousand hosts'
    totals, twice a second) and moves them to the new render's time. A kept view must show and
    count exactly what a view made afresh then does, whatever happened in between: time passing
    (live, stale, offline), a new status, last seen moved in place, a proof finished, hosts
    joining and leaving."""
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from django.utils import timezone

    from vastmgr.front.fragments import render_fleet_row
    from vastmgr.front.readmodel import MachineView, fleet_totals, machine_views
    from vastmgr.proofs.models import ProofJob

    def machine(name):
        return Machine.objects.create(name=name, provider="local", host="127.0.0.1",
                                      price_per_hour=Decimal("0.5"))

    def status(of, seq, now, workers=("proving", "idle")):
        snapshot = {"seq": seq, "uptime_secs": 100.0 + seq,
                    "memory": {"total_bytes": 1000, "used_bytes": 10 * seq},
                    "gpu_workers": [{"worker_id": i, "gpu_ordinal": 0, "state": state}
                                    for i, state in enumerate(workers)],
                    "pipelines": [{"job_id": f"j{seq}", "status": "queued", "partitions": []}],
                    "buffers": {"pending_handles": seq}}
        return MachineStatus(machine=of, connected=True, interval=1.0, seq=seq, snapshot=snapshot,
                          snapshot_at=datetime.fromtimestamp(now, UTC),
                          idle_waiting_since=datetime.fromtimestamp(now - 30, UTC))

    def shown(view: MachineView) -> dict:
        """Everything a view computes: its row (as `shown_values`: the render's own time left
        out) and each value the templates may ask for."""
        names = [name for name, member in vars(MachineView).items()
                 if isinstance(member, property | functools.cached_property)]
        return {"row": shown_values(render_fleet_row(view), view.now),
                **{name: getattr(view, name) for name in names}}

    now = 1_000_000.0
    alpha, bravo = machine("alpha"), machine("bravo")
    alpha.last_seen = datetime.fromtimestamp(now, UTC)
    machines = [alpha, bravo]
    statuses = {alpha.pk: status(alpha, 1, now)}
    views = machine_views(machines, statuses, now)
    for view in views:
        shown(view)  # every cached value computed, as a render would
    steps = [
        ("time passes, still live", 1.0, lambda: None),
        ("stale", 3.0, lambda: None),
        ("a new status", 0.5, lambda: statuses.update({alpha.pk: status(alpha, 2, now)})),
        ("last seen moved in place", 0.0,
         lambda: setattr(alpha, "last_seen", datetime.fromtimestamp(now, UTC))),
        ("a worker idle", 0.5, lambda: statuses.update(
            {alpha.pk: status(alpha, 3, now, ("idle", "idle"))})),
        ("a proof done", 0.5, lambda: ProofJob.objects.create(
            kind="winning-post", profile="tiny", seed=1, machine=alpha,
            status=ProofJob.Status.DONE, finished_at=timezone.now() - timedelta(seconds=1))),
        ("a host joins", 0.5, lambda: machines.append(machine("charlie"))),
        ("a host leaves", 0.5, lambda: machines.remove(bravo)),
        ("offline", 60.0, lambda: None),
    ]
    for what, seconds, change in steps:
        now += seconds
        change()
        kept = {view.machine.pk: view for view in views}
        views = machine_views(machines, statuses, now, kept)
        fresh = machine_views(machines, statuses, now)
        for view, new in zip(views, fresh, strict=True):
            differ = {k: (v, shown(new)[k]) for k, v in shown(view).items() if v != shown(new)[k]}
            assert not differ, (what, differ)
        assert fleet_totals(views, now) == fleet_totals(fresh, now), what
    assert views[0] is kept[alpha.pk]  # kept, not made again, when nothing changed


async def test_history_is_sampled_every_interval_per_host_spread_over_the_ticks():
    """Each host's history is sampled every `history_every` seconds, its first snapshot at
    once; the samples of a fleet are spread over the ticks (a thousand hosts sampled in one
    tick held it for up to half a second), never leaving a host unsampled for long."""
    from collections import defaultdict

    from tests.vastmgr.live_engine import FakeClock
    from vastmgr.fleet.models import MachineSample

    hosts, every, tick = 20, 10.0, 0.5
    loadgen = LoadGenerator(hosts, RATE)
    loadgen.running = False
    await loadgen.start()
    await database_sync_to_async(lambda: [
        Machine.objects.create(name=f"lg-{i}", provider="local", host="127.0.0.1",
                               engine_port=port) for i, port in enumerate(loadgen.ports)])()
    clock = FakeClock()
    controller = FleetController(publisher=LayerPublisher(), clock=clock, history_every=every)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        await wait_until(lambda: all(h.live.connected and h.live.snapshot
                                     for h in controller.hosts.values()))
        per_call = []
        for _ in range(int(3 * every / tick)):
            before = await database_sync_to_async(MachineSample.objects.count)()
            await controller.record_history(clock.now)
            per_call.append(await database_sync_to_async(MachineSample.objects.count)() - before)
            clock.advance(tick)
    finally:
        await controller.shutdown()
        await loadgen.stop()
    assert per_call[0] == hosts  # every host's first snapshot at once
    assert max(per_call[1:]) <= math.ceil(hosts * tick / every)  # then spread
    times = defaultdict(list)
    for machine_id, at in await database_sync_to_async(lambda: list(
            MachineSample.objects.values_list("machine_id", "time")))():
        times[machine_id].append(at.timestamp())
    assert len(times) == hosts
    for sampled in times.values():
        gaps = [later - earlier for earlier, later in itertools.pairwise(sampled)]
        assert len(sampled) >= 3 and all(every <= gap <= 2 * every for gap in gaps), gaps


async def test_the_load_generator_sends_heartbeats_as_the_engine_does():
    """Its engines stand in for real ones: a stream that asks gets heartbeats with the seq of
    the last snapshot sent, once it has been quiet that long; one that does not gets none."""
    loadgen = LoadGenerator(1, 5.0)
    loadgen.running = False
    await loadgen.start()
    client = EngineClient(f"http://127.0.0.1:{loadgen.ports[0]}")
    try:
        async with asyncio.timeout(30):
            stream = client.stream_status(heartbeat=0.1)
            messages = [await anext(stream) for _ in range(3)]  # quiet: a snapshot, 2 beats
            loadgen.running = True  # a snapshot each 0.2 s: a beat between each two
            while not (isinstance(messages[-1], EngineSnapshot) and messages[-1].seq >= 3):
                messages.append(await anext(stream))
            await loadgen.pause()
            while not (isinstance(messages[-1], StreamHeartbeat)
                       and messages[-1].seq == loadgen.seq[0]):
                messages.append(await anext(stream))
            await stream.aclose()
            unasked = client.stream_status(idle=0.5)
            first, then = await anext(unasked), await anext(unasked)
            assert isinstance(first, EngineSnapshot) and then is None  # silent while quiet
            await unasked.aclose()
    finally:
        await client.close()
        await loadgen.stop()
    assert [type(m) for m in messages[:3]] == [EngineSnapshot, StreamHeartbeat, StreamHeartbeat]
    last_snapshot = None
    for message in messages:
        if isinstance(message, EngineSnapshot):
            last_snapshot = message.seq
        else:
            assert message.seq == last_snapshot
    assert sum(isinstance(m, StreamHeartbeat) for m in messages) > 3
