"""The fleet controller against a real engine on loopback: live → stale → offline, with the
controller's clock in the test's hands, and the rendered fragments it pushes."""


import asyncio
import json
import time
from dataclasses import replace

import aiohttp
import pytest
import ujson
from aiohttp import web
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.engine.status import DeviceInfo, StatusTracker
from cuzk_engine.errors import EngineUnreachable
from tests.vastmgr import live_engine
from tests.vastmgr.live_engine import FakeClock, session_cookie, wait_until, ws_headers
from vastmgr.asgi import application
from vastmgr.controller.service import FleetController
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.front.publish import LayerPublisher
from vastmgr.front.viewers import CONTROLLER_GROUP
from vastmgr.remote.models import RemoteMachine

pytestmark = pytest.mark.django_db(transaction=True)
engine, param_cache = live_engine.engine, live_engine.param_cache


@pytest.fixture
async def serve():
    """A stand-in engine answering /status and the status stream with the given handlers;
    returns its port."""
    runners = []

    async def start(*, status, stream) -> int:
        app = web.Application()
        app.router.add_get("/status", status)
        app.router.add_get("/v1/status/stream", stream)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    yield start
    for runner in runners:
        await runner.cleanup()


class CountingProxy:
    """Stands between the controller and a real engine, counting GET /status and passing the
    status stream through: as is, or as an engine that does not know heartbeats (the ask is
    dropped), or losing snapshots until the next heartbeat (which then says a seq the
    controller never got)."""

    def __init__(self, engine_url: str, *, heartbeats: bool = True):
        self.engine_url = engine_url
        self.heartbeats = heartbeats
        self.status_requests = 0
        self.asked: list[str | None] = []  # the heartbeat each stream asked for
        self.losing = False  # dropping snapshots, until a heartbeat passes after one was dropped
        self.lost = 0
        self.frames: list[dict] = []  # every frame the controller got, in order

    async def status(self, request):
        self.status_requests += 1
        async with aiohttp.ClientSession() as s, s.get(self.engine_url + "/status") as r:
            return web.Response(text=await r.text(), content_type="application/json")

    async def stream(self, request):
        self.asked.append(request.query.get("heartbeat"))
        params = dict(request.query) if self.heartbeats else {}
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async with aiohttp.ClientSession() as s, s.ws_connect(
                self.engine_url + "/v1/status/stream", params=params) as upstream:
            async for message in upstream:
                frame = message.json()
                if self.losing and "heartbeat" not in frame:
                    self.lost += 1
                    continue
                if self.losing and self.lost:
                    self.losing = False
                self.frames.append(frame)
                await ws.send_str(message.data)
        return ws


async def watched_through(proxy, serve, clock):
    """A controller watching the engine behind `proxy`, once its first snapshot is in."""
    port = await serve(status=proxy.status, stream=proxy.stream)
    machine = await database_sync_to_async(Machine.objects.create)(
        name="proxied", provider="local", host="127.0.0.1", engine_port=port)
    controller = FleetController(publisher=LayerPublisher(), clock=clock, interval=1.0)
    controller.session = aiohttp.ClientSession()
    await controller.sync_machines()
    await wait_until(lambda: controller.hosts[machine.pk].live.connected)
    return controller, controller.hosts[machine.pk].live


async def test_heartbeats_keep_a_quiet_engine_live_without_asking_for_its_status(engine, serve):
    proxy = CountingProxy(engine.url)
    clock = FakeClock()
    controller, live = await watched_through(proxy, serve, clock)
    try:
        seq = live.seq
        for _ in range(4):  # past the 3 intervals after which a silent host is stale
            clock.advance(1.0)
            await wait_until(lambda: live.last_seen == clock.now)
        assert live.connected and live.seq == seq == engine.status()["seq"]
        assert proxy.asked == ["0.5"] and proxy.status_requests == 0
        assert sum("heartbeat" in frame for frame in proxy.frames) >= 4
    finally:
        await controller.shutdown()


