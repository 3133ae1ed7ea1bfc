"""Provisioning pieces: host requirements checked first on the real OpenSSH server, the wheel
rebuilt when the sources change, the engine free of dashboard dependencies, a command on many
hosts. The whole provisioning flow, pressed over HTTP on the served stack, is in
test_served_remote.py."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from tests.conftest import free_port
from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import ProvisionError, SettingsError
from vastmgr.remote import provision
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import RemoteMachine, Secret
from vastmgr.remote.provision import (
    Provisioner,
    ProvisionPlan,
    build_wheel,
    run_on_machines,
    wheel_dependencies,
)
from vastmgr.remote.ssh import Backoff, LinkPool, MachineLink

from .real_sshd import copy_sources, real_sshd, unavailable_reason

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


async def test_missing_host_requirements_are_one_event_naming_each_fix(client_key):
    if reason := unavailable_reason():
        pytest.skip(reason)
    with real_sshd(client_key.export_public_key().decode().strip(),
                   allow_tcp_forwarding=False) as host:
        machine = await Machine.objects.acreate(
            name="old-image", host="127.0.0.1", ssh_port=host.port, ssh_user=host.user,
            engine_port=free_port())
        remote = await sync_to_async(RemoteMachine.for_machine)(machine)
        await sync_to_async(Secret.store)(remote.ssh_key_secret_name,
                                          client_key.export_private_key().decode())
        # An image whose python3 is 3.10 (Ubuntu 22.04), on a server without forwarding.
        old_python = host.home / "python3.10"
        old_python.write_text("#!/bin/sh\necho 3.10\nexit 1\n")
        old_python.chmod(0o755)
        link = MachineLink(machine.pk)
        try:
            for python, complaint in ((str(old_python), "is Python 3.10; the engine needs >= 3.11"),
                                      ("/opt/no-python-here", "no Python at")):
                plan = ProvisionPlan(remote_python=python)
                with pytest.raises(ProvisionError, match="requirements"):
                    await Provisioner(machine.pk, plan=plan, link=link).provision()
                failure = await Event.objects.filter(level=Event.Level.ERROR).alatest("id")
                assert complaint in failure.message and "VASTMGR_REMOTE_PYTHON" in failure.message
                assert "AllowTcpForwarding yes" in failure.message
                assert (await Event.objects.filter(level=Event.Level.ERROR).acount()) == \
                    (1 if python == str(old_python) else 2), "one Event per attempt"
        finally:
            await link.close()
        machine = await Machine.objects.aget(pk=machine.pk)
        assert machine.state == Machine.State.REGISTERED, "nothing was installed"
        assert not (host.home / "vastmgr-engine" / "venv").exists()


async def test_the_wheel_is_rebuilt_when_a_source_changes_and_not_otherwise(tmp_path):
    root, wheels = copy_sources(tmp_path / "src"), tmp_path / "wheels"
    first = await build_wheel(root, wheels)
    assert await build_wheel(root, wheels) == first, "unchanged sources: the same wheel"
    dependencies = wheel_dependencies(first)
    module = root / "cuzk_engine" / "daemon" / "app.py"
    module.write_text(module.read_text() + "\n# an edit\n")
    second = await build_wheel(root, wheels)
    assert second != first and second.exists()
    assert not first.exists(), "an older sources' wheel is not kept"
    assert wheel_dependencies(second) == dependencies
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '"prometheus-client>=0.21,<1",', '"prometheus-client>=0.21,<1",\n    "tomli>=2",'))
    assert wheel_dependencies(await build_wheel(root, wheels)) != dependencies


READ_ONLY_BUILD = """
import asyncio, sys
from pathlib import Path
import django
django.setup()
from vastmgr.remote.provision import build_wheel
print(asyncio.run(build_wheel(Path(sys.argv[1]))))
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs root and unshare(1) to mount the checkout read-only")
def test_the_wheel_builds_from_a_read_only_checkout(tmp_path):
    """Production runs the services with the checkout read-only (`ProtectSystem=strict`, only
    the data directory writable): provisioning builds the engine's wheel all the same. The
    checkout is a read-only bind mount here, which not even root can write to."""
    checkout = copy_sources(tmp_path / "checkout")
    data = tmp_path / "data"
    data.mkdir()
    before = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    mount = (f"mount --bind {checkout} {checkout} && mount -o remount,bind,ro {checkout} && "
             f'cd {checkout} && exec "$0" -c "$1" {checkout}')
    built = subprocess.run(
        ["unshare", "--mount", "sh", "-c", mount, sys.executable, READ_ONLY_BUILD],
        check=False, capture_output=True, text=True, timeout=300,
        env={**os.environ, "VASTMGR_DATA_DIR": str(data), "TMPDIR": str(data),
             "DJANGO_SETTINGS_MODULE": "vastmgr.settings"})
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert wheel.name.startswith("vastmgr-") and wheel.exists()
    assert wheel.is_relative_to(data / "wheels"), "kept in the data directory"
    assert sorted(p.relative_to(checkout) for p in checkout.rglob("*")) == before


