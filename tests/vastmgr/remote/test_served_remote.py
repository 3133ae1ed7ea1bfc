"""Remote machines as an operator drives them: the served stack (`manage.py up`: daphne, the
fleet controller, the automation, a local engine), a real OpenSSH server on loopback with a
bash login shell, every step pressed over HTTP with a session and CSRF tokens.

The life of a host (add and test connection, provision, a verified proof of each kind, log,
command, stop/start, restart during a proof, upgrade, crash revival, an outage, a changed host
key, destroy, its name reused), the SSH logins it costs (counted in sshd's own log), and an
unreachable host whose pages answer within their timeouts. No answer is ever a 5xx (checked
for every request at the end)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.conftest import eventually, free_port
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache

from .real_sshd import RealSSHD, host_python
from .served import (
    Operator,
    events_of,
    last_event,
    machine_id,
    machine_state,
    served_stack,
    wait_event,
    wait_state,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KINDS = ("winning-post", "window-post", "snap-update", "porep-c2")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, sshd):  # noqa: F811 - the fixture imported above
    # The host has no network: pip installs our wheel alone (the engine's dependencies are on
    # its PYTHONPATH, see real_sshd.py); one tiny benchmark proof gates it.
    yield from served_stack(tmp_path_factory.mktemp("served-remote"), param_cache, {
        "VASTMGR_PROVISION_PIP_ARGS": "--no-index", "VASTMGR_REMOTE_PYTHON": host_python(),
        "VASTMGR_MIN_BENCH_RATE": "0.01", "VASTMGR_BENCH_KIND": "winning-post",
        "VASTMGR_BENCH_PROFILE": "tiny", "VASTMGR_BENCH_PROOFS": "1"})


def logins(sshd: RealSSHD) -> int:
    return sshd.log().count("Accepted publickey")


def connections(sshd: RealSSHD) -> int:
    return sshd.log().count("Connection from 127.0.0.1")


def engine_processes(sshd: RealSSHD) -> list[str]:
    return [p for p in sshd.user_processes() if " sshd:" not in f" {p.split(' ', 1)[1]}"]


def engine_pid(sshd: RealSSHD) -> int | None:
    pid_file = sshd.home / "vastmgr-engine" / "engine.pid"
    return int(pid_file.read_text()) if pid_file.exists() else None


def shown_live(stack, machine: int) -> bool:
    return stack.query("SELECT connected FROM fleet_machinestatus WHERE machine_id = ?",
                       machine) == [(1,)]


def wait_live(stack, machine: int, timeout: float = 60) -> None:
    eventually(lambda: shown_live(stack, machine), timeout, "the host is not shown live")


def host_form(name: str, port: int, user: str, key_file, **extra) -> dict:
    return {"name": name, "host": "127.0.0.1", "ssh_port": port, "ssh_user": user,
            "private_key": "", "key_file": str(key_file), "engine_port": free_port(),
            "engine_flavour": "", "price_per_hour": "0.5", **extra}


def prove(stack, operator: Operator, machine: int, kinds, seed: int) -> list[str]:
    known = {r[0] for r in stack.query("SELECT id FROM proofs_proofjob")}
    for n, kind in enumerate(kinds):
        operator.post("/proofs/new/", {"machine": machine, "kind": kind, "profile": "tiny",
                                       "seed": seed + n, "count": 1, "priority": ""})
    jobs = [r[0] for r in stack.query("SELECT id FROM proofs_proofjob") if r[0] not in known]
    assert len(jobs) == len(kinds)
    return jobs


def all_final(stack, jobs: list[str], timeout: float = 180) -> list[tuple]:
    def final():
        rows = stack.query(f"SELECT status, verified, machine_id, kind FROM proofs_proofjob "
                           f"WHERE id IN ({','.join('?' * len(jobs))})", *jobs)
        return rows if all(r[0] in ("done", "failed", "cancelled") for r in rows) else None
    return eventually(final, timeout, "the proofs did not finish")


def test_an_unreachable_host_answers_every_page_within_its_timeout(stack, operator, key_file):
    answer = operator.post("/remote/machines/add/", {
        **host_form("gpu-nowhere", 1, "prover", key_file), "then": "test"})
    assert answer.status == 200 and "/remote/machines/" in answer.url
    assert "Connection test failed" in answer.body and "cannot connect" in answer.body
    assert answer.seconds < 10, answer.seconds
    machine = machine_id(stack, "gpu-nowhere")
    page = operator.get(f"/remote/machines/{machine}/").body
    # Registered: Provision is offered; the engine's actions are disabled, each saying why.
    assert re.search(r'<button>Provision</button>', page)
    assert re.search(r'<button disabled title="Stop engine: not provisioned yet', page)
    assert "Restart engine: not provisioned yet: Provision it first" in page

    # No engine yet: its log is not fetched (no SSH at all), and not polled.
    answer = operator.get(f"/remote/machines/{machine}/log/")
    assert answer.status == 200 and "no engine log yet" in answer.body
    assert "hx-get" not in answer.body and answer.seconds < 2

    # A command with a 5 s timeout answers in about that at most, with the host's error and
    # an audit Event saying who ran what.
    answer = operator.post("/remote/machines/command/", {
        "machines": [machine], "command": "uptime", "timeout": 5})
    assert answer.status == 200 and answer.seconds < 7, (answer.status, answer.seconds)
    result = answer.body.split(f'id="command-{machine}"')[1]
    assert ">unreachable<" in result and "cannot connect" in result
    assert stack.events("ops ran 'uptime' on 1 host(s): gpu-nowhere=255")

    # What the form refuses, each with its reason; nothing is saved.
    for fields, reason in (
            ({"key_file": ""}, "the SSH private key is missing"),
            ({"key_file": "/nonexistent/key"}, "No such file or directory"),
            ({"price_per_hour": "9999.9999"}, "less than or equal to 100"),
            ({"host": ""}, "This field is required"),
            ({"name": "gpu-nowhere"}, "a machine with this name exists")):
        answer = operator.post("/remote/machines/add/", {
            **host_form("gpu-refused", 1, "prover", key_file), **fields})
        assert answer.status == 200 and reason in answer.body, (fields, answer.body[-3000:])
    assert not stack.query("SELECT id FROM fleet_machine WHERE name = 'gpu-refused'")


def test_the_life_of_an_ssh_host_over_http(stack, operator, sshd, key_file):
    name = "gpu-served"
    answer = operator.post("/remote/machines/add/", {
        **host_form(name, sshd.port, sshd.user, key_file), "then": "test"})
    assert answer.status == 200 and "Connection test passed" in answer.body, answer.body[-3000:]
    machine = machine_id(stack, name)
    pinned = stack.query("SELECT ssh_host_key FROM fleet_machine WHERE id = ?", machine)[0][0]
    assert pinned == sshd.host_public_key("ed25519")

    # Registered, no engine yet: the controller does not watch it, so nothing logs in.
    before = logins(sshd)
    time.sleep(6)  # three of the old 2 s retries
    assert logins(sshd) == before, "a host with no engine yet is not watched"

    started = time.monotonic()
    mark = last_event(stack)
    answer = operator.post(f"/remote/machines/{machine}/provision/",
                           form=f"/remote/machines/{machine}/")
    assert answer.status == 200 and "provision started" in answer.body
    wait_state(stack, machine, name, "running", after=mark)
    provision_s = time.monotonic() - started
    log = "\n".join(m for _, _, m in events_of(stack, machine))
    for step in ("provision requested by ops", "host requirements met", "engine started",
                 "engine is healthy", "parameters ready", "proofs/h", "benchmarked → running"):
        assert step in log, log
    wait_live(stack, machine)

    # One proof of each kind, pinned to this host, done and verified by the dashboard.
    rows = all_final(stack, prove(stack, operator, machine, KINDS, 1))
    assert sorted(r[3] for r in rows) == sorted(KINDS)
    assert all(r[0] == "done" and r[1] == 1 and r[2] == machine for r in rows), rows

    # The log, polled, and a command: over the connections already open.
    before = logins(sshd)
    for _ in range(3):
        answer = operator.get(f"/remote/machines/{machine}/log/")
        assert "engine listening on" in answer.body and 'delay:5s' in answer.body
    answer = operator.post("/remote/machines/command/", {
        "machines": [machine], "command": "echo $0 $(whoami)", "timeout": 30})
    result = answer.body.split(f'id="command-{machine}"')[1]
    assert "exit status 0" in result and f"bash {sshd.user}" in result
    assert logins(sshd) == before

    # Stop, then Start from `stopped`; each button only where the state allows it.
    first_pid = engine_pid(sshd)
    mark = last_event(stack)
    operator.post(f"/remote/machines/{machine}/stop/", form=f"/remote/machines/{machine}/")
    wait_state(stack, machine, name, "stopped", after=mark)
    assert engine_processes(sshd) == []
    page = operator.get(f"/remote/machines/{machine}/").body
    assert "Restart engine: the engine is stopped: Start it" in page
    mark = last_event(stack)
    operator.post(f"/remote/machines/{machine}/start/", form=f"/remote/machines/{machine}/")
    wait_state(stack, machine, name, "running", after=mark)
    wait_live(stack, machine)
    assert engine_pid(sshd) not in (None, first_pid)

    # Restart during a proof: the old engine drains it, the new one starts after.
    [job] = prove(stack, operator, machine, ["porep-c2"], 41)
    eventually(lambda: stack.jobs([job]) and next(iter(stack.jobs([job]).values()))[0]
               == "running", 60, "the proof never ran", every=0.1)
    second_pid = engine_pid(sshd)
    mark = last_event(stack)
    operator.post(f"/remote/machines/{machine}/restart/", form=f"/remote/machines/{machine}/")
    wait_event(stack, machine, "engine is healthy", after=mark)
    [row] = all_final(stack, [job])
    assert row[0] == "done" and row[1] == 1, row
    assert engine_pid(sshd) not in (None, second_pid)
    wait_live(stack, machine)

    # Upgrade: the same wheel, only the project reinstalled.
    mark = last_event(stack)
    operator.post(f"/remote/machines/{machine}/upgrade/", form=f"/remote/machines/{machine}/")
    wait_event(stack, machine, "upgraded: engine", after=mark, timeout=180)
    assert not [e for e in events_of(stack, machine, mark) if e[1] == "error"]
    wait_live(stack, machine)

    # The engine crashes: the host stays reachable, so its link stays open (no login while
    # the controller retries the engine) until the automation restarts it.
    crashed = engine_pid(sshd)
    before = logins(sshd)
    mark = last_event(stack)
    os.killpg(crashed, signal.SIGKILL)
    wait_event(stack, machine, f"the engine (pid {crashed}) is not running: restarting it",
               after=mark, timeout=90)
    wait_event(stack, machine, "engine is healthy", after=mark)
    wait_live(stack, machine)
    revive_logins = logins(sshd) - before
    assert revive_logins <= 1, "the automation's own connection, at most"

    # An outage: sshd down, every connection cut. One error Event, one when it is back; every
    # page answers meanwhile, within its timeout.
    mark = last_event(stack)
    sshd.stop()
    sshd.drop_sessions()
    wait_event(stack, machine, "cannot connect", after=mark, timeout=30)
    for path in (f"/remote/machines/{machine}/", f"/remote/machines/{machine}/log/",
                 f"/machines/{machine}/", "/"):
        answer = operator.get(path)
        assert answer.status == 200 and answer.seconds < 12, (path, answer.seconds)
    log_answer = operator.get(f"/remote/machines/{machine}/log/")
    assert "log unavailable" in log_answer.body and "next attempt at" in log_answer.body
    sshd.start()
    wait_live(stack, machine, timeout=30)
    outage = [(level, message) for _, level, message in events_of(stack, machine, mark)
              if "SSH connection back" in message or "cannot connect" in message]
    assert [level for level, _ in outage] == ["error", "info"], outage

    # Reinstalled behind our back: another host key. Every attempt is refused (one Event),
    # and a host that keeps failing is tried ever more rarely: at most 5 connections in 30 s
    # from every process together (the old 2 s retries made 15).
    sshd.stop()
    sshd.drop_sessions()
    sshd.new_host_keys()
    sshd.start()
    mark = last_event(stack)
    wait_event(stack, machine, "host key changed", after=mark, timeout=30)
    tried = connections(sshd)
    time.sleep(30)
    key_change_connections = connections(sshd) - tried
    assert key_change_connections <= 5, key_change_connections
    operator.post(f"/remote/machines/{machine}/provision/", form=f"/remote/machines/{machine}/")
    time.sleep(2)
    assert machine_state(stack, name) == "running"
    errors = [m for _, level, m in events_of(stack, machine, mark) if level == "error"]
    assert len(errors) == 1 and "host key changed" in errors[0], errors

    # The operator trusts the new key; destroy stops the engine and kills the machine.
    operator.post(f"/remote/machines/{machine}/clear-host-key/",
                  form=f"/remote/machines/{machine}/")
    answer = operator.post(f"/remote/machines/{machine}/destroy/",
                           form=f"/remote/machines/{machine}/")
    assert answer.status == 200
    assert stack.query("SELECT state, kill_reason FROM fleet_machine WHERE id = ?",
                       machine) == [("killed", "destroyed by ops")]
    assert engine_processes(sshd) == [] and engine_pid(sshd) is None

    # Its name is free again.
    answer = operator.post("/remote/machines/add/", host_form(name, sshd.port, sshd.user,
                                                           key_file))
    assert answer.status == 200 and machine_id(stack, name) != machine
    print(f"provision {provision_s:.0f} s; log page of a host that is down: "
          f"{log_answer.seconds:.2f} s; logins during a crash revival: {revive_logins}; "
          f"connections in 30 s to a host refusing our key: {key_change_connections}")
