"""The whole life of an SSH host from the dashboard, against the real OpenSSH server on loopback
and a host user whose login shell is bash: add, provision, watch live, prove every kind, read
the log, run a command, stop, start, restart during a proof, upgrade, a changed host key,
destroy. Every step goes through the views a staff user posts to, with a fleet controller
running as it does beside daphne."""

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from tests.conftest import free_port
from tests.vastmgr.live_engine import running_controller, wait_until
from vastmgr.fleet.models import Event, HostStatus, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import background, provision
from vastmgr.remote.lifecycle import Automation
from vastmgr.remote.models import RemoteHost
from vastmgr.remote.ssh import LinkPool
from vastmgr.remote.transport import shared_pool

from .real_sshd import RealSSHD, copy_sources, host_python

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.timeout(600)]

HOST_NAME = "gpu-loopback"
PROVISION_TIMEOUT_S = 300
PROOF_TIMEOUT_S = 120
KINDS = ("winning-post", "window-post", "snap-update", "porep-c2")


@pytest.fixture
def host(sshd_host, monkeypatch):
    """The host has no network: the engine's dependencies are on its PYTHONPATH (set by sshd,
    see real_sshd.py) and pip installs our wheel alone, as an operator asks for any offline
    host with VASTMGR_PROVISION_PIP_ARGS. Its Python is Debian's (VASTMGR_REMOTE_PYTHON)."""
    monkeypatch.setenv("VASTMGR_PROVISION_PIP_ARGS", "--no-index")
    monkeypatch.setenv("VASTMGR_REMOTE_PYTHON", host_python())
    # One tiny proof on a shared CI core: the gate here is that a verified rate is recorded.
    monkeypatch.setenv("VASTMGR_MIN_BENCH_RATE", "0.01")
    monkeypatch.setenv("VASTMGR_BENCH_KIND", "winning-post")
    monkeypatch.setenv("VASTMGR_BENCH_PROFILE", "tiny")
    monkeypatch.setenv("VASTMGR_BENCH_PROOFS", "1")
    yield sshd_host
    background.wait_idle(60)  # no background action left writing


def engine_processes(server: RealSSHD) -> list[str]:
    """The user's processes other than its SSH sessions (sshd runs those as the user)."""
    return [p for p in server.user_processes() if " sshd:" not in f" {p.split(' ', 1)[1]}"]


def engine_pid(server: RealSSHD) -> int | None:
    pid_file = server.home / "vastmgr-engine" / "engine.pid"
    return int(pid_file.read_text()) if pid_file.exists() else None


@database_sync_to_async
def staff_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user(
        "ops", password="pw-for-tests-1", is_staff=True))
    return client


def post(client: Client, url: str, data: dict | None = None):
    return database_sync_to_async(client.post)(url, data or {})


def get(client: Client, url: str):
    return database_sync_to_async(client.get)(url)


@database_sync_to_async
def machine_row() -> Machine:
    return Machine.objects.get(name=HOST_NAME)


@database_sync_to_async
def event_log(machine: Machine) -> str:
    return "\n".join(e.message for e in Event.objects.filter(machine=machine).order_by("time", "id"))


async def state_reached(machine: Machine, state: str, *, after_event: int = 0,
                        timeout: float = PROVISION_TIMEOUT_S) -> Machine:
    """Wait for `state`; fail at once, with the Events, when an error is recorded after
    Event id `after_event`."""
    async def settled():
        row = await database_sync_to_async(Machine.objects.get)(pk=machine.pk)
        if row.state == state:
            return row
        failed = await database_sync_to_async(Event.objects.filter(
            machine=machine, level=Event.Level.ERROR, id__gt=after_event).exists)()
        if failed:
            raise AssertionError(f"error before reaching {state}:\n" + await event_log(machine))
        return None
    return await wait_until(settled, timeout=timeout, every=0.3)


async def event_appears(machine: Machine, text: str, *, after_event: int = 0,
                        level: str | None = None, timeout: float = 120) -> Event:
    def find():
        events = Event.objects.filter(machine=machine, id__gt=after_event,
                                      message__contains=text)
        return events.filter(level=level).first() if level else events.first()
    try:
        return await wait_until(database_sync_to_async(find), timeout=timeout, every=0.3)
    except AssertionError:
        raise AssertionError(f"no event {text!r}:\n" + await event_log(machine)) from None


@database_sync_to_async
def last_event_id() -> int:
    return Event.objects.order_by("-id").values_list("id", flat=True).first() or 0


def shown_live(machine: Machine):
    return database_sync_to_async(
        lambda: HostStatus.objects.filter(machine=machine, connected=True,
                                          machine__last_seen__isnull=False).exists())