async def test_a_heartbeat_saying_a_seq_never_received_makes_the_controller_fetch_it(
        engine, serve):
    async with EngineClient(engine.url) as client:
        await client.preload("winning-post.tiny")
    proxy = CountingProxy(engine.url)
    controller, live = await watched_through(proxy, serve, FakeClock())
    try:
        seq = live.seq
        proxy.losing = True
        async with EngineClient(engine.url) as client:
            await client.evict("winning-post.tiny")  # one quick change: a heartbeat follows
        await wait_until(lambda: not proxy.losing)  # snapshots lost, and a heartbeat passed
        assert proxy.lost and not any(frame["seq"] != seq for frame in proxy.frames[:-1])
        assert proxy.frames[-1]["heartbeat"] and proxy.frames[-1]["seq"] != seq
        await wait_until(lambda: live.seq == engine.status()["seq"] != seq)
        assert proxy.status_requests >= 1
    finally:
        await controller.shutdown()


async def test_an_engine_without_heartbeats_is_still_checked_with_its_status(engine, serve):
    proxy = CountingProxy(engine.url, heartbeats=False)
    clock = FakeClock()
    controller, live = await watched_through(proxy, serve, clock)
    try:
        for _ in range(3):
            clock.advance(1.0)
            await wait_until(lambda: live.last_seen == clock.now)
        assert live.connected and proxy.status_requests >= 3
        assert not any("heartbeat" in frame for frame in proxy.frames)
    finally:
        await controller.shutdown()


async def test_a_stalled_event_loop_does_not_make_a_talking_stream_look_silent(engine):
    """An event loop that stalls past a stream's quiet timeout (a thousand hosts' controller on
    a busy machine) runs the expired timeout before the read it woke up with. The heartbeats
    that arrived meanwhile are waiting: the stream must yield them, not a silence, which would
    send a GET /status to every quiet engine at once and time half of them out."""
    from cuzk_engine.engine.snapshot import EngineSnapshot, StreamHeartbeat

    loop = asyncio.get_running_loop()
    async with EngineClient(f"http://127.0.0.1:{engine.port}") as client:
        stream = client.stream_status(idle=0.5, heartbeat=0.1)
        assert isinstance(await anext(stream), EngineSnapshot)
        stalled_at = loop.time()
        loop.call_later(0.05, time.sleep, 1.0)  # the stall: the whole loop stops for 1 s
        message = await anext(stream)
        assert loop.time() - stalled_at >= 1.0  # it was read after the stall
        await stream.aclose()
    assert isinstance(message, StreamHeartbeat)


async def watched_fleet_page(controller, cookie) -> WebsocketCommunicator:
    """A fleet page's socket, once the controller (listening as `run` does) has heard which
    page it shows: the controller pushes a page only to viewers it knows of."""
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    await wait_until(lambda: CONTROLLER_GROUP in get_channel_layer().groups)
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=ws_headers(cookie))
    assert (await ws.connect())[0]
    await wait_until(lambda: controller.viewers.pages())
    return ws


async def next_row(ws, machine_id):
    """The next pushed fleet message that carries this host's row."""
    while True:
        message = await ws.receive_from(timeout=10)
        if f'id="host-{machine_id}-row"' in message:
            return message


