"""Watching Curio's Rust cuzk daemons (flavour cuzk-upstream) and flagging where their status lies.

The daemon is the fake in fake_upstream.py (its status server, replaying snapshots written from
the upstream schema); our own engine is a real one on loopback.
"""

import asyncio
import json
import re
import socket
import time

import asyncssh
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.errors import EngineError
from tests.vastmgr import live_engine
from tests.vastmgr.fake_upstream import SCRIPT, FakeUpstream, healthy
from tests.vastmgr.live_engine import (
    FakeClock,
    running_controller,
    session_cookie,
    wait_until,
    ws_headers,
)
from tests.vastmgr.remote.fake_host import FakeHost
from vastmgr.asgi import application
from vastmgr.controller.upstream import map_snapshot, poll_interval
from vastmgr.fleet.lie_detector import LieDetector
from vastmgr.fleet.models import Machine, MachineAction, MachineStatus
from vastmgr.front import fragments, proof_forms, readmodel
from vastmgr.proofs.models import ProofJob

engine, param_cache = live_engine.engine, live_engine.param_cache
UPSTREAM = Machine.Flavour.CUZK_UPSTREAM
LIE = re.compile(r'data-lie="([a-z-]+)"')
NR = '<span class="not-reported" title="the engine did not send this value">not reported</span>'


def lies_in(html: str) -> set[str]:
    return set(LIE.findall(html))


def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):  # the server closes: Connection: close
            chunks.append(chunk)
    return b"".join(chunks)


# ---- the fake is the daemon's status server, nothing more ---------------------------------

