"""Provisioning end to end on the in-process SSH host: the real wheel, venv, engine, params,
benchmark; the controller's transport streams status through the tunnel; a proof verifies."""

import site
import sys

import pytest
from asgiref.sync import sync_to_async

from cuzk_engine.daemon.client import EngineClient
from tests.conftest import free_port
from vastmgr.fleet.controller.transport import transport_for
from vastmgr.fleet.controller.verify import reverify
from vastmgr.fleet.models import Event, Machine
from vastmgr.remote.conf import RemoteSettings
from vastmgr.remote.lifecycle import Automation
from vastmgr.remote.models import Secret
from vastmgr.remote.provision import Provisioner, ProvisionError, ProvisionPlan, run_on_hosts
from vastmgr.remote.ssh import Backoff, LinkPool, MachineLink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The fake host has no network: its venv installs our wheel alone and finds the dependencies
# in this interpreter's site-packages through PYTHONPATH.
OFFLINE_PLAN = ProvisionPlan(remote_python=sys.executable, pip_args=("--no-deps", "--no-index"),
                             use_systemd=False, bench_proofs=1, health_timeout_s=90)


@pytest.fixture
def offline_host(fake_host):
    fake_host.env["PYTHONPATH"] = ":".join(site.getsitepackages())
    return fake_host


async def test_provision_end_to_end_then_stream_and_prove_through_the_tunnel(
        offline_host, ssh_machine):
    await Machine.objects.filter(pk=ssh_machine.pk).aupdate(engine_port=free_port())
    steps = []

    async def progress(step, line):
        steps.append(step)

    link = MachineLink(ssh_machine.pk)
    provisioner = Provisioner(ssh_machine.pk, plan=OFFLINE_PLAN, link=link, progress=progress,
                              automation=Automation(RemoteSettings(min_bench_rate=0.01)))
    try:
        rate = await provisioner.provision()
        machine = await Machine.objects.aget(pk=ssh_machine.pk)
        assert machine.state == Machine.State.RUNNING
        assert rate > 0 and machine.bench_rate == pytest.approx(rate)
        assert {"parameters", "benchmark"} <= set(steps)
        assert (offline_host.root / "vastmgr-engine" / "engine.pid").exists()

        # The controller reaches the engine through its transport, as for any machine.
        transport = transport_for(machine)
        endpoint = await transport.connect()
        async with EngineClient(endpoint.base_url, token=endpoint.token) as client:
            status = await client.status()
            assert isinstance(status, dict) and status
            job = await client.submit("winning-post", "tiny", 7)
            result = await client.get(job["job_id"], wait=120)
        await transport.close()
        assert result["status"] == "done"
        assert reverify(result["vk"], result["public_inputs"], bytes.fromhex(result["proof"]))

        # No secret in any command the host saw or any event we wrote.
        token = machine.engine_token
        assert token and not any(token in c for c in offline_host.commands)
        async for event in Event.objects.all():
            assert token not in event.message and token not in str(event.data)
    finally:
        await provisioner.stop()
        await link.close()
    assert not (offline_host.root / "vastmgr-engine" / "engine.pid").exists()


async def test_a_failing_install_step_returns_the_machine_to_registered(offline_host,
                                                                        ssh_machine):
    plan = ProvisionPlan(remote_python="python-that-does-not-exist", use_systemd=False)
    link = MachineLink(ssh_machine.pk)
    with pytest.raises(ProvisionError, match="install: exit status 127"):
        await Provisioner(ssh_machine.pk, plan=plan, link=link).provision()
    await link.close()
    machine = await Machine.objects.aget(pk=ssh_machine.pk)
    assert machine.state == Machine.State.REGISTERED
    failure = await Event.objects.filter(kind="provision", level="error").aget()
    assert "install" in failure.message


async def test_a_command_runs_on_many_hosts_with_streamed_output_and_an_audit_event(
        offline_host, ssh_machine, client_key):
    down = await Machine.objects.acreate(name="down", host="127.0.0.1", ssh_port=free_port())
    await sync_to_async(Secret.store)(f"ssh_key:{down.pk}", client_key.export_private_key().decode())
    lines = []

    async def on_line(machine_id, line):
        lines.append((machine_id, line))

    statuses = await run_on_hosts([ssh_machine.pk, down.pk], "echo up; uname -s", user="ops",
                                  on_line=on_line, pool=LinkPool(backoff=Backoff(attempts=1)))

    assert statuses[ssh_machine.pk] == 0 and statuses[down.pk] == 255
    assert (ssh_machine.pk, "up") in lines
    assert any(m == down.pk and "cannot connect" in line for m, line in lines)
    audit = await Event.objects.filter(kind="command").aget()
    assert "ops ran 'echo up; uname -s' on 2 host(s)" in audit.message
    assert audit.level == Event.Level.WARNING