async def test_host_goes_live_then_stale_then_offline(engine):
    machine = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port)
    clock = FakeClock()
    controller = FleetController(publisher=LayerPublisher(), clock=clock, interval=1.0)
    cookie = await database_sync_to_async(session_cookie)()
    ws = await watched_fleet_page(controller, cookie)
    # Never seen yet, and registered: "not started yet", not an alarm (its data-conn is offline).
    first = await ws.receive_from(timeout=5)
    assert "badge-new" in first and 'data-conn="offline"' in first
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        await wait_until(lambda: controller.hosts[machine.pk].live.connected)
        await controller.tick()
        row = await next_row(ws, machine.pk)
        assert "badge-live" in row and "2 workers" in row
        status = await database_sync_to_async(MachineStatus.objects.get)(machine=machine)
        assert status.connected and status.snapshot["gpu_workers"]

        # Nothing arrives for more than 3 intervals (by the controller's clock): stale, and
        # the row says how long ago the host was last seen.
        clock.advance(3.5)
        await controller.tick()
        row = await next_row(ws, machine.pk)
        assert "badge-stale" in row and "last seen 3 s ago" in row

        # The engine dies: the connection is down, so the host is offline.
        engine.kill()
        await wait_until(lambda: not controller.hosts[machine.pk].live.connected)
        await controller.tick()
        row = await next_row(ws, machine.pk)
        assert "badge-offline" in row
        status = await database_sync_to_async(MachineStatus.objects.get)(machine=machine)
        assert not status.connected and status.error

        # It comes back on the same port: live again without anyone touching the controller.
        engine.start()
        await wait_until(lambda: controller.hosts[machine.pk].live.connected, timeout=30)
        await controller.tick()
        assert "badge-live" in await next_row(ws, machine.pk)
    finally:
        await controller.shutdown()
        await ws.disconnect()


async def test_an_idle_engine_stays_live_in_pages_rendered_from_the_database(
        engine, client, django_user_model):
    """An idle engine answers with the same seq again and again; the stored last_seen must keep
    up, or every fresh page render (and the browser's 'last seen' count) would call it stale."""
    machine = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port)
    clock = FakeClock()
    controller = FleetController(publisher=LayerPublisher(), clock=clock, interval=1.0)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        await wait_until(lambda: controller.hosts[machine.pk].live.connected)
        await controller.tick()
        seq = controller.hosts[machine.pk].live.seq
        for _ in range(5):  # 5 intervals: well past the 3 after which a silent host is stale
            clock.advance(1.0)
            await wait_until(lambda: controller.hosts[machine.pk].live.last_seen == clock.now)
            await controller.tick()
        assert controller.hosts[machine.pk].live.seq == seq  # nothing changed on the engine

        stored = await database_sync_to_async(Machine.objects.get)(pk=machine.pk)
        assert clock.now - stored.last_seen.timestamp() <= 1.5
        user = await database_sync_to_async(django_user_model.objects.create_user)(
            "viewer", password="pw-for-tests-1")
        await database_sync_to_async(client.force_login)(user)
        page = await database_sync_to_async(client.get)("/")
        row = page.content.decode().split(f'id="host-{machine.pk}-row"')[1].split("</tr>")[0]
        assert "badge-live" in row, row
    finally:
        await controller.shutdown()


async def test_updates_within_a_tick_are_coalesced_into_one_push_per_host(engine):
    machine = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port)
    controller = FleetController(publisher=LayerPublisher(), interval=1.0)
    cookie = await database_sync_to_async(session_cookie)()
    ws = await watched_fleet_page(controller, cookie)
    await ws.receive_from(timeout=5)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        await wait_until(lambda: controller.hosts[machine.pk].live.connected)
        controller.hosts[machine.pk].watcher.cancel()  # from here on, only the test feeds snapshots
        for seq in range(5):  # five snapshots land between two ticks
            live = controller.hosts[machine.pk].live
            live.accept(replace(live.engine_snapshot(), seq=10_000 + seq), "stream",
                        controller.clock())
        await controller.tick()
        assert f'id="host-{machine.pk}-row"' in await ws.receive_from(timeout=5)
        assert await ws.receive_nothing(timeout=0.3)
        await controller.tick()  # nothing changed: nothing is sent
        assert await ws.receive_nothing(timeout=0.3)
    finally:
        await controller.shutdown()
        await ws.disconnect()


async def test_an_engine_refusing_the_controller_shows_the_host_offline_with_the_reason(serve):
    async def refuse(request):
        return web.json_response({"error": "missing or wrong bearer token"}, status=401)

    port = await serve(status=refuse, stream=refuse)
    machine = await database_sync_to_async(Machine.objects.create)(
        name="wrong-token", provider="local", host="127.0.0.1", engine_port=port,
        engine_token="not-the-engines")
    controller = FleetController(publisher=LayerPublisher(), interval=0.5)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        # The refusal is an answer, not an outage: the watcher keeps trying and says why.
        await wait_until(lambda: "wrong bearer token" in controller.hosts[machine.pk].live.error)
        assert not controller.hosts[machine.pk].watcher.done()
        await controller.tick()
        status = await database_sync_to_async(MachineStatus.objects.get)(machine=machine)
        assert not status.connected and "HTTP 401" in status.error
    finally:
        await controller.shutdown()


