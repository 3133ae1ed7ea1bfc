"""Provisioning a host over its SSH link: requirements, wheel, venv, engine config, detached
start, health, parameters, benchmark; plus stop/start/restart/upgrade, log tail and commands on
many hosts. The engine is started and stopped on the host by hostctl.py.

Every step is an Event on the machine; a failing step returns the machine to `registered`
with the step's message (never a secret) so the operator can fix the host and try again.
"""

import asyncio
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from asgiref.sync import sync_to_async
from django.conf import settings

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.errors import CuzkError
from cuzk_engine.vocabulary import KINDS, TERMINAL_STATUSES
from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import ProvisionError, SSHError, VerificationError
from vastmgr.proofs.verify import reverify
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import REVIVE_EVENT, REVIVE_TRIES, Automation, engines_to_revive
from vastmgr.remote.models import RemoteMachine
from vastmgr.remote.ssh import LinkPool, MachineLink

REPO_ROOT = Path(__file__).resolve().parents[2]
Progress = Callable[[str, str], Awaitable[None]]


@dataclass(frozen=True)
class ProvisionPlan:
    kinds: tuple[str, ...] = KINDS
    profile: str = "tiny"
    bench_kind: str = "porep-c2"
    bench_profile: str = "small"
    bench_proofs: int = 2
    remote_python: str = "python3"
    # Extra `pip install` arguments, e.g. ("--no-index", "--find-links", "...") offline.
    pip_args: tuple[str, ...] = ()
    health_timeout_s: float = 120
    step_timeout_s: float = 3600
    # How long Stop lets running proofs finish before the engine is killed.
    stop_grace_s: float = 120
    min_free_disk_mb: int = 1024

    @classmethod
    def from_settings(cls, settings: RemoteSettings) -> "ProvisionPlan":
        return cls(pip_args=settings.provision_pip_args, remote_python=settings.remote_python,
                   bench_kind=settings.bench_kind, bench_profile=settings.bench_profile,
                   bench_proofs=settings.bench_proofs)

    @property
    def param_sets(self) -> list[tuple[str, str]]:
        """(kind, profile) pairs to set up: every kind for test proofs, and the benchmark's."""
        sets = [(kind, self.profile) for kind in self.kinds]
        if (self.bench_kind, self.bench_profile) not in sets:
            sets.append((self.bench_kind, self.bench_profile))
        return sets


SOURCE_ROOT = REPO_ROOT
_WHEEL_SOURCES = ("pyproject.toml", "README.md", "cuzk_engine", "vastmgr")
_wheel_lock = asyncio.Lock()


