"""The production recipe inside its sandbox: the shipped units' commands run as an unprivileged
service user (the units' `User=`), from a checkout that is a read-only bind mount (not even root
can write to it, as under `ProtectSystem=strict`), with only the units' `ReadWritePaths` — the
service user's home, which holds the data directory — writable to it. Through that deployment an
operator adds a machine served by the real sshd, provisions it (the engine's wheel is built and
uploaded by the dashboard process) and proves on it; afterwards no file of the service user
exists anywhere outside its writable directory."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, eventually, free_port, wait_for_http
from tests.vastmgr.deploy.test_production import environment, service_settings, unit_commands
from tests.vastmgr.remote.real_sshd import host_python, unavailable_reason
from tests.vastmgr.remote.served import Operator
from tests.vastmgr.remote.test_served_remote import host_form
from tests.vastmgr.served.test_faults import ADMIN, PASSWORD
from tests.vastmgr.served.test_scaleout import (
    DATABASE_URL,
    REDIS_URL,
    Process,
    any_exited,
    fresh_database,
    query,
    start_process,
)

UNITS = ("dashboard", "controller", "automation", "notifier")
WRITABLE = "/var/lib/vastmgr"  # the units' ReadWritePaths, the service user's home
REDIS_DB = 14  # a Redis database of its own: no other suite's groups see these pushes
START_TIMEOUT = 120

pytestmark = [
    pytest.mark.slow, pytest.mark.scaleout, pytest.mark.timeout(900),
    pytest.mark.skipif(not (DATABASE_URL and REDIS_URL),
                       reason="TEST_DATABASE_URL and TEST_REDIS_URL are unset (.ci/run starts "
                              "PostgreSQL and Redis and exports them)"),
    pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "-"),
    pytest.mark.skipif(shutil.which("mount") is None, reason="needs mount(8)"),
]


@dataclass
class Sandbox:
    """Where the service user's world lies: /opt/vastmgr (read-only), its venv, and its home."""

    root: Path
    user: str

    @property
    def checkout(self) -> Path:
        return self.root / "opt" / "vastmgr"

    @property
    def venv(self) -> Path:
        return self.root / "opt" / "venv"

    @property
    def python_home(self) -> Path:
        return self.root / "opt" / "python"

    @property
    def home(self) -> Path:
        return self.root / "var-lib-vastmgr"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid


def read_only_mount(source: Path, target: Path, mounts: list[Path]) -> None:
    """`source` bind-mounted at `target`, read-only to everyone (root included)."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    mounts.append(target)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)


def service_venv(venv: Path, python_home: Path) -> None:
    """A virtualenv the service user can run, of this very interpreter (mounted at
    `python_home`: it may live where the service user cannot reach, under /root for one), that
    sees this project's installed dependencies through a .pth file, with daphne's console
    script as pip writes it."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(python_home / "bin" / version), "-m", "venv", "--without-pip",
                    str(venv)], check=True, env={**os.environ, **python_env(python_home)})
    ours = next(p for p in map(Path, sys.path) if p.name == "site-packages" and
                (p / "daphne").is_dir())
    (venv / "lib" / version / "site-packages" / "project-dependencies.pth").write_text(
        f"{ours}\n")
    daphne = venv / "bin" / "daphne"
    daphne.write_text(f"#!{venv}/bin/python\nimport sys\nfrom daphne.cli import "
                      "CommandLineInterface\nsys.exit(CommandLineInterface.entrypoint())\n")
    daphne.chmod(0o755)


def python_env(python_home: Path) -> dict[str, str]:
    """The interpreter's shared library, from where it is mounted (its rpath names its
    original place)."""
    return {"LD_LIBRARY_PATH": str(python_home / "lib")}


