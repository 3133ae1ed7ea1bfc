"""Provisioning a host over its SSH link: wheel, venv, engine config, detached start, health,
parameters, benchmark; plus stop/restart/upgrade, log tail and commands on many hosts.

Every step is an Event on the machine; a failing step returns the machine to `registered`
with the step's message (never a secret) so the operator can fix the host and try again.
"""

import asyncio
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from asgiref.sync import sync_to_async

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.errors import CuzkError
from vastmgr.fleet.controller.verify import VerificationError, reverify
from vastmgr.fleet.models import Event, Machine

from .conf import RemoteSettings
from .lifecycle import Automation
from .models import RemoteHost
from .ssh import LinkPool, MachineLink, SSHError

REPO_ROOT = Path(__file__).resolve().parents[2]
UNIT_NAME = "vastmgr-engine"
Progress = Callable[[str, str], Awaitable[None]]


class ProvisionError(RuntimeError):
    def __init__(self, step: str, message: str):
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass(frozen=True)
class ProvisionPlan:
    kinds: tuple[str, ...] = ("winning-post",)
    profile: str = "tiny"
    bench_kind: str = "winning-post"
    bench_proofs: int = 2
    remote_python: str = "python3"
    # Extra `pip install` arguments, e.g. ("--no-index", "--find-links", "...") offline.
    pip_args: tuple[str, ...] = ()
    use_systemd: bool | None = None  # None: a systemd user manager when the host has one
    health_timeout_s: float = 120
    step_timeout_s: float = 3600

    @classmethod
    def from_settings(cls, settings: RemoteSettings) -> "ProvisionPlan":
        return cls(pip_args=settings.provision_pip_args)


_wheel_lock = asyncio.Lock()
_wheel_cache: dict[str, Path] = {}