def test_the_fake_answers_only_get_status_and_closes_every_connection():
    with FakeUpstream() as fake:
        answer = raw_request(fake.port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"Connection: close" in head and b"Content-Type: application/json" in head
        assert json.loads(body)["uptime_secs"] == SCRIPT[0].body["uptime_secs"]
        for request in (b"GET /v1/info HTTP/1.1\r\n\r\n", b"POST /status HTTP/1.1\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\n\r\n"):
            assert raw_request(fake.port, request).startswith(b"HTTP/1.1 404")


# ---- mapping and the lie detector ---------------------------------------------------------

def test_each_scripted_lie_is_flagged_exactly_while_present():
    detector, now = LieDetector(), 1000.0
    for number, step in enumerate(SCRIPT):
        now += step.advance
        for _ in range(3):  # several polls of one state: the verdict must not drift
            found = {lie.code for lie in detector.check(map_snapshot(step.body, number), now)}
            assert found == step.expect, step.name
    tally = {row["code"]: row for row in detector.tally_rows()}
    assert set(tally) == set().union(*(s.expect for s in SCRIPT))
    assert tally["gpu-unheld"]["episodes"] == 2 and not tally["gpu-unheld"]["present"]


@pytest.mark.parametrize("change, code", [
    (lambda s: s["memory"].update(used_bytes=s["memory"]["total_bytes"] + 1), "memory"),
    (lambda s: s["counters"].update(total_completed=18), "counters-by-kind"),
    (lambda s: s["pipelines"][1].update(partitions_done=4), "partitions-done"),
    (lambda s: s["gpu_workers"][0].update(current_job=None), "worker-fields"),
])
def test_every_invariant_of_our_status_model_is_checked(change, code):
    body = healthy(1000.0)
    change(body)
    assert code in {lie.code for lie in LieDetector().check(map_snapshot(body, 1), 0.0)}


def test_a_daemon_restart_forgets_the_history_that_made_a_lie():
    stuck = map_snapshot(SCRIPT[5].body, 1)  # every partition done, never completed
    detector = LieDetector()
    detector.check(stuck, 0.0)
    assert {lie.code for lie in detector.check(stuck, 120.0)} == {"done-never-completed"}
    restarted = {**stuck, "uptime_secs": 3.0}
    assert detector.check(restarted, 121.0) == []


def test_anything_missing_or_malformed_is_left_out_not_zeroed():
    mapped = map_snapshot({"uptime_secs": "soon", "memory": None, "synthesis": {"active": None},
                           "pipelines": [{"job_id": 7, "partitions": [{"index": 0, "state": "?"}]},
                                         "junk"],
                           "gpu_workers": [{"worker_id": 0, "state": "idle", "current_job": None}],
                           "counters": {"total_completed": True, "queue_depth": 2},
                           "buffers": {"aux_in_flight": "lots"}}, 1)
    assert mapped == {"flavour": "cuzk-upstream", "seq": 1, "synthesis": {},
                      "pipelines": [{"partitions": [{"index": 0}]}],
                      "gpu_workers": [{"worker_id": 0, "state": "idle", "current_job": None}],
                      "counters": {"queue_depth": 2}, "buffers": {}}
    assert LieDetector().check(mapped, 0.0) == []
    assert map_snapshot({}, 2) == {"flavour": "cuzk-upstream", "seq": 2}
    with pytest.raises(EngineError, match="not a JSON object"):
        map_snapshot([{"uptime_secs": 1}], 3)


async def test_our_engine_never_shows_a_lie(engine):
    """Every snapshot of a real engine proving real jobs (every kind, overlapping) passes the
    detector: the engine's status stream hands over each change as it happens."""
    detector = LieDetector(growth_span=1.0)
    phases = set()
    async with EngineClient(engine.url) as client:
        stream = client.stream_snapshots()
        await anext(stream)  # the stream is open: nothing of the jobs below can be missed
        for seed, kind in enumerate(("porep-c2", "snap-update", "winning-post", "window-post")):
            await client.submit(kind=kind, profile="tiny", seed=seed)
        async with asyncio.timeout(240):
            async for typed in stream:
                snapshot = typed.to_json()
                assert detector.check(snapshot, time.monotonic()) == [], snapshot
                phases |= {pt.state for p in typed.pipelines for pt in p.partitions}
                if len(typed.pipelines) == 4 and all(p.status == "done" for p in typed.pipelines):
                    break
        await stream.aclose()
    # the snapshots really showed work in flight (a tiny partition may synthesize between two
    # stream messages on an idle machine, so either side of synthesis counts)
    assert {"gpu", "done"} <= phases and phases & {"synthesizing", "synth_done"}
    # Finished jobs stay listed for the engine's retention, then leave: never flagged as stuck.
    assert detector.check(engine.status(), time.monotonic() + 5) == []


# ---- the panel ------------------------------------------------------------------------------

def upstream_panel(machine, body, detector=None, now=None):
    now = now or time.time()
    snapshot = map_snapshot(body, 3)
    detector = detector or LieDetector()
    snapshot["lies"] = [lie.as_dict() for lie in detector.check(snapshot, now)]
    snapshot["lie_tally"] = detector.tally_rows()
    snapshot["poll_interval"] = 1.5
    MachineStatus.objects.update_or_create(machine=machine, defaults={
        "connected": True, "via": "poll", "snapshot": snapshot, "interval": 1.0})
    machine.mark_seen()
    return fragments.render_machine_panel(Machine.objects.get(pk=machine.pk), now)


@pytest.mark.django_db
def test_the_panel_shows_every_upstream_field_and_what_upstream_lacks():
    machine = Machine.objects.create(name="curio-1", provider="local", host="127.0.0.1",
                                     engine_flavour=UPSTREAM, state="running")
    html = upstream_panel(machine, healthy(1000.0))
    for shown in ("porep-1000-42-ta", "snap-1000-7", "porep-c2", "snap-update",
                  "started 95 s ago", "3/10", "phase-gpu", "phase-synth_done", "W0", "W1",
                  "porep-1000-42-ta</code> P3", "4.2 s", "<b class=\"big\">3</b> / 16",
                  "17 done", "0 failed", "3 not started", "aux_in_flight", "shells_in_flight",
                  "porep-32g", "47.0 GiB", "26.0 GiB", "<td>no</td>",
                  "available 202.0 GiB", "daemon up 1000 s", "poll #3", "polled every 1.5 s",
                  "not offered for this machine"):
        assert shown in html, shown
    # What upstream never sends: labelled, never a made-up zero.
    for label in (f"{NR} cancelled", f"profile {NR}", f"priority {NR}", f"busy total {NR}",
                  f"Devices {NR}", f"status {NR}"):
        assert label in html, label
    assert "None: this snapshot is consistent." in html
    assert "evict</button>" not in html  # no SRS actions for upstream

    absent = next(step for step in SCRIPT if step.name == "fields absent or null")
    html = upstream_panel(machine, absent.body)
    for label in (f"{NR} used of {NR}", f"Pipelines {NR}.", f"SRS {NR}.", f"PCE {NR}.",
                  f"{NR} failed", f'<b class="big">{NR}</b> / {NR} active', "5 done",
                  f"W0 · dev {NR} · <b>idle</b>", f"Devices {NR}."):
        assert label in html, label
    assert "No pipelines." not in html and "No SRS loaded." not in html

    html = upstream_panel(machine, {})  # a daemon that sends nothing we know
    for label in (f"Pipelines {NR}.", f"Workers {NR}.", f"{NR} done", f"jobs waiting {NR}", f"{NR} not started"):
        assert label in html, label
    row = fragments.render_fleet_row(readmodel.load_machines(time.time(), [machine.pk])[0])
    assert f'<td class="waiting-cell">{NR}</td>' in row  # its waiting work: not reported, not 0


@pytest.mark.django_db
def test_a_lie_is_shown_with_its_meaning_and_cause_and_counted():
    machine = Machine.objects.create(name="curio-1", provider="local", host="127.0.0.1",
                                     engine_flavour=UPSTREAM, state="running")
    detector = LieDetector()
    html = upstream_panel(machine, SCRIPT[1].body, detector)
    assert lies_in(html) == {"gpu-unheld"}
    assert "partition 4 of job porep-1000-42-task7 is on the GPU but no worker is proving it " \
           "(idle: W1)" in html
    assert "Meaning: the partition is most likely in its finalizer" in html
    assert "Upstream cause: upstream has no finalizing phase" in html
    html = upstream_panel(machine, SCRIPT[2].body, detector)
    assert lies_in(html) == set()
    assert re.search(r'data-tally="gpu-unheld"><td>[^<]+</td><td>1</td><td>1</td>.*gone', html)


@pytest.mark.django_db
def test_our_engines_panel_reports_everything(engine):
    machine = Machine.objects.create(name="local", provider="local", host="127.0.0.1",
                                     engine_port=engine.port, state="running")
    engine.submit(kind="winning-post", profile="tiny", seed=1)
    MachineStatus.objects.create(machine=machine, connected=True, via="stream",
                              snapshot=engine.status())
    machine.mark_seen()
    html = fragments.render_machine_panel(machine)
    assert "not-reported" not in html and "Status warnings" not in html


# ---- no work for upstream machines ------------------------------------------------------------

@pytest.mark.django_db
def test_upstream_machines_are_offered_no_proofs_and_no_srs_actions(admin_client):
    machine = Machine.objects.create(name="curio-1", provider="local", host="127.0.0.1",
                                     engine_flavour=UPSTREAM, state="running")
    assert "upstream cuzk daemon" in machine.unusable_reason()
    form = proof_forms.TestProofForm({"machine": machine.pk, "kind": "porep-c2", "profile": "tiny",
                          "count": 1})
    assert not form.is_valid() and "upstream cuzk daemon" in str(form.errors["machine"])

    page = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert "Run test proof here" not in page and "SRS preload / evict" not in page
    assert "no test proofs" in page
    answer = admin_client.post(f"/machines/{machine.pk}/srs/",
                               {"action": "preload", "circuit_id": "porep-c2:tiny"})
    assert answer.status_code == 400 and "gRPC" in answer.content.decode()
    assert not MachineAction.objects.exists()


@pytest.mark.django_db
def test_the_add_host_form_offers_the_flavour(admin_client, tmp_path):
    page = admin_client.get("/remote/machines/add/").content.decode()
    assert 'value="cuzk-upstream"' in page
    key_file = tmp_path / "id_ed25519"  # the form checks that it exists and is private
    key_file.write_text(asyncssh.generate_private_key("ssh-ed25519").export_private_key()
                        .decode())
    key_file.chmod(0o600)
    answer = admin_client.post("/remote/machines/add/", {
        "name": "curio-ssh", "host": "127.0.0.5", "ssh_port": 22, "ssh_user": "root",
        "engine_port": 9821, "key_file": str(key_file), "engine_flavour": UPSTREAM})
    assert answer.status_code == 302
    machine = Machine.objects.get(name="curio-ssh")
    # Nothing of ours to provision: it is running (and watched through the tunnel) at once.
    assert machine.is_upstream and machine.state == "running" and machine.provider == "ssh"
    page = admin_client.get(f"/remote/machines/{machine.pk}/").content.decode()
    assert "Provision</button>" not in page and "watched only" in page
    admin_client.post(f"/remote/machines/{machine.pk}/provision/")
    assert machine.events.filter(message__contains="provision requested").count() == 0


def test_the_poll_interval_defaults_to_the_seeds_and_a_useless_one_is_refused(monkeypatch):
    monkeypatch.delenv("VASTMGR_UPSTREAM_INTERVAL", raising=False)
    assert poll_interval(1.0) == 1.5
    assert poll_interval(0.5) == 1.0  # polled often enough never to look stale
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "4")
    with pytest.raises(CommandError, match="below 3 s"):
        call_command("run_fleet", "--interval", "1")
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "fast")
    with pytest.raises(CommandError, match="is not a number"):
        call_command("run_fleet")


