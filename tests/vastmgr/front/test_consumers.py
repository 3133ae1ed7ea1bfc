"""Consumers: login required, full state on connect with stable fragment ids, then pushes."""

import asyncio
import json
import re

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from tests.vastmgr.live_engine import session_cookie, ws_headers
from vastmgr.asgi import application
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.front.consumers import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, RESYNC_AT_MOST_EVERY
from vastmgr.front.fleet_table import fleet_table
from vastmgr.front.publish import LayerPublisher, fragment_event, push_token
from vastmgr.front.viewers import ASK_EVENT, CONTROLLER_GROUP, VIEWERS_GROUP, fleet_page_group
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db(transaction=True)

SNAPSHOT = {
    "seq": 7, "version": "t", "accepting": True,
    "memory": {"total_bytes": 1000, "used_bytes": 700, "available_bytes": 300},
    "synthesis": {"max_concurrent": 2, "active": 1},
    "pipelines": [{"job_id": "j1", "request_id": None, "proof_kind": "porep-c2",
                   "kind": "porep-c2", "profile": "tiny", "priority": "normal",
                   "status": "running", "error": None, "total_partitions": 2,
                   "partitions_done": 1,
                   "partitions": [{"index": 0, "state": "done", "synth_ms": 5, "gpu_ms": 7,
                                   "finalize_ms": 1},
                                  {"index": 1, "state": "gpu", "synth_ms": 6, "gpu_ms": None,
                                   "finalize_ms": None}]}],
    "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "j1",
                     "current_partition": 1, "busy_secs": 0.5, "busy_total_secs": 3.0}],
    "devices": [{"ordinal": 0, "name": "cpu", "backend": "cpu", "workers": [0]}],
    "allocations": {"srs": [], "pce": []},
    "counters": {"total_completed": 3, "total_failed": 0, "queue_depth": 0},
    "buffers": {"synth_in_flight": 0},
}


@database_sync_to_async
def make_machine(name="gpu-1", snapshot=SNAPSHOT, connected=True):
    from django.utils import timezone

    machine = Machine.objects.create(name=name, provider="local", host="127.0.0.1",
                                     last_seen=timezone.now())
    MachineStatus.objects.create(machine=machine, connected=connected, snapshot=snapshot, interval=1)
    return machine


async def connect(path, cookie):
    ws = WebsocketCommunicator(application, path, headers=ws_headers(cookie))
    connected, code = await ws.connect()
    return ws, connected, code


async def close_code(path, cookie) -> int:
    """A refused socket is accepted and closed at once, so the browser can read the code."""
    ws, connected, _ = await connect(path, cookie)
    assert connected
    message = await ws.receive_output(timeout=5)
    assert message["type"] == "websocket.close", message
    return message["code"]


async def test_a_fleet_page_socket_sends_its_pages_rows_and_announces_its_query():
    """The socket carries the page's query: its state is that page's rows (and the whole
    fleet's totals), and it tells the controller the page's query, from which the controller
    works out the page's rows itself."""
    gpus = [await make_machine(f"gpu-{n}") for n in range(3)]
    layer = get_channel_layer()
    controller_channel = await layer.new_channel()
    await layer.group_add(CONTROLLER_GROUP, controller_channel)
    cookie = await database_sync_to_async(session_cookie)()
    ws, connected, _ = await connect("/ws/fleet/?q=gpu-1&sort=-name", cookie)
    assert connected
    state = await ws.receive_from(timeout=5)
    rows = re.findall(r'id="host-(\d+)-row"', state)
    assert rows == [str(gpus[1].pk)] and 'id="fleet-totals"' in state
    announced = await layer.receive(controller_channel)
    page = fleet_table(b"q=gpu-1&sort=-name")
    assert announced["group"] == fleet_page_group(page.page_key())
    assert fleet_table(announced["query"]).page_key() == page.page_key()
    assert announced["fresh"] is False
    await ws.disconnect()