async def test_a_machine_no_longer_watched_leaves_nothing_behind(engine):
    """Everything the controller keeps per host goes when the host goes (here: disabled)."""
    machine = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port)
    controller = FleetController(publisher=LayerPublisher(), interval=1.0)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.tick()
        await wait_until(lambda: controller.hosts[machine.pk].live.connected)
        await controller.tick()
        await controller.record_history(controller.clock())
        host = controller.hosts[machine.pk]
        assert host.status is not None and host.pushed_state == "live" and host.sampled_at
        watcher = host.watcher

        await database_sync_to_async(Machine.objects.filter(pk=machine.pk).update)(enabled=False)
        await controller.sync_machines()
        assert machine.pk not in controller.hosts
        await wait_until(watcher.done)
        # Nothing else the controller holds is keyed by (or holds) the host any more; the
        # greyed row of a disabled machine is the only trace, through `machines`.
        for name, value in vars(controller).items():
            if name != "machines" and isinstance(value, dict | set):
                assert machine.pk not in value, name
    finally:
        await controller.shutdown()


def _partition_without_state() -> dict:
    status = StatusTracker([DeviceInfo(0, "cpu", "cpu", "test cpu device")], 2)
    status.register_job("a", kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny",
                        priority="high", partitions=2)
    snapshot = status.snapshot().to_json()
    del snapshot["pipelines"][0]["partitions"][1]["state"]
    return snapshot


