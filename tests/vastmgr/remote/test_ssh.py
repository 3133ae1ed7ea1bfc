"""SSH links against an in-process asyncssh server: pinning, refusal, auth, retries, tunnels."""

import asyncssh
import pytest
from aiohttp import ClientSession, web
from asgiref.sync import sync_to_async

from vastmgr.errors import HostKeyChanged, SSHAuthFailed, SSHError
from vastmgr.fleet.controller.transport import transport_for
from vastmgr.fleet.models import Event, Machine
from vastmgr.remote.models import RemoteHost, Secret
from vastmgr.remote.ssh import Backoff, MachineLink, fingerprint

pytestmark = pytest.mark.django_db(transaction=True)


async def events(kind):
    return [e async for e in Event.objects.filter(kind=kind).order_by("id")]


async def test_first_contact_pins_the_host_key_and_runs_commands_in_the_remote(
        fake_host, ssh_machine):
    link = MachineLink(ssh_machine.pk)
    result = await link.run("echo hello; pwd")
    await link.close()

    assert result.ok and result.stdout.splitlines() == ["hello", str(fake_host.root)]
    machine = await Machine.objects.aget(pk=ssh_machine.pk)
    assert machine.ssh_host_key == fake_host.public_host_key
    [pinned] = await events("ssh")
    assert fingerprint(fake_host.public_host_key) in pinned.message


async def test_a_changed_host_key_is_refused_with_an_event(fake_host, ssh_machine):
    link = MachineLink(ssh_machine.pk)
    await link.run("true")
    await link.close()
    await fake_host.stop()

    # The same address now answers with another key: a reinstalled host or a man in the middle.
    fake_host.host_key = asyncssh.generate_private_key("ssh-ed25519")
    await fake_host.start(fake_host.port)
    commands_before = len(fake_host.commands)
    sleeps = []

    async def record_sleep(delay):
        sleeps.append(delay)

    with pytest.raises(HostKeyChanged) as refused:
        await MachineLink(ssh_machine.pk, sleep=record_sleep).run("echo must-not-run")

    assert len(fake_host.commands) == commands_before
    assert sleeps == [], "a changed key is final: retrying cannot fix it"
    machine = await Machine.objects.aget(pk=ssh_machine.pk)
    old_print = fingerprint(machine.ssh_host_key)
    new_print = fingerprint(fake_host.public_host_key)
    assert old_print != new_print
    assert old_print in str(refused.value) and new_print in str(refused.value)
    [event] = await events("ssh_host_key")
    assert event.level == Event.Level.ERROR and new_print in event.message
    remote = await RemoteHost.objects.aget(machine=machine)
    assert "host key changed" in remote.last_error


async def test_a_rejected_client_key_fails_fast_without_leaking_the_key(
        fake_host, ssh_machine, client_key):
    other = asyncssh.generate_private_key("ssh-ed25519")
    await sync_to_async(Secret.store)(f"ssh_key:{ssh_machine.pk}",
                                      other.export_private_key().decode())

    with pytest.raises(SSHAuthFailed, match="authentication failed for prover@127.0.0.1"):
        await MachineLink(ssh_machine.pk).run("true")

    private_text = other.export_private_key().decode()
    async for event in Event.objects.all():
        assert private_text not in event.message and "PRIVATE KEY" not in event.message


async def test_an_unreachable_host_is_retried_with_backoff_then_reported(fake_host, ssh_machine):
    await fake_host.stop()
    sleeps = []

    async def record_sleep(delay):
        sleeps.append(delay)

    link = MachineLink(ssh_machine.pk, backoff=Backoff(initial_s=1, attempts=4),
                       sleep=record_sleep)
    with pytest.raises(SSHError, match="cannot connect to prover@127.0.0.1"):
        await link.run("true")

    assert len(sleeps) == 3 and all(0 <= d <= 4 for d in sleeps)
    [outage] = await events("ssh")
    assert outage.level == Event.Level.ERROR, "one Event for the outage, not one per attempt"

    await fake_host.start(fake_host.port)
    assert (await link.run("echo back")).ok
    await link.close()
    _outage, _pinned, back = await events("ssh")
    assert "back after 4 failed attempt(s)" in back.message and back.data["attempts"] == 4
    remote = await RemoteHost.objects.aget(machine_id=ssh_machine.pk)
    assert remote.last_error == "", "recovered: no stale error on the machine page"


async def test_the_link_reconnects_after_the_connection_drops(fake_host, ssh_machine):
    link = MachineLink(ssh_machine.pk)
    assert (await link.run("echo one")).stdout == "one\n"
    fake_host.drop_connections()
    await link._conn.wait_closed()

    assert (await link.run("echo two")).stdout == "two\n"
    await link.close()


async def test_the_controller_transport_tunnels_to_the_engine_on_the_hosts_loopback(fake_host, ssh_machine):
    async def status(request):
        return web.json_response({"engine": "up"})

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine_port = site._server.sockets[0].getsockname()[1]
    machine = await Machine.objects.aget(pk=ssh_machine.pk)
    machine.engine_port = engine_port
    machine.engine_token = "engine-token"
    await machine.asave(update_fields=["engine_port", "engine_token"])

    transport = transport_for(machine)
    try:
        endpoint = await transport.connect()
        assert endpoint.base_url != f"http://127.0.0.1:{engine_port}"
        assert endpoint.token == "engine-token"
        assert (await transport.connect()) == endpoint, "one tunnel per machine, reused"
        async with ClientSession() as http, http.get(f"{endpoint.base_url}/status") as response:
            assert await response.json() == {"engine": "up"}
    finally:
        await transport.close()
        await runner.cleanup()


async def test_streamed_output_arrives_line_by_line(fake_host, ssh_machine):
    lines = []

    async def on_line(stream, line):
        lines.append(line)

    link = MachineLink(ssh_machine.pk)
    status = await link.stream("echo a; echo b >&2; exit 3", on_line)
    await link.close()
    assert status == 3 and sorted(lines) == ["a", "b"]