# ---- manage.py machines ---------------------------------------------------------------------

@pytest.mark.django_db
def test_machines_command_adds_lists_and_removes(capsys):
    call_command("machines", "add", "--name", "curio-1", "--engine-url", "http://127.0.0.1:9821",
                 "--flavour", "cuzk-upstream")
    call_command("machines", "add", "--name", "ours", "--engine-url", "http://127.1.2.3:9000/",
                 "--token", "t0k3n")
    curio, ours = Machine.objects.get(name="curio-1"), Machine.objects.get(name="ours")
    assert (curio.engine_flavour, curio.host, curio.engine_port, curio.state) == (
        UPSTREAM, "127.0.0.1", 9821, "running")
    assert (ours.engine_flavour, ours.engine_port, ours.engine_token) == ("cuzk_engine", 9000,
                                                                          "t0k3n")
    capsys.readouterr()
    call_command("machines", "list")
    listing = capsys.readouterr().out
    assert re.search(r"curio-1\s+cuzk-upstream\s+http://127.0.0.1:9821\s+running\s+offline\s+never",
                     listing)
    assert "t0k3n" not in listing
    call_command("machines", "remove", "curio-1")
    assert not Machine.objects.filter(name="curio-1").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("args, message", [
    (["--name", "ours", "--engine-url", "http://127.0.0.1:1"], "already exists"),
    (["--name", "x", "--engine-url", "https://127.0.0.1:9821"], "must start with http://"),
    (["--name", "x", "--engine-url", "127.0.0.1:9821"], "must start with http://"),
    (["--name", "x", "--engine-url", "http://127.0.0.1:70000"], "out of range"),
    (["--name", "x", "--engine-url", "http://127.0.0.1:9821/status"], "only http://host:port"),
    (["--name", "x", "--engine-url", "http://8.8.8.8:9821"], "not a loopback or private"),
    (["--name", "x", "--engine-url", "http://127.0.0.1", "--flavour", "rust"], "invalid choice"),
])
def test_machines_add_refuses_bad_input_clearly(args, message):
    Machine.objects.create(name="ours", provider="local", host="127.0.0.1")
    with pytest.raises(CommandError, match=message):
        call_command("machines", "add", *args)
    assert Machine.objects.count() == 1


