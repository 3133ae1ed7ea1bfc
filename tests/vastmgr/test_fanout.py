"""The fan-out path in one process, as `bench_fanout` runs it: the load generator's simulated
engines → the fleet controller → the consumers → viewers. Every host's final seq must reach
every viewer, no row may go back in seq, and host panels go only where someone watches."""

import asyncio
import json
import os
import re
import secrets
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.vastmgr.live_engine import session_cookie, wait_until, ws_headers
from vastmgr.asgi import application
from vastmgr.fleet import fragments
from vastmgr.fleet.controller.loadgen import LoadGenerator, ViewerLog
from vastmgr.fleet.controller.publish import (
    SYNC_EVERY,
    SYNC_KEEP,
    LayerPublisher,
    Sequencer,
    relay_batches,
)
from vastmgr.fleet.controller.service import FleetController
from vastmgr.fleet.controller.shown import ShownRows
from vastmgr.fleet.controller.viewers import BLIND_SLACK, RENEW_EVERY
from vastmgr.fleet.models import Machine

pytestmark = pytest.mark.django_db(transaction=True)

HOSTS, FLEET_VIEWERS, RATE, LOAD_SNAPSHOTS = 5, 2, 10.0, 20
PANEL_SEQ = re.compile(r'id="host-(\d+)-panel".*?· seq (\d+)', re.DOTALL)
REDIS_URL = os.environ.get("TEST_REDIS_URL")


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


class ShiftedClock:
    """Real time, plus jumps the test makes to get past the controller's start-up window."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class RecordingPublisher(LayerPublisher):
    def __init__(self):
        super().__init__()
        self.groups: list[str] = []

    async def send(self, messages):
        self.groups.extend(group for group, _ in messages)
        return await super().send(messages)


async def read_into(ws: WebsocketCommunicator, record) -> None:
    # No short timeout: on a timeout the communicator cancels the consumer it drives.
    while True:
        record(await ws.receive_from(timeout=3600), time.time())


async def test_every_final_state_reaches_every_viewer_in_seq_order(channel_layer):
    loadgen = LoadGenerator(HOSTS, RATE)
    loadgen.running = False
    await loadgen.start()
    machines = await database_sync_to_async(lambda: [
        Machine.objects.create(name=f"lg-{i}", provider="local", host="127.0.0.1",
                               engine_port=port) for i, port in enumerate(loadgen.ports)])()
    index = {m.pk: i for i, m in enumerate(machines)}
    watched = machines[0].pk
    clock = ShiftedClock()
    publisher = RecordingPublisher()
    controller = FleetController(publisher=publisher, clock=clock, tick=0.2)
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
                             (f"/ws/hosts/{watched}/", record_panel)]:
            ws = WebsocketCommunicator(application, path, headers=ws_headers(cookie))
            assert (await ws.connect())[0]
            sockets.append(ws)
            readers.append(asyncio.create_task(read_into(ws, record)))
        await wait_until(lambda: all(controller.hosts.get(m.pk) and controller.hosts[m.pk].live.connected
                                     for m in machines))
        # Past the window in which a just-started controller renders every page: from here
        # on, pages are rendered only for the viewers that announced themselves.
        # A tick may be under way with the old clock: wait for one that began after the jump.
        clock.offset += RENEW_EVERY + BLIND_SLACK + 1
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
        assert pushed_panels == {fragments.host_group(watched)}
    finally:
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
    batches = [json.loads(b) for b in relay_batches(numbered, sequencer.source, [("fleet", 3)],
                                                     limit=40)]
    assert [m for b in batches for m in b["messages"]] == [list(m) for m in numbered]
    assert [b["syncs"] for b in batches] == [[], [], [["fleet", 3]]]


def test_a_row_is_resent_when_a_shown_value_changed_or_its_refresh_is_due():
    """The seq, the receipt time and the bases of the clocks the browser runs forward are not
    what a person reads: a row that differs only in them is not sent again until its
    refresh is due; any other difference is sent at once."""
    def row(seq, uptime, busy, spent="1.00"):
        return (f'<tr id="host-1-row" data-seq="{seq}" data-snapshot-at="{seq}.5">'
                f'<span class="tick" data-tick-base="{uptime}.000" data-tick-age="0.000" '
                f'data-tick-digits="0">{uptime} s</span><small class="seen" data-ago="0">last '
                f'seen 0 s ago</small><span class="money" data-amount="{spent}" '
                f'data-per-hour="0.5">${spent}</span><b>{busy}</b> busy</tr>')

    shown = ShownRows(refresh=1.5)
    assert shown.row_moved(1, row(1, 10, 0), now=100.0)
    assert not shown.row_moved(1, row(2, 11, 0, spent="1.01"), now=101.0)
    assert shown.row_moved(1, row(3, 12, 1), now=101.2)  # a worker became busy
    assert not shown.row_moved(1, row(4, 13, 1), now=102.0)
    assert shown.row_moved(1, row(5, 14, 1), now=102.7)  # 1.5 s since it was sent
    assert shown.totals_moved("<p>3 live</p>") and not shown.totals_moved("<p>3 live</p>")
    shown.forget()  # the relay reconnected: what was sent may be lost
    assert shown.row_moved(1, row(5, 14, 1), now=102.8) and shown.totals_moved("<p>3 live</p>")