async def final(job_id) -> ProofJob:
    async def done():
        job = await database_sync_to_async(ProofJob.objects.get)(pk=job_id)
        return job if job.is_final else None
    return await wait_until(done, timeout=PROOF_TIMEOUT_S, every=0.25)


async def request_proof(client: Client, machine: Machine, kind: str, seed: int) -> ProofJob:
    response = await post(client, "/proofs/new/", {
        "machine": machine.pk, "kind": kind, "profile": "tiny", "seed": seed, "count": 1,
        "priority": ""})
    assert response.status_code == 302, response.content.decode()[:500]
    job_id = response["Location"].rstrip("/").rsplit("/", 1)[1]
    return await database_sync_to_async(ProofJob.objects.get)(pk=job_id)


def edited_sources(into: Path, version: str) -> Path:
    """A copy of the project whose engine says it is `version`: an upgrade to ship."""
    init = copy_sources(into) / "cuzk_engine" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "([^"]+)"', rf'__version__ = "\1+{version}"',
                           init.read_text()))
    return into


async def test_the_life_of_an_ssh_host_on_real_openssh(host, client_key, tmp_path,
                                                       monkeypatch):
    client = await staff_client()
    async with running_controller():
        # Add the host: its key goes in the form, the engine gets a free loopback port.
        response = await post(client, "/remote/hosts/add/", {
            "name": HOST_NAME, "host": "127.0.0.1", "ssh_port": host.port,
            "ssh_user": host.user, "private_key": client_key.export_private_key().decode(),
            "key_file": "", "engine_port": free_port()})
        machine = await machine_row()
        assert response.status_code == 302
        assert response["Location"] == f"/remote/machines/{machine.pk}/"

        # Provision: the request returns at once, the work runs in the background, and the
        # machine reaches `running` with a verified benchmark rate.
        response = await post(client, f"/remote/machines/{machine.pk}/provision/")
        assert response.status_code == 302
        machine = await state_reached(machine, Machine.State.RUNNING)
        assert machine.bench_rate and machine.bench_rate > 0
        log = await event_log(machine)
        for step in ("provision requested by ops", "host requirements met", "engine started",
                     "engine is healthy", "parameters ready", "proofs/h",
                     "benchmarked → running"):
            assert step in log, log
        assert machine.ssh_host_key == host.host_public_key("ed25519"), "pins the ED25519 key"
        first_pid = engine_pid(host)
        assert first_pid and any(p.startswith(f"{first_pid} ") and "cuzk_engine serve" in p
                                 for p in engine_processes(host)), engine_processes(host)

        # The controller has watched the host since it was added; now it streams through the
        # tunnel and the host page says so.
        await wait_until(shown_live(machine), timeout=60)
        page = (await get(client, f"/hosts/{machine.pk}/")).content.decode()
        panel = page.split(f'id="host-{machine.pk}-panel"')[1]
        assert 'data-conn="live"' in panel

        # One test proof of each kind, pinned to this machine, done and verified.
        jobs = [await request_proof(client, machine, kind, seed)
                for seed, kind in enumerate(KINDS, 1)]
        for job in jobs:
            job = await final(job.pk)
            assert job.status == ProofJob.Status.DONE, (job.kind, job.error)
            assert job.verified is True and job.machine_id == machine.pk

        # The engine's log, polled over one pooled connection (no new login per poll), and a
        # command on the host from the command page.
        logins = host.log().count("Accepted publickey")
        for _ in range(3):
            tail = (await get(client, f"/remote/machines/{machine.pk}/log/")).content.decode()
            assert "engine listening on" in tail, tail
        page = (await post(client, "/remote/hosts/command/", {
            "machines": [machine.pk], "command": "echo $0 $(whoami)", "timeout": 30,
        })).content.decode()
        result = page.split(f'id="command-{machine.pk}"')[1]
        assert "exit status 0" in result and f"bash {host.user}" in result
        assert host.log().count("Accepted publickey") <= logins + 1

        # Stop: the engine and its synthesis pool are gone, and the machine says `stopped`.
        mark = await last_event_id()
        await post(client, f"/remote/machines/{machine.pk}/stop/")
        machine = await state_reached(machine, Machine.State.STOPPED, after_event=mark)
        assert "engine stopped" in await event_log(machine)
        assert engine_processes(host) == []

        # Start again from `stopped`.
        mark = await last_event_id()
        await post(client, f"/remote/machines/{machine.pk}/start/")
        machine = await state_reached(machine, Machine.State.RUNNING, after_event=mark)
        await wait_until(shown_live(machine), timeout=60)
        second_pid = engine_pid(host)
        assert second_pid != first_pid

        # Restart while a proof runs: the old engine drains it (done, verified), the new one
        # starts only once the port is free and proves it is the new one.
        job = await request_proof(client, machine, "porep-c2", 41)
        await wait_until(database_sync_to_async(lambda: ProofJob.objects.filter(
            pk=job.pk, status=ProofJob.Status.RUNNING).exists()), timeout=60, every=0.1)
        mark = await last_event_id()
        await post(client, f"/remote/machines/{machine.pk}/restart/")
        await event_appears(machine, "engine is healthy", after_event=mark)
        job = await final(job.pk)
        assert job.status == ProofJob.Status.DONE and job.verified, job.error
        third_pid = engine_pid(host)
        assert third_pid not in (None, second_pid)
        assert not await database_sync_to_async(Event.objects.filter(
            machine=machine, id__gt=mark, level=Event.Level.ERROR).exists)()
        await wait_until(shown_live(machine), timeout=60)

        # Upgrade after a source change: a fresh wheel, only the project reinstalled, and the
        # new version answers.
        monkeypatch.setattr(provision, "SOURCE_ROOT", edited_sources(tmp_path / "src", "9"))
        mark = await last_event_id()
        await post(client, f"/remote/machines/{machine.pk}/upgrade/")
        await event_appears(machine, "upgraded: engine 0.1.0+9 running", after_event=mark,
                            timeout=180)
        log = await event_log(machine)
        assert "dependencies unchanged" in log
        assert engine_pid(host) != third_pid

        # The engine crashes (its whole process group killed): the automation, which finds the
        # host reachable and the engine dead, restarts it, and says so.
        crashed = engine_pid(host)
        os.killpg(crashed, signal.SIGKILL)
        await wait_until(database_sync_to_async(lambda: HostStatus.objects.filter(
            machine=machine, connected=False).exists()), timeout=30)
        mark = await last_event_id()
        links = LinkPool()
        try:
            await Automation().revive_crashed(links, timezone.now())
        finally:
            await links.close()
        log = await event_log(machine)
        assert f"the engine (pid {crashed}) is not running: restarting it (try 1 of 3)" in log
        await event_appears(machine, "engine is healthy", after_event=mark)
        assert engine_pid(host) != crashed
        await wait_until(shown_live(machine), timeout=60)

        # An outage: sshd down and every connection cut. One error Event for it however many
        # retries, one Event when it is back, and the host live again within about 2 s.
        await wait_until(shown_live(machine), timeout=60)
        mark = await last_event_id()
        host.stop()
        host.drop_sessions()
        await event_appears(machine, "cannot connect", after_event=mark, timeout=30)
        await wait_until(database_sync_to_async(lambda: HostStatus.objects.filter(
            machine=machine, connected=False).exists()), timeout=30)
        # Several retries fail meanwhile: the controller's link to the host counts them.
        link = shared_pool.get(machine.pk)
        await wait_until(lambda: link._outage is not None and link._outage[1] >= 3, timeout=30)
        host.start()
        back = time.monotonic()
        await wait_until(shown_live(machine), timeout=30, every=0.05)
        reconnect_s = time.monotonic() - back
        print(f"reconnect after the host was back: {reconnect_s:.2f} s")
        assert reconnect_s < 3.5
        outage = await database_sync_to_async(lambda: list(Event.objects.filter(
            machine=machine, id__gt=mark, kind="ssh").order_by("id").values_list(
                "level", "message")))()
        assert [level for level, _ in outage] == ["error", "info"], outage
        assert "back after" in outage[1][1]
        remote = await database_sync_to_async(RemoteHost.objects.get)(machine=machine)
        assert remote.last_error == ""

        # The host is reinstalled behind our back: another host key on the same address.
        # Provision is refused with an Event, and the running machine stays `running`.
        host.stop()
        host.drop_sessions()
        host.new_host_keys()
        host.start()
        mark = await last_event_id()
        await post(client, f"/remote/machines/{machine.pk}/provision/")
        refused = await event_appears(machine, "host key changed", after_event=mark,
                                      level=Event.Level.ERROR)
        assert "Connection refused" in refused.message
        errors = await database_sync_to_async(lambda: Event.objects.filter(
            id__gt=mark, level=Event.Level.ERROR).count())()
        assert errors == 1, "one refusal, one Event"
        await asyncio.to_thread(background.wait_idle, 30)
        assert (await machine_row()).state == Machine.State.RUNNING

        # The operator trusts the new key; destroy stops the engine: nothing left running.
        await post(client, f"/remote/machines/{machine.pk}/clear-host-key/")
        response = await post(client, f"/remote/machines/{machine.pk}/destroy/")
        assert response.status_code == 302
        machine = await machine_row()
        assert machine.state == Machine.State.KILLED
        assert machine.kill_reason == "destroyed by ops"
        assert engine_processes(host) == []
        assert engine_pid(host) is None
