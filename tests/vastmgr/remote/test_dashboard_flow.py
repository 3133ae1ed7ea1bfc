"""The whole user flow from the dashboard, on loopback: add an SSH host, provision it, watch its
engine live, run a test proof on it through the tunnel, destroy it — every step through the
views a staff user posts to, with a fleet controller running as it does beside daphne."""

import asyncio
import contextlib
import os
import signal
import site
import sys
import threading
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from tests.conftest import free_port
from tests.vastmgr.live_engine import running_controller, wait_until
from vastmgr.fleet.models import Event, HostStatus, Machine
from vastmgr.proofs.models import ProofJob

from .fake_host import FakeHost

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.timeout(600)]

HOST_NAME = "gpu-loopback"
PROVISION_TIMEOUT_S = 300
PROOF_TIMEOUT_S = 120


def _alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by init) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def _engine_pid(root: Path) -> int | None:
    pid_file = root / "vastmgr-engine" / "engine.pid"
    return int(pid_file.read_text()) if pid_file.exists() else None


@pytest.fixture
async def dashboard_host(tmp_path, client_key, monkeypatch):
    """A host with no network and no systemd user manager: its `python3` is this interpreter,
    whose dependencies its venv finds through PYTHONPATH, so only our wheel is installed — which
    an operator asks for with VASTMGR_PROVISION_PIP_ARGS, as for any offline host."""
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    host = FakeHost(tmp_path / "remote", client_key.export_public_key().decode(), env=env)
    for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"):
        host.env.pop(name, None)
    monkeypatch.setenv("VASTMGR_PROVISION_PIP_ARGS", "--no-deps --no-index")
    # One tiny proof on a shared CI core is slow: the gate here is that a rate is recorded.
    monkeypatch.setenv("VASTMGR_MIN_BENCH_RATE", "0.01")
    await host.start()
    try:
        yield host
    finally:
        # Whatever step failed: no engine left running, no provisioning thread left writing.
        if (pid := _engine_pid(host.root)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        await host.stop()
        for thread in threading.enumerate():
            if thread.name.endswith(HOST_NAME):
                await asyncio.to_thread(thread.join, 60)


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
def provision_log(machine: Machine) -> list[str]:
    return [e.message for e in Event.objects.filter(machine=machine).order_by("time", "id")]


async def provisioned(machine: Machine) -> Machine:
    """Wait for `running`, reading the Events the machine page shows; fail at once with them
    when provisioning reports an error."""
    async def settled():
        row = await database_sync_to_async(Machine.objects.get)(pk=machine.pk)
        if row.state == Machine.State.RUNNING:
            return row
        failed = await database_sync_to_async(
            Event.objects.filter(machine=machine, level=Event.Level.ERROR).exists)()
        if failed:
            raise AssertionError("provisioning failed:\n" + "\n".join(
                await provision_log(machine)))
        return None
    return await wait_until(settled, timeout=PROVISION_TIMEOUT_S, every=0.5)


def shown_live(machine: Machine):
    return database_sync_to_async(
        lambda: HostStatus.objects.filter(machine=machine, connected=True,
                                          machine__last_seen__isnull=False).exists())


async def final(job_id) -> ProofJob:
    async def done():
        job = await database_sync_to_async(ProofJob.objects.get)(pk=job_id)
        return job if job.is_final else None
    return await wait_until(done, timeout=PROOF_TIMEOUT_S, every=0.25)


async def test_add_provision_watch_prove_and_destroy_an_ssh_host_from_the_dashboard(
        dashboard_host, client_key):
    client = await staff_client()
    async with running_controller():
        # 1. Add the host: its key goes in the form, the engine gets a free loopback port.
        response = await post(client, "/remote/hosts/add/", {
            "name": HOST_NAME, "host": "127.0.0.1", "ssh_port": dashboard_host.port,
            "ssh_user": "prover", "private_key": client_key.export_private_key().decode(),
            "key_file": "", "engine_port": free_port()})
        machine = await machine_row()
        assert response.status_code == 302
        assert response["Location"] == f"/remote/machines/{machine.pk}/"

        # 2. Provision it; the request returns at once and the work runs in the background.
        response = await post(client, f"/remote/machines/{machine.pk}/provision/")
        assert response.status_code == 302
        machine = await provisioned(machine)
        assert machine.bench_rate and machine.bench_rate > 0
        log = "\n".join(await provision_log(machine))
        for step in ("provision requested by ops", "engine is healthy", "parameters ready",
                     "proofs/h", "provisioning → params_ready", "benchmarked → running"):
            assert step in log, log
        engine_pid = _engine_pid(dashboard_host.root)
        assert engine_pid is not None and _alive(engine_pid)

        # 3. The controller has watched the host since it was added; now it streams through
        # the tunnel, and the host page says so.
        await wait_until(shown_live(machine), timeout=60)
        page = (await get(client, f"/hosts/{machine.pk}/")).content.decode()
        panel = page.split(f'id="host-{machine.pk}-panel"')[1]
        assert 'data-conn="live"' in panel and "winning-post" in panel

        # 4. A test proof from the form, pinned to this machine.
        response = await post(client, "/proofs/new/", {
            "machine": machine.pk, "kind": "winning-post", "profile": "tiny", "seed": 7,
            "count": 1, "priority": ""})
        assert response.status_code == 302
        job = await database_sync_to_async(ProofJob.objects.get)()
        assert response["Location"] == f"/proofs/{job.pk}/"
        job = await final(job.pk)
        assert job.status == ProofJob.Status.DONE, job.error
        assert job.verified is True and job.machine_id == machine.pk
        assert len(bytes(job.proof)) == 192 and job.vk and job.public_inputs

        # 5. Destroy: the row is killed with who did it, and the engine no longer runs there.
        response = await post(client, f"/remote/machines/{machine.pk}/destroy/")
        assert response.status_code == 302
        machine = await machine_row()
        assert machine.state == Machine.State.KILLED
        assert machine.kill_reason == "destroyed by ops"
        assert _engine_pid(dashboard_host.root) is None
        assert not _alive(engine_pid)
        assert "engine stopped" in "\n".join(await provision_log(machine))