@pytest.mark.django_db
def test_machines_remove_refuses_what_it_should_not_forget():
    with pytest.raises(CommandError, match="no machine named"):
        call_command("machines", "remove", "ghost")
    rented = Machine.objects.create(name="rented", provider="vast", host="1.2.3.4")
    with pytest.raises(CommandError, match="destroy it from its machine page"):
        call_command("machines", "remove", "rented")
    busy = Machine.objects.create(name="busy", provider="local", host="127.0.0.1")
    ProofJob.objects.create(machine=busy, kind="porep-c2", profile="tiny", seed=1,
                            status=ProofJob.Status.RUNNING)
    with pytest.raises(CommandError, match="1 proof\\(s\\) in flight"):
        call_command("machines", "remove", "busy")
    assert Machine.objects.filter(pk__in=[rented.pk, busy.pk]).count() == 2


# ---- end to end: the "done when" of issue 14 ---------------------------------------------------

async def next_message(ws, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        message = await ws.receive_from(timeout=max(deadline - time.monotonic(), 0.01))
        if predicate(message):
            return message


@pytest.mark.django_db(transaction=True)
async def test_an_upstream_daemon_added_by_command_goes_live_and_its_lies_come_and_go(
        monkeypatch):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    clock = FakeClock()
    cookie = await database_sync_to_async(session_cookie)()
    with FakeUpstream() as fake:
        async with running_controller(clock=clock) as controller:
            fleet = WebsocketCommunicator(application, "/ws/fleet/", headers=ws_headers(cookie))
            assert (await fleet.connect())[0]
            await fleet.receive_from(timeout=5)
            added = time.monotonic()
            await database_sync_to_async(call_command)(
                "machines", "add", "--name", "curio-1", "--engine-url", fake.url,
                "--flavour", "cuzk-upstream")
            machine = await Machine.objects.aget(name="curio-1")
            row = await next_message(
                fleet, lambda m: f'id="host-{machine.pk}-row"' in m and "badge-live" in m)
            assert time.monotonic() - added < 3.0
            assert "upstream" in row and "2 workers: <b>2</b> busy" in row and "dev ×" not in row
            await fleet.disconnect()

            host = WebsocketCommunicator(application, f"/ws/machines/{machine.pk}/",
                                         headers=ws_headers(cookie))
            assert (await host.connect())[0]
            for number, step in enumerate(SCRIPT):
                clock.advance(step.advance)
                fake.go(number)
                uptime = f"daemon up {step.body['uptime_secs']:.0f} s"
                panel = await next_message(host, lambda m, u=uptime: u in m)
                assert lies_in(panel) == step.expect, (step.name, lies_in(panel))
                if number == 0:  # the fake's pipelines and workers, as the panel shows them
                    assert 'title="porep-1000-42-task7"' in panel and "snap-1000-7" in panel
                    assert "W0 · dev 0 · <b>proving</b>" in panel
                    assert "W1 · dev 0 · <b>proving</b>" in panel
            await host.disconnect()

            # It was watched, never worked: a queued proof is not dispatched to it, and one
            # pinned to it fails with the reason.
            assert all(h.machine_id != machine.pk for h in controller.dispatcher.live_machines())
            anywhere = await ProofJob.objects.acreate(kind="porep-c2", profile="tiny", seed=1)
            pinned = await ProofJob.objects.acreate(kind="porep-c2", profile="tiny", seed=2,
                                                    machine=machine)
            await controller.dispatcher.dispatch()
            anywhere, pinned = [await ProofJob.objects.aget(pk=j.pk) for j in (anywhere, pinned)]
            assert anywhere.status == "queued" and anywhere.machine_id is None
            assert pinned.status == "failed" and "upstream cuzk daemon" in pinned.error
            assert fake.requests and set(fake.requests) == {"GET /status HTTP/1.1"}
            status = await MachineStatus.objects.aget(machine=machine)
            assert status.connected and status.snapshot["flavour"] == "cuzk-upstream"


@pytest.mark.django_db(transaction=True)
async def test_an_upstream_daemon_that_goes_away_shows_offline_with_the_reason(monkeypatch):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    fake = FakeUpstream().__enter__()
    machine = await Machine.objects.acreate(
        name="curio-1", provider="local", host="127.0.0.1", engine_port=fake.port,
        engine_flavour=UPSTREAM, state="running")
    async with running_controller() as controller:
        await wait_until(lambda: controller.hosts.get(machine.pk)
                         and controller.hosts[machine.pk].live.connected)
        fake.__exit__()  # the daemon stops: its port refuses connections
        await wait_until(lambda: not controller.hosts[machine.pk].live.connected)
        assert "GET /status" in controller.hosts[machine.pk].live.error
        await wait_until(lambda: MachineStatus.objects.filter(machine=machine, connected=False)
                         .aexists())


@pytest.mark.django_db(transaction=True)
async def test_a_remote_upstream_daemon_is_watched_through_the_ssh_tunnel(tmp_path, monkeypatch):
    """Added from the web form as an SSH host: the status server listens on the host's loopback
    only, and the controller reaches it through the machine's SSH link."""
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    key = asyncssh.generate_private_key("ssh-ed25519")
    ssh_host = FakeHost(tmp_path / "remote", key.export_public_key().decode())
    await ssh_host.start()
    client = Client()
    await database_sync_to_async(client.force_login)(await database_sync_to_async(
        get_user_model().objects.create_user)("ops", is_staff=True))
    try:
        with FakeUpstream() as fake:
            async with running_controller() as controller:
                answer = await database_sync_to_async(client.post)("/remote/machines/add/", {
                    "name": "curio-remote", "host": "127.0.0.1", "ssh_port": ssh_host.port,
                    "ssh_user": "prover", "private_key": key.export_private_key().decode(),
                    "key_file": "", "engine_port": fake.port, "engine_flavour": UPSTREAM})
                assert answer.status_code == 302
                machine = await Machine.objects.aget(name="curio-remote")
                assert machine.provider == "ssh" and machine.state == "running"
                live = await wait_until(lambda: controller.hosts.get(machine.pk) and
                                        controller.hosts[machine.pk].live.connected and
                                        controller.hosts[machine.pk].live, timeout=30)
                assert live.snapshot["flavour"] == "cuzk-upstream"
                assert [p["job_id"] for p in live.snapshot["pipelines"]] == [
                    "porep-1000-42-task7", "snap-1000-7"]
                assert live.client is None  # watched, never given work
                assert ssh_host.connections  # it came through the SSH server
    finally:
        await ssh_host.stop()