async def test_a_page_that_rendered_itself_from_the_database_has_the_controller_send_it_whole():
    """The database is written after each push, so a page that re-renders from it (the
    browser asked, or a resync) may show an older row than the controller pushed; it
    announces itself fresh, and so does every page when a controller asks (it just started
    listening, or its push socket reconnected)."""
    machine = await make_machine()
    layer = get_channel_layer()
    controller_channel = await layer.new_channel()
    await layer.group_add(CONTROLLER_GROUP, controller_channel)
    cookie = await database_sync_to_async(session_cookie)()
    fleet, _, _ = await connect("/ws/fleet/", cookie)
    host, _, _ = await connect(f"/ws/machines/{machine.pk}/", cookie)
    for ws in (fleet, host):
        await ws.receive_from(timeout=5)
    first = [await layer.receive(controller_channel) for _ in range(2)]
    assert {event["fresh"] for event in first} == {False}  # new viewers: fresh anyway
    await fleet.send_json_to({"type": "request_current_state"})
    assert 'id="fleet-rows"' in await fleet.receive_from(timeout=5)
    again = await layer.receive(controller_channel)
    assert again["group"] == first[0]["group"] and again["fresh"] and again["watching"]
    await layer.group_send(VIEWERS_GROUP, ASK_EVENT)
    answers = [await layer.receive(controller_channel) for _ in range(2)]
    assert {event["group"] for event in answers} == {event["group"] for event in first}
    assert all(event["fresh"] and event["watching"] for event in answers)
    for ws in (fleet, host):
        await ws.disconnect()


@pytest.mark.parametrize("path", ["/ws/fleet/", "/ws/machines/1/",
                                  "/ws/proofs/7f1f0e6e-8a51-4b8e-9a65-7b0b2b1a9d11/"])
async def test_anonymous_sockets_are_closed_with_4403(path):
    assert await close_code(path, None) == CLOSE_FORBIDDEN


async def test_fleet_socket_sends_every_host_row_and_totals_on_connect():
    machine = await make_machine()
    cookie = await database_sync_to_async(session_cookie)()
    ws, connected, _ = await connect("/ws/fleet/", cookie)
    assert connected
    state = await ws.receive_from(timeout=5)
    assert 'id="fleet-rows"' in state and 'id="fleet-totals"' in state
    assert f'id="host-{machine.pk}-row"' in state
    assert "badge-live" in state and "1</b> busy" in state
    await ws.disconnect()


async def test_host_socket_sends_the_engine_panel_then_forwards_pushes():
    machine = await make_machine()
    cookie = await database_sync_to_async(session_cookie)()
    ws, connected, _ = await connect(f"/ws/machines/{machine.pk}/", cookie)
    assert connected
    state = await ws.receive_from(timeout=5)
    assert f'id="host-{machine.pk}-panel"' in state and f'id="host-{machine.pk}-charts"' in state
    assert 'class="cell phase-gpu"' in state and 'class="cell phase-done"' in state
    assert "70.0%" in state  # memory used of budget
    await get_channel_layer().group_send(f"host.{machine.pk}",
                                         {"type": "fragment", "html": "<p id='x'>new</p>"})
    assert await ws.receive_from(timeout=2) == "<p id='x'>new</p>"
    await ws.send_to(text_data='{"type": "request_current_state"}')
    assert f'id="host-{machine.pk}-panel"' in await ws.receive_from(timeout=5)
    await ws.disconnect()


async def test_unknown_host_or_proof_is_closed_with_4404():
    cookie = await database_sync_to_async(session_cookie)()
    assert await close_code("/ws/machines/999/", cookie) == CLOSE_NOT_FOUND
    assert await close_code("/ws/proofs/7f1f0e6e-8a51-4b8e-9a65-7b0b2b1a9d11/", cookie) \
        == CLOSE_NOT_FOUND


async def test_proof_socket_sends_the_proof_panel():
    job = await database_sync_to_async(ProofJob.objects.create)(kind="winning-post", seed=3)
    cookie = await database_sync_to_async(session_cookie)()
    ws, connected, _ = await connect(f"/ws/proofs/{job.pk}/", cookie)
    assert connected
    state = await ws.receive_from(timeout=5)
    assert f'id="proof-{job.pk}"' in state and "queued" in state
    await ws.disconnect()