@pytest.mark.parametrize("garbled, named", [
    ({"seq": 1, "pipelines": "not a list"}, "pipelines"),
    # Deep inside an otherwise complete snapshot: a streamed snapshot is checked when it
    # arrives, not when (if ever) the controller reads its typed form.
    (_partition_without_state(), "pipelines[0].partitions[1]: missing state"),
])
async def test_an_engine_sending_a_malformed_snapshot_shows_the_host_offline_with_the_reason(
        serve, garbled, named):
    async def malformed(request):
        return web.json_response(garbled)

    async def stream(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json(garbled)
        await ws.receive()  # held open: the controller has to drop it
        return ws

    port = await serve(status=malformed, stream=stream)
    machine = await database_sync_to_async(Machine.objects.create)(
        name="garbled", provider="local", host="127.0.0.1", engine_port=port)
    controller = FleetController(publisher=LayerPublisher(), interval=0.5)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        # Not a crash: the host is down, the reason names the part that is wrong, and the
        # watcher keeps trying.
        await wait_until(lambda: "malformed snapshot" in controller.hosts[machine.pk].live.error)
        assert named in controller.hosts[machine.pk].live.error
        assert controller.hosts[machine.pk].live.snapshot is None
        assert not controller.hosts[machine.pk].watcher.done()
        await controller.tick()
        status = await database_sync_to_async(MachineStatus.objects.get)(machine=machine)
        assert not status.connected and "malformed snapshot" in status.error
    finally:
        await controller.shutdown()


@pytest.mark.parametrize("loads", [json.loads, ujson.loads])
async def test_a_stream_message_that_is_not_json_drops_the_stream(serve, loads):
    """With either decoder (the controller's watchers use ujson): the engine is no longer
    believed, as if it had gone (EngineUnreachable), whatever that decoder's error is."""
    async def stream(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str('{"seq": 1, "pipelines": [')
        await ws.receive()
        return ws

    async def status(request):
        raise AssertionError("only the stream is read here")

    port = await serve(status=status, stream=stream)
    async with EngineClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(EngineUnreachable, match="not JSON"):
            async for _ in client.stream_status(idle=1.0, keep_json=True, loads=loads):
                pass


async def test_a_page_is_pushed_whole_when_a_host_joins_it_leaves_it_or_moves_on_it():
    """The controller works out each watched page's rows from its query: a host added, killed
    or moved by the page's sort reaches the open page with the controller's next ticks, not
    with the page's next renewal."""
    import re

    def rows(message):
        return [int(pk) for pk in re.findall(r'id="host-(\d+)-row"', message)]

    async def next_page(ws):
        while True:
            message = await ws.receive_from(timeout=5)
            if 'id="fleet-rows"' in message:
                return rows(message)

    def billed_machine(name, price):  # disabled: a greyed row, no engine to reach
        created = Machine.objects.create(name=name, provider="ssh", host="127.0.0.1",
                                         enabled=False, price_per_hour=price)
        ledger.bill(created, "running", price, cause="added")
        return created

    async def machine(name, price):
        return await database_sync_to_async(billed_machine)(name, price)

    bravo = await machine("bravo", 2)
    controller = FleetController(publisher=LayerPublisher())
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    await wait_until(lambda: CONTROLLER_GROUP in get_channel_layer().groups)
    cookie = await database_sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(application, "/ws/fleet/?sort=-dph", headers=ws_headers(cookie))
    assert (await ws.connect())[0]
    assert rows(await ws.receive_from(timeout=5)) == [bravo.pk]  # its first state
    await wait_until(lambda: controller.viewers.pages())
    await controller.tick()
    assert await next_page(ws) == [bravo.pk]  # a new viewer: its page whole
    alpha = await machine("alpha", 1)
    for _ in range(2):  # the machines are read at the end of a tick, for the next one
        await controller.tick()
    assert await next_page(ws) == [bravo.pk, alpha.pk]
    alpha.price_per_hour = 3
    await database_sync_to_async(alpha.save)()
    await database_sync_to_async(ledger.bill)(alpha, "running", 3, cause="price change")
    for _ in range(2):
        await controller.tick()
    assert await next_page(ws) == [alpha.pk, bravo.pk]  # moved up by the sort
    await database_sync_to_async(Machine.objects.filter(pk=bravo.pk).update)(
        state=Machine.State.KILLED)
    for _ in range(2):
        await controller.tick()
    assert await next_page(ws) == [alpha.pk]
    await controller.tick()
    assert await ws.receive_nothing(timeout=0.3)  # nothing changed: nothing sent
    await ws.disconnect()
    await controller.shutdown()


async def test_the_totals_a_page_shows_are_the_fleets_after_every_tick(engine):
    """The controller keeps its host views from one tick to the next (only what moves with the
    clock is worked out again) and pushes the totals only when they move. What a fleet page
    shows must stay the fleet's totals as the database has them after each tick: a host added,
    a lifecycle state changed, the engine's own state changed, time passing, a host killed, the
    controller restarted on the same fleet and its relay rejoined."""
    from vastmgr.controller.last_sent import shown_values
    from vastmgr.front.fragments import render_fleet_totals
    from vastmgr.front.readmodel import load_machines

    start = '<div id="fleet-totals"'
    clock = FakeClock()
    shown: dict[str, tuple[str, float]] = {}  # the totals the page shows, rendered at

    async def tick_and_compare(controller, what, ticks=2):
        for _ in range(ticks):  # the machines are read at the end of a tick, for the next one
            await controller.tick()
        while not await ws.receive_nothing(timeout=0.3):  # every push of this tick
            message = await ws.receive_from()
            if start in message:
                shown["totals"] = (message[message.index(start):], clock.now)
        fleet = await database_sync_to_async(
            lambda: render_fleet_totals(load_machines(clock.now), clock.now))()
        assert shown_values(*shown["totals"]) == shown_values(fleet, clock.now), what

    async def add(name, **fields):
        return await database_sync_to_async(Machine.objects.create)(
            name=name, provider="ssh", host="192.0.2.1", enabled=False, **fields)

    local = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port,
        price_per_hour=1)
    await add("bravo", price_per_hour=2)
    controller = FleetController(publisher=LayerPublisher(), clock=clock, interval=1.0)
    cookie = await database_sync_to_async(session_cookie)()
    ws = await watched_fleet_page(controller, cookie)
    controller.session = aiohttp.ClientSession()
    try:
        await controller.sync_machines()
        await wait_until(lambda: controller.hosts[local.pk].live.connected)
        await tick_and_compare(controller, "first")
        charlie = await add("charlie", state=Machine.State.RUNNING, gpu_count=4, bench_rate=9)
        await tick_and_compare(controller, "a host added")
        await database_sync_to_async(Machine.objects.filter(pk=local.pk).update)(
            state=Machine.State.RUNNING, gpu_count=2)
        await tick_and_compare(controller, "a lifecycle state changed")
        seq = controller.hosts[local.pk].live.seq
        async with EngineClient(f"http://127.0.0.1:{engine.port}") as client:
            await client.preload("winning-post.tiny")
        await wait_until(lambda: controller.hosts[local.pk].live.seq != seq)
        await tick_and_compare(controller, "the engine's state changed")
        clock.advance(3.5)
        await tick_and_compare(controller, "time passed", ticks=1)
        await database_sync_to_async(Machine.objects.filter(pk=charlie.pk).update)(
            state=Machine.State.KILLED)
        await tick_and_compare(controller, "a host killed")
    finally:
        await controller.shutdown()
    # Restarted on the same fleet: it asks the open page to announce itself and sends it whole.
    controller = FleetController(publisher=LayerPublisher(), clock=clock, interval=1.0)
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    controller.session = aiohttp.ClientSession()
    try:
        await wait_until(lambda: controller.viewers.pages())
        await controller.sync_machines()
        await wait_until(lambda: controller.hosts[local.pk].live.connected)
        await tick_and_compare(controller, "a controller restarted")
        controller.publisher.reconnected = True  # its relay rejoined: everything sent again
        clock.advance(0.5)
        await tick_and_compare(controller, "the relay rejoined")
    finally:
        await controller.shutdown()
        await ws.disconnect()


async def test_a_change_made_elsewhere_reaches_an_offline_hosts_row():
    """Vast's figures for a watched host whose engine never answers (so no engine update will
    come to carry them): the row shows them with the ticks after the listing, as the fleet's
    "Vast data N s old" says."""
    machine = await database_sync_to_async(Machine.objects.create)(
        name="silent", provider="ssh", host="192.0.2.1", price_per_hour=1)
    await database_sync_to_async(RemoteMachine.objects.create)(machine=machine)
    controller = FleetController(publisher=LayerPublisher())
    controller.session = aiohttp.ClientSession()
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    await wait_until(lambda: CONTROLLER_GROUP in get_channel_layer().groups)
    cookie = await database_sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=ws_headers(cookie))
    try:
        assert (await ws.connect())[0]
        await ws.receive_from(timeout=5)  # its first state
        await wait_until(lambda: controller.viewers.pages())
        await controller.sync_machines()
        await controller.tick()
        assert machine.pk in controller.hosts
        await database_sync_to_async(RemoteMachine.objects.filter(machine=machine).update)(
            vast_facts={"gpu_util": 73.0}, vast_seen_at=timezone.now())
        for _ in range(2):  # the machines are read at the end of a tick, for the next one
            await controller.tick()
        pushed = ""
        while "73 %" not in pushed:
            pushed = await ws.receive_from(timeout=2)
        assert f'id="host-{machine.pk}-row"' in pushed
    finally:
        await ws.disconnect()
        await controller.shutdown()


