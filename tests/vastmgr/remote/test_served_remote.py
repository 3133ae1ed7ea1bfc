"""Remote machines as an operator drives them: the served stack (`manage.py up`), a real OpenSSH
server on loopback, every step pressed over HTTP with a session and CSRF tokens.

Add host → Provision → `running` with the engine live and one verified proof of each kind; the
actions a running host offers; a host that is down costs few SSH logins and no page 500s or
waits past its own timeout."""

from __future__ import annotations

import os
import signal

import asyncssh
import pytest

from tests.conftest import eventually, free_port
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache

from .real_sshd import host_python, real_sshd, unavailable_reason
from .served import (
    Operator,
    events_of,
    last_event,
    machine_id,
    start_stack,
    wait_event,
    wait_state,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KINDS = ("winning-post", "window-post", "snap-update", "porep-c2")


@pytest.fixture(scope="module")
def client_key():
    return asyncssh.generate_private_key("ssh-ed25519")


@pytest.fixture(scope="module")
def sshd(client_key):
    if reason := unavailable_reason():
        pytest.skip(reason)
    with real_sshd(client_key.export_public_key().decode().strip()) as server:
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, sshd):  # noqa: F811 - the fixture imported above
    # The host has no network: pip installs our wheel alone (the engine's dependencies are on
    # its PYTHONPATH, see real_sshd.py); one tiny benchmark proof gates it.
    stack = start_stack(tmp_path_factory.mktemp("served-remote"), param_cache, {
        "VASTMGR_PROVISION_PIP_ARGS": "--no-index", "VASTMGR_REMOTE_PYTHON": host_python(),
        "VASTMGR_MIN_BENCH_RATE": "0.01", "VASTMGR_BENCH_KIND": "winning-post",
        "VASTMGR_BENCH_PROFILE": "tiny", "VASTMGR_BENCH_PROOFS": "1"})
    yield stack
    if stack.up.poll() is None:
        stack.ctrl_c()
    for line in stack.leftovers():
        os.kill(int(line.split(":")[0]), signal.SIGKILL)


@pytest.fixture(scope="module")
def operator(stack):
    person = Operator(stack)
    person.login()
    yield person
    assert person.server_errors() == []


def job_ids_after(stack, known: set[str]) -> list[str]:
    return [r[0] for r in stack.query("SELECT id FROM proofs_proofjob") if r[0] not in known]


def test_add_host_and_provision_over_http(stack, operator, sshd, client_key, tmp_path):
    key_file = tmp_path / "id_ed25519"
    key_file.write_text(client_key.export_private_key().decode())
    key_file.chmod(0o600)
    name = "gpu-served"
    answer = operator.post("/remote/hosts/add/", {
        "name": name, "host": "127.0.0.1", "ssh_port": sshd.port, "ssh_user": sshd.user,
        "private_key": "", "key_file": str(key_file), "engine_port": free_port(),
        "engine_flavour": "", "price_per_hour": "0.5"})
    assert answer.status == 200 and "/remote/machines/" in answer.url, answer.body[:2000]
    machine = machine_id(stack, name)

    mark = last_event(stack)
    answer = operator.post(f"/remote/machines/{machine}/provision/",
                           form=f"/remote/machines/{machine}/")
    assert answer.status == 200, answer.body[:2000]
    wait_state(stack, machine, name, "running", after=mark)
    log = "\n".join(m for _, _, m in events_of(stack, machine))
    for step in ("provision requested by ops", "host requirements met", "engine started",
                 "engine is healthy", "parameters ready", "benchmarked → running"):
        assert step in log, log
    eventually(lambda: stack.query("SELECT connected FROM fleet_hoststatus WHERE machine_id = ?",
                                   machine) == [(1,)], 60, "the host is not shown live")

    # One proof of each kind, pinned to this host, done and verified by the dashboard.
    known = {r[0] for r in stack.query("SELECT id FROM proofs_proofjob")}
    for seed, kind in enumerate(KINDS, 1):
        operator.post("/proofs/new/", {"machine": machine, "kind": kind, "profile": "tiny",
                                       "seed": seed, "count": 1, "priority": ""})
    jobs = job_ids_after(stack, known)
    assert len(jobs) == len(KINDS)

    def all_final():
        rows = stack.query(f"SELECT status, verified, machine_id, kind FROM proofs_proofjob "
                           f"WHERE id IN ({','.join('?' * len(jobs))})", *jobs)
        return rows if all(r[0] in ("done", "failed", "cancelled") for r in rows) else None
    rows = eventually(all_final, 180, "the proofs did not finish")
    assert sorted(r[3] for r in rows) == sorted(KINDS)
    assert all(r[0] == "done" and r[1] == 1 and r[2] == machine for r in rows), rows
    wait_event(stack, machine, "proofs/h")