async def build_wheel() -> Path:
    """The project's wheel, built once per process with `pip wheel --no-deps`."""
    async with _wheel_lock:
        cached = _wheel_cache.get("wheel")
        if cached and cached.exists():
            return cached
        out = Path(tempfile.mkdtemp(prefix="vastmgr-wheel-"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out),
            str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output, _ = await proc.communicate()
        wheels = sorted(out.glob("vastmgr-*.whl"))
        if proc.returncode or not wheels:
            tail = output.decode(errors="replace").strip().splitlines()[-3:]
            raise ProvisionError("build wheel", " / ".join(tail) or "pip wheel failed")
        _wheel_cache["wheel"] = wheels[0]
        return wheels[0]


def engine_toml(port: int, token: str, param_cache: str) -> str:
    return (f'[daemon]\nlisten = "127.0.0.1:{port}"\ntoken = "{token}"\n\n'
            f'[srs]\nparam_cache = "{param_cache}"\n')


class Provisioner:
    def __init__(self, machine_id: int, *, plan: ProvisionPlan | None = None,
                 link: MachineLink | None = None, automation: Automation | None = None,
                 progress: Progress | None = None):
        self.machine_id = machine_id
        self.automation = automation or Automation()
        self.plan = plan or ProvisionPlan.from_settings(self.automation.settings)
        self.link = link or LinkPool().get(machine_id)
        self._progress = progress
        self.base = ""
        self.relative = ""
        self.systemd = False

    # -------------------------------------------------------------------- helpers

    async def _machine(self) -> Machine:
        return await Machine.objects.aget(pk=self.machine_id)

    async def _event(self, message: str, level=Event.Level.INFO, **data) -> None:
        machine = await self._machine()
        await sync_to_async(Event.record)("provision", f"{machine.name}: {message}",
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
        remote = await RemoteHost.objects.aget_or_create(machine_id=self.machine_id)
        home = (await self._sh("connect", "pwd")).strip()
        self.relative = remote[0].remote_dir
        self.base = f"{home}/{self.relative}"
        if self.plan.use_systemd is None:
            probe = await self.link.run("systemctl --user show-environment >/dev/null 2>&1")
            self.systemd = probe.ok
        else:
            self.systemd = self.plan.use_systemd

    @property
    def venv_python(self) -> str:
        return f"{self.base}/venv/bin/python"

    # -------------------------------------------------------------------- steps

    async def provision(self) -> float:
        """Run every step; return the benchmark rate (proofs per hour)."""
        machine = await self._machine()
        if machine.state != Machine.State.PROVISIONING:
            await sync_to_async(machine.transition)(Machine.State.PROVISIONING)
        step = "connect"
        try:
            await self._locate()
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
            raise ProvisionError(step, str(exc)) from None
        if await self.automation.benchmark_done(self.machine_id, rate):
            await sync_to_async((await self._machine()).transition)(Machine.State.RUNNING)
        return rate

    async def _fail(self, message: str) -> None:
        await self._event(f"provisioning failed at {message}", Event.Level.ERROR)
        await RemoteHost.objects.filter(machine_id=self.machine_id).aupdate(last_error=message)
        machine = await self._machine()
        target = {Machine.State.PROVISIONING: Machine.State.REGISTERED,
                  Machine.State.PARAMS_READY: Machine.State.PROVISIONING}.get(machine.state)
        if target:
            await sync_to_async(machine.transition)(target, reason=message)

    async def install(self) -> None:
        wheel = await build_wheel()
        await self._sh("install", f"mkdir -p {shlex.quote(self.base)}/params")
        async with await self.link.sftp() as sftp:
            await sftp.put(str(wheel), f"{self.relative}/{wheel.name}")
        await self._event(f"uploaded {wheel.name}")
        gpus = (await self.link.run(
            "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null")).stdout
        gpu_names = [line.strip() for line in gpus.splitlines() if line.strip()]
        if not (await self.link.run(f"test -x {shlex.quote(self.venv_python)}")).ok:
            await self._sh("install", f"{self.plan.remote_python} -m venv "
                                      f"{shlex.quote(self.base)}/venv")
        target = f"{self.base}/{wheel.name}" + ("[gpu]" if gpu_names else "")
        pip = " ".join(shlex.quote(a) for a in self.plan.pip_args)
        await self._sh("install", f"{shlex.quote(self.venv_python)} -m pip install --quiet "
                                  f"--force-reinstall {pip} {shlex.quote(target)}", stream=True)
        machine = await self._machine()
        if gpu_names:
            machine.gpu_name, machine.gpu_count = gpu_names[0], len(gpu_names)
            await machine.asave(update_fields=["gpu_name", "gpu_count", "updated"])
        await self._event(f"installed the engine ({len(gpu_names)} GPU(s) found)",
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

    def _serve_command(self) -> str:
        return f"{shlex.quote(self.venv_python)} -m cuzk_engine serve --config " \
               f"{shlex.quote(self.base)}/engine.toml"

    async def start(self) -> None:
        await self.write_config()
        base = shlex.quote(self.base)
        if self.systemd:
            unit = (f"[Unit]\nDescription=cuzk proving engine (vastmgr)\n\n[Service]\n"
                    f"WorkingDirectory={self.base}\nExecStart={self._serve_command()}\n"
                    f"Restart=on-failure\n\n[Install]\nWantedBy=default.target\n")
            await self._sh("start", "mkdir -p .config/systemd/user")
            async with await self.link.sftp() as sftp, \
                    sftp.open(f".config/systemd/user/{UNIT_NAME}.service", "w") as handle:
                await handle.write(unit)
            await self._sh("start", f"systemctl --user daemon-reload && "
                                    f"systemctl --user restart {UNIT_NAME}")
        else:
            await self._stop_pid()
            await self._sh("start", f"cd {base} && setsid nohup {self._serve_command()} "
                                    f"> {base}/engine.log 2>&1 < /dev/null & "
                                    f"echo $! > {base}/engine.pid")
        await self._event("engine started" + (" (systemd user unit)" if self.systemd
                                              else " (setsid, pid file)"))

    async def _stop_pid(self) -> None:
        pid_file = shlex.quote(f"{self.base}/engine.pid")
        await self.link.run(
            f"if [ -f {pid_file} ]; then pid=$(cat {pid_file}); kill $pid 2>/dev/null; "
            f"for i in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done; "
            f"rm -f {pid_file}; fi")

    async def stop(self) -> None:
        await self._locate()
        if self.systemd:
            await self._sh("stop", f"systemctl --user stop {UNIT_NAME}")
        else:
            await self._stop_pid()
        await self.link.close()  # the tunnel points at a dead port now
        await self._event("engine stopped")

    async def restart(self) -> None:
        await self._locate()
        await self.start()
        await self.wait_healthy()

    async def upgrade(self) -> None:
        await self._locate()
        await self.install()
        await self.start()
        await self.wait_healthy()

    async def _client(self) -> EngineClient:
        machine = await self._machine()
        port = await self.link.tunnel(machine.engine_port)
        return EngineClient(f"http://127.0.0.1:{port}", token=machine.engine_token)

    async def wait_healthy(self) -> dict:
        deadline = time.monotonic() + self.plan.health_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                async with await self._client() as client:
                    info = await client.info()
                await self._event("engine is healthy")
                return info
            except (CuzkError, OSError, aiohttp.ClientError) as exc:
                last = str(exc)[:200] or type(exc).__name__
            await asyncio.sleep(0.5)
        tail = await self.log_tail(5)
        raise ProvisionError("health", f"the engine did not answer within "
                                       f"{self.plan.health_timeout_s:g} s ({last}); log: "
                                       f"{' / '.join(tail.splitlines()[-5:])}")

    async def generate_params(self) -> None:
        for kind in self.plan.kinds:
            await self._say("parameters", f"{kind} ({self.plan.profile})")
            await self._sh("parameters",
                           f"{shlex.quote(self.venv_python)} -m cuzk_engine setup --kind {kind} "
                           f"--profile {self.plan.profile} --param-cache "
                           f"{shlex.quote(self.base)}/params 2>&1", stream=True)
        await self._event(f"parameters ready for {', '.join(self.plan.kinds)} "
                          f"({self.plan.profile})")

    async def benchmark(self) -> float:
        """Prove `bench_proofs` test proofs back to back; verify each here; proofs per hour."""
        started = time.monotonic()
        async with await self._client() as client:
            for seed in range(1, self.plan.bench_proofs + 1):
                submitted = await client.submit(self.plan.bench_kind, self.plan.profile, seed)
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
                          f"{self.plan.bench_kind} {self.plan.profile}, verified)", rate=rate)
        return rate

    async def _await(self, client: EngineClient, job_id: str) -> dict:
        deadline = time.monotonic() + self.plan.step_timeout_s
        while True:
            result = await client.get(job_id, wait=60)
            if result.get("status") in {"done", "failed", "cancelled"}:
                return result
            if time.monotonic() > deadline:
                raise ProvisionError("benchmark", f"test proof still {result.get('status')}")

    async def log_tail(self, lines: int = 100) -> str:
        if not self.base:
            await self._locate()
        if self.systemd:
            command = f"journalctl --user -u {UNIT_NAME} -n {int(lines)} --no-pager"
        else:
            command = f"tail -n {int(lines)} {shlex.quote(self.base)}/engine.log"
        return (await self.link.run(command, timeout=30)).stdout


async def run_on_hosts(machine_ids: list[int], command: str, *, user: str,
                       on_line: Callable[[int, str], Awaitable[None]],
                       pool: LinkPool | None = None, timeout: float = 600) -> dict[int, int]:
    """Run one command on many hosts at once, streaming each line tagged with its machine;
    the command, who ran it and every exit status go into one audit Event."""
    pool = pool or LinkPool()

    async def one(machine_id: int) -> int:
        async def tagged(_stream, line):
            await on_line(machine_id, line)
        try:
            return await pool.get(machine_id).stream(command, tagged, timeout=timeout)
        except SSHError as exc:
            await on_line(machine_id, str(exc))
            return 255

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