async def test_a_page_that_just_opened_never_gets_an_older_fleet_than_it_was_rendered_with():
    """A host rented a moment ago (after the controller's last read of the machines) is in the
    state a page that opens now is sent from the database; the whole page the controller then
    pushes to it has it too. Rendered from the machines read at the end of the last tick, the
    row vanished until the next one."""
    await database_sync_to_async(Machine.objects.create)(
        name="older", provider="ssh", host="192.0.2.1", enabled=False)
    controller = FleetController(publisher=LayerPublisher())
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    await wait_until(lambda: CONTROLLER_GROUP in get_channel_layer().groups)
    await controller.tick()
    rented = await database_sync_to_async(Machine.objects.create)(
        name="just-rented", provider="ssh", host="192.0.2.2", enabled=False)
    cookie = await database_sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=ws_headers(cookie))
    try:
        assert (await ws.connect())[0]
        assert f'id="host-{rented.pk}-row"' in await ws.receive_from(timeout=5)
        await wait_until(lambda: controller.viewers.pages())
        await controller.tick()
        pushed = await ws.receive_from(timeout=2)
        assert 'id="fleet-rows"' in pushed and f'id="host-{rented.pk}-row"' in pushed
    finally:
        await ws.disconnect()
        await controller.shutdown()


async def test_a_controller_started_after_a_page_opened_serves_it_at_once():
    """A page open before the controller (re)started: the controller asks every page to
    announce itself when it starts listening, so the page gets its whole state with the first
    ticks, not at its next renewal 5 s later."""
    await database_sync_to_async(Machine.objects.create)(
        name="early", provider="ssh", host="192.0.2.1", enabled=False)
    cookie = await database_sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=ws_headers(cookie))
    assert (await ws.connect())[0]
    await ws.receive_from(timeout=5)  # its first state, rendered from the database
    controller = FleetController(publisher=LayerPublisher())
    started = asyncio.get_running_loop().time()
    controller.spawn(controller.publisher.listen(controller.viewers.note))
    await wait_until(lambda: controller.viewers.pages(), timeout=2)
    await controller.tick()
    assert 'id="fleet-rows"' in await ws.receive_from(timeout=2)
    assert asyncio.get_running_loop().time() - started < 2  # well inside the 5 s renewal
    await ws.disconnect()
    await controller.shutdown()