def owned_outside(sandbox: Sandbox) -> list[str]:
    """Every file of the service user, changed since the sandbox was made, that is not under
    its writable directory: each mounted file system searched (a write into /tmp, /dev/shm, the
    checkout or the venv shows here; a user id reused from an earlier run's user does not)."""
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET,FSTYPE"], check=True,
                            capture_output=True, text=True).stdout.split("\n")
    roots = [line.split()[0] for line in mounts if line and line.split()[1] not in
             {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs",
              "securityfs", "pstore", "bpf", "fusectl", "configfs", "nsfs", "autofs"}]
    found = subprocess.run(["find", *roots, "-xdev", "-path", str(sandbox.home), "-prune",
                            "-o", "-user", sandbox.user, "-newer", str(sandbox.root / "made"),
                            "-print"],
                           capture_output=True, text=True, check=False).stdout
    return sorted(set(found.split()))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    root = Path(tempfile.mkdtemp(prefix="vastmgr-sandbox-"))
    root.chmod(0o755)  # pytest's own temporary directories are closed to other users
    box = Sandbox(root, f"vms{secrets.token_hex(3)}")
    (root / "made").touch()
    box.home.mkdir()
    subprocess.run(["useradd", "--system", "--home-dir", str(box.home), "--no-create-home",
                    "--shell", "/usr/sbin/nologin", "--user-group", box.user], check=True)
    mounts: list[Path] = []
    try:
        # As the install steps say: the data directory belongs to the service user; code and
        # venv to root. The checkout is this repository, mounted read-only.
        box.data.mkdir()
        for path in (box.home, box.data):
            os.chown(path, box.uid, box.uid)
        box.home.chmod(0o700)
        read_only_mount(REPO, box.checkout, mounts)
        read_only_mount(Path(sys.base_prefix), box.python_home, mounts)
        service_venv(box.venv, box.python_home)
        yield box
    finally:
        for entry in os.listdir("/proc"):  # whatever of the service user still runs
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == box.uid:
                        os.kill(int(entry), signal.SIGKILL)
                except (OSError, KeyError):
                    pass
        for mount in reversed(mounts):
            subprocess.run(["umount", str(mount)], check=False)
        subprocess.run(["userdel", box.user], check=False, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Dashboard:
    """What tests.vastmgr.remote.served.Operator drives: a base URL and a cookie-keeping
    opener."""

    url: str
    http: urllib.request.OpenerDirector


@pytest.fixture(scope="module")
def deployment(sandbox: Sandbox, sshd):
    for unit in UNITS:
        service = service_settings(f"vastmgr-{unit}.service")
        assert service["User"] == ["vastmgr"] and service["ProtectSystem"] == ["strict"]
        assert service["ReadWritePaths"] == [WRITABLE], service["ReadWritePaths"]
    venv_bin = str(sandbox.venv / "bin")
    port = free_port()
    processes: list[Process] = []
    as_service = {"user": sandbox.uid, "group": sandbox.uid, "extra_groups": []}
    logs = Path(tempfile.mkdtemp(prefix="vastmgr-sandbox-logs-"))
    with fresh_database() as database_url:
        env = environment(
            SECRET_KEY=secrets.token_urlsafe(50), DATABASE_URL=database_url,
            REDIS_URL=REDIS_URL.rsplit("/", 1)[0] + f"/{REDIS_DB}", ALLOWED_HOSTS="127.0.0.1",
            VASTMGR_HTTPS="0", VASTMGR_DATA_DIR=str(sandbox.data),
            VASTMGR_METRICS_TOKEN=secrets.token_urlsafe(24),
            DJANGO_SUPERUSER_PASSWORD=PASSWORD,
            # What systemd sets for User=, and no more: the code comes from the checkout.
            HOME=str(sandbox.home), USER=sandbox.user, LOGNAME=sandbox.user,
            PYTHONPATH=str(sandbox.checkout), **python_env(sandbox.python_home),
            # The host has no network: pip installs our wheel alone (see real_sshd.py).
            VASTMGR_PROVISION_PIP_ARGS="--no-index", VASTMGR_REMOTE_PYTHON=host_python() or "",
            VASTMGR_MIN_BENCH_RATE="0.01", VASTMGR_BENCH_KIND="winning-post",
            VASTMGR_BENCH_PROFILE="tiny", VASTMGR_BENCH_PROOFS="1")
        try:
            for argv in [*unit_commands("vastmgr-dashboard.service", "ExecStartPre", venv_bin),
                         [f"{venv_bin}/python", "manage.py", "createsuperuser", "--noinput",
                          "--username", ADMIN, "--email", "ops@example.com"]]:
                done = subprocess.run(argv, cwd=sandbox.checkout, env=env, capture_output=True,
                                      text=True, check=False, **as_service)
                assert done.returncode == 0, f"{argv}:\n{done.stdout}{done.stderr}"
            [dashboard] = unit_commands("vastmgr-dashboard.service", "ExecStart", venv_bin)
            dashboard[dashboard.index("8000")] = str(port)
            commands = [("dashboard", dashboard)] + [
                (unit, unit_commands(f"vastmgr-{unit}.service", "ExecStart", venv_bin)[0])
                for unit in UNITS[1:]]
            for name, argv in commands:
                processes.append(start_process(name, argv, env, logs, cwd=sandbox.checkout,
                                               **as_service))
            wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", START_TIMEOUT,
                          any_exited(processes))
            yield {"url": f"http://127.0.0.1:{port}", "database_url": database_url,
                   "processes": processes, "env": env}
        finally:
            for p in processes:
                p.stop()
            shutil.rmtree(logs, ignore_errors=True)


