"""SSH links against an in-process asyncssh server: pinning, refusal, auth, retries, tunnels."""

import asyncssh
import pytest
from aiohttp import ClientSession, web
from asgiref.sync import sync_to_async

from vastmgr.fleet.models import Event, Machine
from vastmgr.fleet.transport import transport_for
from vastmgr.lib.errors import HostKeyChanged, SSHAuthFailed, SSHError, TransportError
from vastmgr.remote.models import RemoteMachine, Secret
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
    remote = await RemoteMachine.objects.aget(machine=machine)
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

    # Until the next attempt time every call fails at once, saying when, without a connect.
    await fake_host.start(fake_host.port)
    with pytest.raises(SSHError, match="next attempt at"):
        await link.run("echo back")
    assert link.attempts == 4
    remote = await RemoteMachine.objects.aget(machine_id=ssh_machine.pk)
    assert "next attempt at" in remote.last_error, "the machine page says when"

    link.retry_now()  # an operator pressed a button for this host
    assert (await link.run("echo back")).ok
    await link.close()
    _outage, _pinned, back = await events("ssh")
    assert "back after 4 failed attempt(s)" in back.message and back.data["attempts"] == 4
    remote = await RemoteMachine.objects.aget(machine_id=ssh_machine.pk)
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
    machine.state = Machine.State.RUNNING
    await machine.asave(update_fields=["engine_port", "engine_token", "state"])

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


async def test_a_host_that_stays_down_is_tried_ever_more_rarely(fake_host, ssh_machine):
    """Every caller shares the link's backoff: a watcher asking every 2 s for 10 minutes
    connects once per backoff period, about 9 times."""
    await fake_host.stop()
    now = [0.0]
    link = MachineLink(ssh_machine.pk, clock=lambda: now[0])
    tried_at = []
    while now[0] < 600:
        before = link.attempts
        with pytest.raises(SSHError):
            await link.run("true")
        if link.attempts > before:
            tried_at.append(now[0])
        now[0] += 2
    assert 7 <= len(tried_at) <= 11, tried_at
    assert all(sum(1 for t in tried_at if start <= t < start + 60) <= 2
               for start in range(60, 600, 2)), f"more than 2 a minute after the first: {tried_at}"
    [outage] = await events("ssh")
    assert outage.level == Event.Level.ERROR


def test_the_production_backoff_costs_at_most_two_logins_a_minute_over_ten_minutes():
    """The schedule itself, at both ends of its jitter: attempts at the waits' lower bounds
    (the most) and upper bounds."""
    backoff = Backoff()
    for pick in (lambda low, high: low, lambda low, high: high):
        times, failures = [0.0], 0
        while times[-1] < 600:
            failures += 1
            delay = min(backoff.initial_s * backoff.factor ** (failures - 1), backoff.maximum_s)
            times.append(times[-1] + pick(delay / 2, delay))
        in_ten_minutes = [t for t in times if t < 600]
        assert len(in_ten_minutes) <= 20, in_ten_minutes
        assert all(sum(1 for t in in_ten_minutes if s <= t < s + 60) <= 2
                   for s in range(60, 600)), in_ten_minutes
    assert all(1.0 <= backoff.wait(1) <= 2.0 for _ in range(50))
    assert all(150 <= backoff.wait(30) <= 300 for _ in range(50))


async def test_a_host_with_no_engine_yet_is_not_watched(ssh_machine):
    """Registered, or provisioning before its engine is configured: no transport, so the
    controller starts no watcher and nothing logs in."""
    machine = await Machine.objects.aget(pk=ssh_machine.pk)
    with pytest.raises(TransportError, match="no engine yet"):
        transport_for(machine)
    machine.state = Machine.State.PROVISIONING
    with pytest.raises(TransportError, match="no engine yet"):
        transport_for(machine)
    machine.engine_token = "configured"
    assert transport_for(machine) is not None