def source_digest(root: Path) -> str:
    """A hash of everything that goes into the wheel, so an edited source builds a new one."""
    digest = hashlib.sha256()
    for name in _WHEEL_SOURCES:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts or file.suffix in {".pyc", ".so", ".o"}:
                continue
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def copy_wheel_sources(root: Path, into: Path) -> None:
    """What goes into the wheel, copied: setuptools writes `build/` and `*.egg-info` beside the
    sources it builds, and the production checkout is read-only to the services (their units
    make only the data directory writable), so the wheel is never built in the checkout."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "*.egg-info", "build")
    into.mkdir(parents=True, exist_ok=True)
    for name in _WHEEL_SOURCES:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=skip)
        else:
            shutil.copy2(source, into / name)


async def build_wheel(root: Path | None = None, into: Path | None = None) -> Path:
    """The project's wheel (`pip wheel --no-deps`), rebuilt whenever its sources changed and
    kept under their digest in `into` (the data directory's `wheels/`), so a restarted process
    reuses it. The production units let the services write to the data directory only (their
    /tmp is private, emptied at every restart): the copy of the sources, pip's own temporary
    files and the wheel all stay in `into`, and nothing is written into `root`. A write that
    fails there (a full disk, say) is a ProvisionError naming the directory."""
    root = root or SOURCE_ROOT
    into = into or settings.DATA_DIR / "wheels"
    async with _wheel_lock:
        key = await asyncio.to_thread(source_digest, root)
        if built := min((into / key).glob("vastmgr-*.whl"), default=None):
            return built
        try:
            into.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=into, prefix=f".build-{key}-") as build:
                await asyncio.to_thread(copy_wheel_sources, root, Path(build) / "src")
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                    f"{build}/{key}", f"{build}/src", stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": build})
                output, _ = await proc.communicate()
                if proc.returncode or not any(Path(build, key).glob("vastmgr-*.whl")):
                    tail = output.decode(errors="replace").strip().splitlines()[-3:]
                    raise ProvisionError("build wheel", " / ".join(tail) or "pip wheel failed")
                await asyncio.to_thread(_keep_only, into, Path(build) / key)
        except OSError as exc:
            raise ProvisionError("build wheel", f"cannot write to {into}: "
                                                f"{exc.strerror or exc}") from exc
        return min((into / key).glob("vastmgr-*.whl"))


def _keep_only(into: Path, built: Path) -> None:
    """`built` moved into `into` as its only wheel: older sources' wheels are never sent again."""
    for old in into.iterdir():
        if old.is_dir() and not old.name.startswith("."):
            shutil.rmtree(old)
    built.rename(into / built.name)


def wheel_dependencies(wheel: Path) -> str:
    """A hash of the wheel's base requirements (extras excluded: hosts install none)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    requires = sorted(line for line in metadata.splitlines()
                      if line.startswith("Requires-Dist:") and "extra ==" not in line)
    return hashlib.sha256("\n".join(requires).encode()).hexdigest()[:16]


def engine_toml(port: int, token: str, param_cache: str) -> str:
    return (f'[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{token}"\n\n'
            f'[srs]\nparam_cache = "{param_cache}"\n')


HOSTCTL_SOURCE = (Path(__file__).parent / "hostctl.py").read_text()


class Provisioner:
    def __init__(self, machine_id: int, *, plan: ProvisionPlan | None = None,
                 link: MachineLink | None = None, automation: Automation | None = None,
                 progress: Progress | None = None):
        self.machine_id = machine_id
        self.automation = automation or Automation()
        self.plan = plan or ProvisionPlan.from_settings(self.automation.settings)
        self.link = link or MachineLink(machine_id)
        self._progress = progress
        self.base = ""
        self.relative = ""
        self.instance_id = ""

    # -------------------------------------------------------------------- helpers

    async def _machine(self) -> Machine:
        return await Machine.objects.aget(pk=self.machine_id)

    async def _event(self, message: str, level=Event.Level.INFO, *, kind: str = "provision",
                     **data) -> None:
        machine = await self._machine()
        await sync_to_async(Event.record)(kind, f"{machine.name}: {message}",
                                          machine=machine, level=level, data=data)

    async def _say(self, step: str, line: str) -> None:
        if self._progress:
            await self._progress(step, line)

    async def _sh(self, step: str, command: str, *, stream: bool = False) -> str:
        if stream:
            lines: list[str] = []

            async def on_line(_stream, line):
                lines.append(line)
                await self._say(step, line)
            status = await self.link.stream(command, on_line, timeout=self.plan.step_timeout_s)
            output = "\n".join(lines)
        else:
            result = await self.link.run(command, timeout=self.plan.step_timeout_s)
            status, output = result.exit_status, (result.stdout + result.stderr)
        if status != 0:
            tail = " / ".join(output.strip().splitlines()[-3:]) or "no output"
            raise ProvisionError(step, f"exit status {status}: {tail}")
        return output

    async def _locate(self) -> None:
        remote = await RemoteMachine.objects.aget_or_create(machine_id=self.machine_id)
        home = (await self._sh("connect", "pwd")).strip()
        self.relative = remote[0].remote_dir
        self.base = f"{home}/{self.relative}"

    @property
    def venv_python(self) -> str:
        return f"{self.base}/venv/bin/python"

    async def _hostctl(self, step: str, command: str, *, python: str | None = None,
                       timeout: float = 60, **options) -> dict:
        """Run hostctl.py (sent as source) on the host; its JSON answer."""
        machine = await self._machine()
        args = [python or self.venv_python, "-c", HOSTCTL_SOURCE, command,
                "--base", self.base, "--port", str(machine.engine_port)]
        for name, value in options.items():
            args += [f"--{name}", str(value)]
        result = await self.link.run(" ".join(shlex.quote(a) for a in args), timeout=timeout)
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            tail = " / ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
            raise ProvisionError(step, f"host control failed (exit status "
                                       f"{result.exit_status}): {tail or 'no output'}") from None

    # -------------------------------------------------------------------- steps

    async def provision(self) -> float:
        """Run every step; return the benchmark rate (proofs per hour).

        The host is reached and its requirements checked before the machine changes state, so
        an unreachable host (or one whose key changed) keeps the state it had.
        """
        step = "connect"
        try:
            await self._locate()
            step = "requirements"
            await self.check_requirements()
        except SSHError as exc:
            raise ProvisionError(step, str(exc), recorded=True) from None  # by the link
        except (ProvisionError, OSError) as exc:
            message = str(exc) if isinstance(exc, ProvisionError) else f"{step}: {exc}"
            await self._fail(message)
            raise ProvisionError(step, str(exc), recorded=True) from None
        machine = await self._machine()
        if machine.state != Machine.State.PROVISIONING:
            await sync_to_async(machine.transition)(Machine.State.PROVISIONING)
        try:
            step = "install"
            await self.install()
            step = "start"
            await self.start()
            step = "health"
            await self.wait_healthy()
            step = "parameters"
            await self.generate_params()
            await sync_to_async((await self._machine()).transition)(Machine.State.PARAMS_READY)
            step = "benchmark"
            rate = await self.benchmark()
        except (ProvisionError, SSHError, CuzkError, OSError, aiohttp.ClientError) as exc:
            message = str(exc) if isinstance(exc, ProvisionError) else f"{step}: {exc}"
            await self._fail(message)
            raise ProvisionError(step, str(exc), recorded=True) from None
        if await self.automation.benchmark_done(self.machine_id, rate):
            await sync_to_async((await self._machine()).transition)(Machine.State.RUNNING)
        return rate

    async def _fail(self, message: str) -> None:
        await self._event(f"provisioning failed at {message}", Event.Level.ERROR)
        await RemoteMachine.objects.filter(machine_id=self.machine_id).aupdate(last_error=message)
        machine = await self._machine()
        step_back: dict[str, str] = {Machine.State.PROVISIONING: Machine.State.REGISTERED,
                                     Machine.State.PARAMS_READY: Machine.State.PROVISIONING}
        target = step_back.get(machine.state)
        if target:
            await sync_to_async(machine.transition)(target, reason=message)

    async def check_requirements(self) -> None:
        """Python >= 3.11 with venv, free disk, TCP forwarding: all missing ones in one error."""
        python = self.plan.remote_python
        missing = []
        probe = await self.link.run(
            f"{shlex.quote(python)} -c "
            + shlex.quote("import sys; print('%d.%d' % sys.version_info[:2]); "
                          "import venv, ensurepip"), timeout=60)
        version = probe.stdout.strip().splitlines()[0] if probe.stdout.strip() else ""
        fix_python = ("install Python 3.11 or newer with its venv module (Debian/Ubuntu: "
                      "apt install python3.11 python3.11-venv) or set VASTMGR_REMOTE_PYTHON "
                      "to such an interpreter on the host")
        if not version:
            missing.append(f"no Python at {python!r} ({fix_python})")
        elif tuple(int(p) for p in version.split(".")) < (3, 11):
            missing.append(f"{python} is Python {version}; the engine needs >= 3.11 "
                           f"({fix_python})")
        elif not probe.ok:
            missing.append(f"{python} {version} has no venv/ensurepip module (Debian/Ubuntu: "
                           f"apt install python{version}-venv)")
        disk = await self.link.run("df -Pk . | tail -n 1", timeout=30)
        try:
            free_mb = int(disk.stdout.split()[3]) // 1024
        except (IndexError, ValueError):
            free_mb = None
        if free_mb is not None and free_mb < self.plan.min_free_disk_mb:
            missing.append(f"only {free_mb} MB free in the login directory; provisioning needs "
                           f"{self.plan.min_free_disk_mb} MB (free some space or grow the disk)")
        machine = await self._machine()
        if not await self.link.can_forward(machine.engine_port):
            missing.append("the SSH server refuses TCP forwarding, which the dashboard needs to "
                           "reach the engine (set AllowTcpForwarding yes in sshd_config and "
                           "reload sshd)")
        if missing:
            raise ProvisionError("requirements", "; ".join(missing))
        await self._event(f"host requirements met (Python {version}, "
                          f"{free_mb if free_mb is not None else '?'} MB free, TCP forwarding)")

    async def test_connection(self) -> str:
        """Reach the host (its key is pinned on first contact) and check what provisioning
        needs, changing nothing there; return what was found. A failure is raised as
        ProvisionError (the link has already recorded an SSH failure) and recorded as the
        machine's last error, its state unchanged."""
        try:
            machine = await self._machine()
            if machine.is_upstream:
                if not await self.link.can_forward(machine.engine_port):
                    raise ProvisionError("requirements", "the SSH server refuses TCP forwarding "
                                         "(set AllowTcpForwarding yes in sshd_config)")
                found = "SSH works, TCP forwarding allowed"
                await self._event(f"connection test passed: {found}", kind="ssh")
                return found
            await self.check_requirements()
        except SSHError as exc:
            raise ProvisionError("connect", str(exc), recorded=True) from None
        except ProvisionError as exc:
            await self._event(f"connection test failed: {exc}", Event.Level.ERROR, kind="ssh")
            await RemoteMachine.objects.filter(machine_id=self.machine_id).aupdate(
                last_error=str(exc))
            exc.recorded = True
            raise
        await RemoteMachine.objects.filter(machine_id=self.machine_id).aupdate(last_error="")
        return "SSH works and the host meets the requirements"

    async def install(self) -> None:
        """Upload the wheel; install its dependencies only when they changed, then the project
        alone (`--no-deps`): an upgrade replaces our code and leaves the rest in place."""
        wheel = await build_wheel()
        await self._sh("install", f"mkdir -p {shlex.quote(self.base)}/params")
        async with await self.link.sftp() as sftp:
            await sftp.put(str(wheel), f"{self.relative}/{wheel.name}")
        await self._event(f"uploaded {wheel.name} ({wheel.parent.name})")
        gpus = (await self.link.run(
            "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null")).stdout
        gpu_names = [line.strip() for line in gpus.splitlines() if line.strip()]
        if not (await self.link.run(f"test -x {shlex.quote(self.venv_python)}")).ok:
            await self._sh("install", f"{shlex.quote(self.plan.remote_python)} -m venv "
                                      f"{shlex.quote(self.base)}/venv")
        target = f"{self.base}/{wheel.name}" + ("[gpu]" if gpu_names else "")
        pip = f"{shlex.quote(self.venv_python)} -m pip install --quiet " + " ".join(
            shlex.quote(a) for a in self.plan.pip_args)
        deps = wheel_dependencies(wheel) + ("-gpu" if gpu_names else "")
        deps_file = shlex.quote(f"{self.base}/dependencies.sha")
        installed = (await self.link.run(f"cat {deps_file} 2>/dev/null")).stdout.strip()
        if installed != deps:
            await self._sh("install", f"{pip} {shlex.quote(target)}", stream=True)
        await self._sh("install", f"{pip} --no-deps --force-reinstall {shlex.quote(target)} && "
                                  f"echo {deps} > {deps_file}", stream=True)
        machine = await self._machine()
        if gpu_names:
            machine.gpu_name, machine.gpu_count = gpu_names[0], len(gpu_names)
            await machine.asave(update_fields=["gpu_name", "gpu_count", "updated"])
        await self._event(f"installed the engine ({len(gpu_names)} GPU(s) found"
                          + ("" if installed != deps else "; dependencies unchanged") + ")",
                          gpus=gpu_names)

    async def write_config(self) -> None:
        machine = await self._machine()
        if not machine.engine_token:
            machine.engine_token = secrets.token_urlsafe(32)
            await machine.asave(update_fields=["engine_token", "updated"])
        config = engine_toml(machine.engine_port, machine.engine_token, f"{self.base}/params")
        # Written over SFTP with mode 600: the token never appears in a command line.
        async with await self.link.sftp() as sftp:
            async with sftp.open(f"{self.relative}/engine.toml", "w") as handle:
                await handle.write(config)
            await sftp.chmod(f"{self.relative}/engine.toml", 0o600)

    async def start(self) -> None:
        """Stop whatever engine runs (it must be gone and the port free), then start a new one
        with a fresh instance id that the health check then expects."""
        await self.write_config()
        await self.stop_engine()
        self.instance_id = uuid.uuid4().hex
        answer = await self._hostctl("start", "start", instance=self.instance_id)
        if not answer.get("started"):
            raise ProvisionError("start", answer.get("error") or "the engine did not start")
        await self._event(f"engine started (pid {answer['pid']})", pid=answer["pid"])

    async def stop_engine(self, grace_s: float | None = None) -> None:
        """Drain and stop the engine (running proofs get `grace_s` to finish); raise unless no
        process of it is left and the port is free. Nothing to do where no venv exists yet."""
        if not self.base:
            await self._locate()
        grace_s = self.plan.stop_grace_s if grace_s is None else grace_s
        if not (await self.link.run(f"test -x {shlex.quote(self.venv_python)}")).ok:
            return
        answer = await self._hostctl("stop", "stop", grace=grace_s, timeout=grace_s + 60)
        if not answer.get("stopped"):
            left = "; ".join(answer.get("remaining") or [])
            port = " and the engine port is still in use" if answer.get("port_in_use") else ""
            message = (f"the engine did not stop: still running: {left or 'nothing'}{port}")
            await self._event(message, Event.Level.ERROR, **answer)
            raise ProvisionError("stop", message, recorded=True)
        if answer.get("pid") is not None:
            await self._event("engine stopped" + (" (killed after the drain bound)"
                                                  if answer.get("escalated") else ""),
                              pid=answer["pid"])

    async def stop(self) -> None:
        """The Stop action: the engine stops and the machine becomes `stopped` (no alerts)."""
        await self.stop_engine()
        machine = await self._machine()
        if machine.state == Machine.State.RUNNING:
            await sync_to_async(machine.transition)(Machine.State.STOPPED)

    async def revive(self, attempt: int, of: int) -> bool:
        """Restart the engine if it died on a reachable host (not if it merely answers slowly):
        True when it was dead, restarted and healthy. Each try is an Event."""
        await self._locate()
        state = await self._hostctl("revive", "status")
        if state.get("alive") or state.get("pid") is None:
            return False
        await self._event(f"the engine (pid {state['pid']}) is not running: restarting it "
                          f"(try {attempt} of {of})", Event.Level.WARNING, kind=REVIVE_EVENT)
        try:
            await self.start()
            await self.wait_healthy()
        except (ProvisionError, SSHError, OSError) as exc:
            last = " (last try: restart it by hand)" if attempt >= of else ""
            await self._event(f"restarting the engine failed: {exc}{last}", Event.Level.ERROR)
            return False
        return True

    async def start_engine(self) -> None:
        """The Start action, from `stopped`: the engine runs again and the machine is running."""
        await self._locate()
        await self.start()
        await self.wait_healthy()
        machine = await self._machine()
        if machine.state == Machine.State.STOPPED:
            await sync_to_async(machine.transition)(Machine.State.RUNNING)

    async def restart(self) -> None:
        await self._locate()
        await self.start()
        await self.wait_healthy()

    async def upgrade(self) -> None:
        await self._locate()
        await self.install()
        await self.start()
        info = await self.wait_healthy()
        await self._event(f"upgraded: engine {info.get('version')} running",
                          version=info.get("version"))

    async def _client(self) -> EngineClient:
        machine = await self._machine()
        port = await self.link.tunnel(machine.engine_port)
        return EngineClient(f"http://127.0.0.1:{port}", token=machine.engine_token)

    async def wait_healthy(self) -> dict:
        """Wait until the engine this provisioner started answers (its instance id, not an
        old engine's); fail at once when it has died."""
        deadline = time.monotonic() + self.plan.health_timeout_s
        last = "no answer"
        checked = time.monotonic()
        while time.monotonic() < deadline:
            try:
                async with await self._client() as client:
                    info = await client.info()
                if not self.instance_id or info.get("instance_id") == self.instance_id:
                    await self._event(f"engine is healthy (pid {info.get('pid')}, "
                                      f"version {info.get('version')})")
                    return info
                last = f"an older engine (pid {info.get('pid')}) answered"
            except (CuzkError, OSError, aiohttp.ClientError) as exc:
                last = str(exc)[:200] or type(exc).__name__
            if time.monotonic() - checked > 2:
                checked = time.monotonic()
                if not (await self._hostctl("health", "status")).get("alive"):
                    last = "the engine exited"
                    break
            await asyncio.sleep(0.3)
        tail = await self.log_tail(5)
        raise ProvisionError("health", f"the engine did not answer within "
                                       f"{self.plan.health_timeout_s:g} s ({last}); log: "
                                       f"{' / '.join(tail.splitlines()[-5:])}")

    async def generate_params(self) -> None:
        for kind, profile in self.plan.param_sets:
            await self._say("parameters", f"{kind} ({profile})")
            await self._sh("parameters",
                           f"{shlex.quote(self.venv_python)} -m cuzk_engine setup --kind {kind} "
                           f"--profile {profile} --param-cache "
                           f"{shlex.quote(self.base)}/params 2>&1", stream=True)
        await self._event("parameters ready for " + ", ".join(
            f"{kind} {profile}" for kind, profile in self.plan.param_sets))

    async def benchmark(self) -> float:
        """Prove `bench_proofs` test proofs back to back; verify each here; proofs per hour."""
        started = time.monotonic()
        async with await self._client() as client:
            for seed in range(1, self.plan.bench_proofs + 1):
                submitted = await client.submit(self.plan.bench_kind, self.plan.bench_profile,
                                                seed)
                result = await self._await(client, submitted["job_id"])
                if result.get("status") != "done":
                    raise ProvisionError("benchmark", f"test proof {result.get('status')}: "
                                                      f"{result.get('error') or 'no error text'}")
                try:
                    valid = reverify(result["vk"], result["public_inputs"],
                                     bytes.fromhex(result["proof"]))
                except (VerificationError, KeyError, TypeError, ValueError) as exc:
                    raise ProvisionError("benchmark", f"unreadable test proof: {exc}") from None
                if not valid:
                    raise ProvisionError("benchmark", "the test proof does not verify")
                await self._say("benchmark", f"proof {seed}/{self.plan.bench_proofs} verified")
        rate = self.plan.bench_proofs * 3600 / (time.monotonic() - started)
        await self._event(f"benchmark: {rate:.1f} proofs/h ({self.plan.bench_proofs} "
                          f"{self.plan.bench_kind} {self.plan.bench_profile}, verified)",
                          rate=rate)
        return rate

    async def _await(self, client: EngineClient, job_id: str) -> dict:
        deadline = time.monotonic() + self.plan.step_timeout_s
        while True:
            result = await client.get(job_id, wait=60)
            if result.get("status") in TERMINAL_STATUSES:
                return result
            if time.monotonic() > deadline:
                raise ProvisionError("benchmark", f"test proof still {result.get('status')}")

    async def log_tail(self, lines: int = 100) -> str:
        if not self.base:
            await self._locate()
        command = f"tail -n {int(lines)} {shlex.quote(self.base)}/engine.log"
        return (await self.link.run(command, timeout=30)).stdout


UNREACHABLE = 255  # ssh's own status when it cannot reach or log in to the host


async def run_on_machines(machine_ids: list[int], command: str, *, user: str,
                       on_line: Callable[[int, str], Awaitable[None]],
                       pool: LinkPool | None = None, timeout: float = 600) -> dict[int, int]:
    """Run one command on many hosts at once, streaming each line tagged with its machine;
    the command, who ran it and every exit status go into one audit Event.

    Each host has `timeout` seconds in all, connecting included: one that cannot be reached
    (connect failed, or still retrying when time ran out) says why in its own output (status
    255, as ssh's), one that does not answer in time is stopped (124, as timeout(1)'s)."""
    pool = pool or LinkPool()

    async def one(machine_id: int) -> int:
        async def tagged(_stream, line):
            await on_line(machine_id, line)
        link = pool.get(machine_id)
        link.retry_now()  # an operator asked for this host now
        try:
            return await asyncio.wait_for(link.stream(command, tagged, timeout=timeout),
                                          timeout)
        except SSHError as exc:
            await on_line(machine_id, f"unreachable: {exc}")
            return UNREACHABLE
        except TimeoutError:
            # Still trying to connect when time ran out: the host is unreachable, which is
            # not a command that ran too long.
            if reason := link.unreachable_reason():
                await on_line(machine_id, f"unreachable: {reason}")
                return UNREACHABLE
            await on_line(machine_id, f"no answer within {timeout:g} s")
            return 124

    statuses = dict(zip(machine_ids, await asyncio.gather(*(one(m) for m in machine_ids)),
                        strict=True))
    names = {m.pk: m.name async for m in Machine.objects.filter(pk__in=machine_ids)}
    summary = ", ".join(f"{names.get(m, m)}={s}" for m, s in statuses.items())
    await sync_to_async(Event.record)(
        "command", f"{user} ran {command!r} on {len(machine_ids)} host(s): {summary}",
        level=Event.Level.INFO if all(s == 0 for s in statuses.values())
        else Event.Level.WARNING,
        data={"command": command, "user": user,
              "statuses": {str(k): v for k, v in statuses.items()}})
    return statuses


async def revive_crashed(automation: Automation, links: LinkPool) -> None:
    """Restart engines that died on reachable hosts (bounded tries, each an Event). Run after
    each of the automation's ticks: reviving needs a provisioner, which the rules do not."""
    for machine_id, tries in await sync_to_async(engines_to_revive)(automation.now()):
        try:
            await Provisioner(machine_id, link=links.get(machine_id),
                              automation=automation).revive(tries + 1, REVIVE_TRIES)
        except SSHError:
            pass  # the link recorded it; nothing to restart on a host we cannot reach