def test_the_engine_imports_none_of_the_dashboard_dependencies():
    """A GPU host installs the base dependencies only: no engine module may need more."""
    probe = (
        "import importlib, pkgutil, sys, cuzk_engine\n"
        "for m in pkgutil.walk_packages(cuzk_engine.__path__, 'cuzk_engine.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'django', 'channels', "
        "'daphne', 'channels_redis', 'asyncssh', 'psycopg', 'dj_database_url', 'cryptography', "
        "'whitenoise', 'twisted', 'redis', 'vastmgr'}))\n")
    result = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(provision.REPO_ROOT)},
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_a_command_runs_on_many_hosts_with_streamed_output_and_an_audit_event(
        fake_host, ssh_machine, client_key):
    down = await Machine.objects.acreate(name="down", host="127.0.0.1", ssh_port=free_port())
    await sync_to_async(Secret.store)(f"ssh_key:{down.pk}", client_key.export_private_key().decode())
    lines = []

    async def on_line(machine_id, line):
        lines.append((machine_id, line))

    statuses = await run_on_machines([ssh_machine.pk, down.pk], "echo up; uname -s", user="ops",
                                  on_line=on_line, pool=LinkPool(backoff=Backoff(attempts=1)))

    assert statuses[ssh_machine.pk] == 0 and statuses[down.pk] == 255
    assert (ssh_machine.pk, "up") in lines
    assert any(m == down.pk and "cannot connect" in line for m, line in lines)
    audit = await Event.objects.filter(kind="command").aget()
    assert "ops ran 'echo up; uname -s' on 2 host(s)" in audit.message
    assert audit.level == Event.Level.WARNING


HOSTCTL = Path(provision.__file__).with_name("hostctl.py")


def hostctl(command: str, base: Path, port: int, *options: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, str(HOSTCTL), command, "--base", str(base),
                             "--port", str(port), *options],
                            check=False, capture_output=True, text=True, timeout=60)
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def stubborn_engine(tmp_path):
    """An install whose 'engine' ignores SIGTERM, with a child that ignores it too."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/bash\ntrap '' TERM\nsleep 600 &\nsleep 600\n")
    python.chmod(0o755)
    return tmp_path


def test_stop_kills_what_outlives_the_drain_bound_and_checks_nothing_is_left(stubborn_engine):
    port = free_port()
    status, started = hostctl("start", stubborn_engine, port, "--instance", "i1")
    assert status == 0 and started["started"]
    pid = started["pid"]
    assert int((stubborn_engine / "engine.pid").read_text()) == pid
    assert hostctl("status", stubborn_engine, port)[1]["alive"]

    status, stopped = hostctl("stop", stubborn_engine, port, "--grace", "1")

    assert status == 0, stopped
    assert stopped == {"stopped": True, "pid": pid, "escalated": True, "remaining": [],
                       "port_in_use": False}
    assert not (stubborn_engine / "engine.pid").exists()
    assert hostctl("status", stubborn_engine, port)[1] == {
        "pid": None, "alive": False, "port_in_use": False}


def test_a_port_held_by_something_else_blocks_start_and_is_reported_by_stop(stubborn_engine):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        status, started = hostctl("start", stubborn_engine, port, "--instance", "i2")
        assert status == 1 and started == {
            "started": False, "error": f"port {port} is still in use on the host"}
        status, stopped = hostctl("stop", stubborn_engine, port, "--grace", "1")
        assert status == 1 and stopped["stopped"] is False and stopped["port_in_use"] is True


def test_the_benchmark_is_configurable_and_a_bad_kind_stops_start_up(monkeypatch):
    plan = ProvisionPlan.from_settings(RemoteSettings.load())
    assert (plan.bench_kind, plan.bench_profile, plan.bench_proofs) == ("porep-c2", "small", 2)
    assert ("porep-c2", "small") in plan.param_sets, "its parameters are set up too"
    monkeypatch.setenv("VASTMGR_BENCH_KIND", "window-post")
    monkeypatch.setenv("VASTMGR_BENCH_PROFILE", "tiny")
    monkeypatch.setenv("VASTMGR_BENCH_PROOFS", "5")
    plan = ProvisionPlan.from_settings(RemoteSettings.load())
    assert (plan.bench_kind, plan.bench_profile, plan.bench_proofs) == ("window-post", "tiny", 5)
    monkeypatch.setenv("VASTMGR_BENCH_KIND", "fast-post")
    with pytest.raises(SettingsError, match="VASTMGR_BENCH_KIND='fast-post' is not one of"):
        RemoteSettings.load()