def test_the_services_provision_and_prove_as_the_service_user_writing_only_their_data(
        sandbox: Sandbox, deployment, sshd, client_key):
    database_url, processes = deployment["database_url"], deployment["processes"]

    def logs() -> str:
        events = "\n".join(m for (m,) in query(database_url, "SELECT message FROM fleet_event "
                                                             "ORDER BY id"))
        return "\n".join(f"--- {p.name} ---\n{p.output()[-2000:]}" for p in processes) + \
            f"\n--- events ---\n{events}"

    # Every service runs as the service user, none as root.
    assert {pwd.getpwuid(os.stat(f"/proc/{p.proc.pid}").st_uid).pw_name
            for p in processes} == {sandbox.user}, logs()
    operator = Operator(Dashboard(deployment["url"], urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor())))
    operator.login()

    # The operator's key, where the service user keeps its own files.
    key_file = sandbox.home / "id_ed25519"
    key_file.write_text(client_key.export_private_key().decode())
    key_file.chmod(0o600)
    os.chown(key_file, sandbox.uid, sandbox.uid)
    answer = operator.post("/remote/machines/add/", {
        **host_form("gpu-sandboxed", sshd.port, sshd.user, key_file), "then": "test"})
    assert "Connection test passed" in answer.body, answer.body[-3000:]
    [(machine,)] = query(database_url, "SELECT id FROM fleet_machine WHERE name = %s",
                         "gpu-sandboxed")

    answer = operator.post(f"/remote/machines/{machine}/provision/",
                           form=f"/remote/machines/{machine}/")
    assert answer.status == 200 and "provision started" in answer.body

    def running() -> bool:
        states = query(database_url, "SELECT state FROM fleet_machine WHERE id = %s", machine)
        errors = query(database_url, "SELECT message FROM fleet_event WHERE machine_id = %s "
                                     "AND level = 'error'", machine)
        assert not errors, logs()
        return states == [("running",)]

    eventually(running, 300, "the machine provisioned and benchmarked", logs, every=0.5)

    operator.post("/proofs/new/", {"machine": machine, "kind": "winning-post",
                                   "profile": "tiny", "seed": 5, "count": 2, "priority": ""})
    eventually(lambda: query(database_url, "SELECT status, verified, machine_id FROM "
                             "proofs_proofjob WHERE kind = 'winning-post' AND seed IN (5, 6)")
               == [("done", True, machine)] * 2, 180, "two proofs done and verified", logs)

    assert not any_exited(processes)(), logs()
    assert operator.server_errors() == []
    # The sandbox held: the checkout is untouched and nothing of the service user lies outside
    # its home (a wheel cached in /tmp, a byte-code cache, a pip cache elsewhere would show).
    assert owned_outside(sandbox) == []