async def test_the_push_socket_needs_the_token_and_forwards_batches_to_groups():
    assert await close_code("/ws/push/", None) == CLOSE_FORBIDDEN
    cookie = await database_sync_to_async(session_cookie)()
    viewer, connected, _ = await connect("/ws/fleet/", cookie)
    await viewer.receive_from(timeout=5)
    push = WebsocketCommunicator(application, "/ws/push/", headers=[
        (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {push_token()}".encode())])
    connected, _ = await push.connect()
    assert connected
    row = '<tr id="host-1-row"></tr>'

    async def push_batch(messages, syncs=()):
        await push.send_to(text_data=json.dumps(
            {"source": "c1", "messages": messages, "syncs": list(syncs)}))

    await push_batch([["fleet", row, 1]])
    assert await viewer.receive_from(timeout=2) == row
    await push.disconnect()
    await viewer.disconnect()


async def test_a_viewer_that_missed_a_fragment_gets_the_whole_page_again():
    """A full channel-layer queue drops fragments silently: a jump in the publisher's numbers,
    or its repeated last number ahead of the viewer's, makes the consumer resend the page."""
    cookie = await database_sync_to_async(session_cookie)()
    viewer, _, _ = await connect("/ws/fleet/", cookie)
    assert 'id="fleet-rows"' in await viewer.receive_from(timeout=5)
    push = WebsocketCommunicator(application, "/ws/push/", headers=[
        (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {push_token()}".encode())])
    assert (await push.connect())[0]

    async def push_batch(messages, syncs=()):
        await push.send_to(text_data=json.dumps(
            {"source": "c1", "messages": messages, "syncs": list(syncs)}))

    await push_batch([["fleet", "<p>1</p>", 1], ["fleet", "<p>2</p>", 2]])
    assert [await viewer.receive_from(timeout=2) for _ in range(2)] == ["<p>1</p>", "<p>2</p>"]
    await push_batch([], syncs=[["fleet", 2]])  # nothing missed: nothing resent
    await push_batch([["fleet", "<p>4</p>", 4]])  # 3 never arrived
    assert 'id="fleet-rows"' in await viewer.receive_from(timeout=5)
    assert await viewer.receive_from(timeout=2) == "<p>4</p>"
    await asyncio.sleep(RESYNC_AT_MOST_EVERY)
    await push_batch([], syncs=[["fleet", 5]])  # the last fragment, 5, never arrived
    assert 'id="fleet-rows"' in await viewer.receive_from(timeout=5)
    assert await viewer.receive_nothing(timeout=0.3)
    await push.disconnect()
    await viewer.disconnect()


async def test_fleet_and_host_viewers_announce_what_they_watch_over_the_relay():
    """Embedded mode: the controller renders a page only while someone watches it, and learns
    who does from the announcements daphne forwards on the push socket. A fleet page names
    its page's group and query."""
    machine = await make_machine()
    first_page = fleet_page_group(await database_sync_to_async(lambda: fleet_table(b"").page_key())())
    push = WebsocketCommunicator(application, "/ws/push/", headers=[
        (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {push_token()}".encode())])
    assert (await push.connect())[0]
    cookie = await database_sync_to_async(session_cookie)()
    for path, group, query in (("/ws/fleet/", first_page, "state=&q=&sort=&page=1"),
                              (f"/ws/machines/{machine.pk}/", f"host.{machine.pk}", None)):
        viewer, connected, _ = await connect(path, cookie)
        assert connected
        joined = await push.receive_json_from(timeout=5)
        assert joined["type"] == "watch" and joined["group"] == group and joined["watching"]
        assert joined.get("query") == query
        await viewer.receive_from(timeout=5)
        await viewer.disconnect()
        left = await push.receive_json_from(timeout=5)
        assert (left["group"], left["channel"], left["watching"]) == (group, joined["channel"],
                                                                      False)
    job = await database_sync_to_async(ProofJob.objects.create)(kind="winning-post", seed=3)
    viewer, connected, _ = await connect(f"/ws/proofs/{job.pk}/", cookie)
    await viewer.receive_from(timeout=5)
    assert await push.receive_nothing(timeout=0.3)  # proof pages are always pushed
    await viewer.disconnect()
    await push.disconnect()


async def test_fragments_a_full_queue_dropped_are_caught_up_by_the_next_sync(settings):
    """The real in-memory layer with room for 3 messages per consumer: of 10 fragments sent
    while the consumer cannot read, the last ones are dropped, silently. The publisher's next
    repeat of its last number makes the consumer resend the whole page."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                           "CONFIG": {"capacity": 3}}}
    cookie = await database_sync_to_async(session_cookie)()
    viewer, _, _ = await connect("/ws/fleet/", cookie)
    assert 'id="fleet-rows"' in await viewer.receive_from(timeout=5)
    layer = get_channel_layer()
    publisher = LayerPublisher(layer)
    numbered = publisher.sequencer.number([("fleet", f"<p>{n}</p>") for n in range(1, 11)])
    # All ten at once: every put lands before the consumer's first read is scheduled.
    await asyncio.gather(*(layer.group_send(group, fragment_event(html, publisher.sequencer.source,
                                                                  seq, group))
                           for group, html, seq in numbered))
    got = []
    while not await viewer.receive_nothing(timeout=0.3):
        got.append(await viewer.receive_from())
    assert got[:3] == ["<p>1</p>", "<p>2</p>", "<p>3</p>"] and "<p>10</p>" not in got, got
    await publisher.sync()
    assert 'id="fleet-rows"' in await viewer.receive_from(timeout=5)
    await viewer.disconnect()