async def test_only_machines_changed_since_the_last_read_are_read_again_however_they_changed():
    """The controller re-reads a machine only when its change marker moved, and every way of
    changing a machine moves it: a save of some fields, a bulk update, a kill, its billing, its
    provider's listing."""
    create = database_sync_to_async(Machine.objects.create)
    # Disabled: nothing is watched, the machines are only read (as for their greyed rows).
    a, b, c = [await create(name=name, provider="local", host="127.0.0.1", engine_port=1,
                            enabled=False) for name in "abc"]
    controller = FleetController(publisher=LayerPublisher(), interval=1.0)

    async def read_again() -> set[int]:
        """The machines whose object the controller replaced on its next read."""
        held = dict(controller.machines)
        await controller.sync_machines()
        return {pk for pk, machine in controller.machines.items() if held.get(pk) is not machine}

    assert await read_again() == {a.pk, b.pk, c.pk}
    assert await read_again() == set()

    await database_sync_to_async(Machine.objects.filter(pk=a.pk).update)(bench_rate=12.5)
    assert await read_again() == {a.pk}
    assert controller.machines[a.pk].bench_rate == 12.5

    b.price_per_hour = 1
    await database_sync_to_async(b.save)(update_fields=["price_per_hour"])
    assert await read_again() == {b.pk}
    assert controller.machines[b.pk].price_per_hour == 1

    await database_sync_to_async(RemoteMachine.objects.create)(machine=c, billing_started=timezone.now())
    assert await read_again() == {c.pk}
    assert controller.machines[c.pk].remote.billing_started is not None

    # Vast's listing of the instance (its GPU figures) is a row's too.
    await database_sync_to_async(RemoteMachine.objects.filter(machine=c).update)(
        vast_facts={"gpu_util": 73.0}, vast_seen_at=timezone.now())
    assert await read_again() == {c.pk}
    assert controller.machines[c.pk].remote.vast_facts == {"gpu_util": 73.0}

    await database_sync_to_async(a.kill)("test")
    assert await read_again() == set() and a.pk not in controller.machines
    d = await create(name="d", provider="local", host="127.0.0.1", engine_port=1, enabled=False)
    assert await read_again() == {d.pk}
    assert list(controller.machines) == [b.pk, c.pk, d.pk]  # the fleet's order (by name)
