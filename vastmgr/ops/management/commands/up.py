"""`./dev up`: migrate, make sure an admin exists, then run and supervise every process.

Supervision: a child that exits is started again after a backoff (1 s doubling to 30 s, reset
once it has run for a minute), with a log line and an Event each time; the others keep running.
More than RESTART_CAP restarts within RESTART_WINDOW seconds and it is left down (an error Event
says so). Children die with `up` even on kill -9 (the kernel's parent-death signal), so a rerun
finds its ports free.

Stopping (Ctrl-C or SIGTERM): the engine drains first — running jobs finish, queued ones go back
to the dashboard's queue — while the controller is still there to collect every outcome; then
the controller, the automation and the dashboard get SIGTERM. A second Ctrl-C makes the engine
cancel its running work at once.
"""

import collections
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from cuzk_engine.config import load_config, parse_listen
from cuzk_engine.errors import ConfigError
from vastmgr.lib import environment

STOP_GRACE_SECONDS = 5.0  # per child once the engine is down (daphne, controller, automation)
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
STABLE_AFTER = 60.0  # a child that ran this long starts again with the first backoff
RESTART_CAP, RESTART_WINDOW = 5, 120.0
PORT_WAIT_SECONDS = 5.0  # a previous run's children may still be letting go of their ports
POLL_SECONDS = 0.1
PR_SET_PDEATHSIG = 1


def ensure_admin(stdout) -> None:
    """Create the first admin; print a generated password exactly once. From the environment,
    the password is set only when it differs, so a restart does not log everyone out."""
    User = get_user_model()
    username = os.environ.get("VASTMGR_ADMIN_USER")
    password = os.environ.get("VASTMGR_ADMIN_PASSWORD")
    if username or password:
        if not (username and password):
            raise SystemExit("VASTMGR_ADMIN_USER and VASTMGR_ADMIN_PASSWORD must be set together")
        user, created = User.objects.get_or_create(username=username)
        changed = created or not (user.is_staff and user.is_superuser)
        user.is_staff = user.is_superuser = True
        if created or not user.check_password(password):
            user.set_password(password)  # a new hash invalidates the account's sessions
            changed = True
        if changed:
            user.save()
        state = "created" if created else "updated" if changed else "unchanged"
        stdout.write(f"admin account {username!r} {state} from the environment")
        return
    if User.objects.filter(is_superuser=True).exists():
        return
    password = secrets.token_urlsafe(12)
    User.objects.create_superuser("admin", "", password)
    stdout.write("Created the admin account (shown once; change it in /admin/):")
    stdout.write(f"    username: admin\n    password: {password}")


def die_with_parent_hook():
    """A preexec_fn: the child gets SIGKILL when `up` dies, however it dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # `up` died between fork and prctl
            os._exit(1)

    return arm


def wait_port_free(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
        time.sleep(POLL_SECONDS)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    given_up: bool = False
    restarts: collections.deque = field(default_factory=collections.deque)

    @property
    def exit_code(self) -> int | None:
        """How its process ended; None while it runs or before it first started."""
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    def send(self, signum: int) -> None:
        if self.proc is not None and self.exit_code is None:
            self.proc.send_signal(signum)

    def kill(self) -> None:
        if self.proc is not None and self.exit_code is None:
            self.proc.kill()

    def wait(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(timeout, 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False


class Command(BaseCommand):
    help = "Run the dashboard (daphne) and its companion processes until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--engine-config", default=os.environ.get("CUZK_CONFIG"),
                            help="TOML file for the local engine (default: $CUZK_CONFIG)")
        parser.add_argument("--engine-listen", default=os.environ.get("CUZK_LISTEN"),
                            help="host:port of the local engine (default: its config's "
                                 "daemon.listen, 127.0.0.1:9821)")
        parser.add_argument("--drain-timeout", type=float, default=300.0,
                            help="seconds the engine may take to finish its running jobs when "
                                 "stopping before it is told to cancel them (default 300)")
        parser.add_argument("--callhome-host", default=os.environ.get("VASTMGR_CALLHOME_HOST"),
                            help="address of the instance call-home listener (default: --host)")
        parser.add_argument("--callhome-port", type=int,
                            default=int(os.environ.get("VASTMGR_CALLHOME_PORT") or 1235),
                            help="its port (default 1235, vast-manager's instance port)")

    def processes(self, host: str, port: int, engine_config: str | None = None,
                  engine_listen: str | None = None,
                  callhome: tuple[str, int] | None = None) -> list[tuple[str, list[str]]]:
        python = sys.executable
        manage = str(Path(__file__).resolve().parents[4] / "manage.py")
        dashboard = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        return [
            ("dashboard", [python, "-m", "daphne", "-b", host, "-p", str(port),
                           "vastmgr.asgi:application"]),
            ("controller", [python, manage, "run_fleet", "--dashboard-url", dashboard]),
            ("automation", [python, manage, "remote_automation"]),
            ("notifier", [python, manage, "run_notifier"]),
            ("engine", [python, manage, "run_engine"]
             + (["--config", engine_config] if engine_config else [])
             + (["--listen", engine_listen] if engine_listen else [])),
        ] + ([("callhome", [python, manage, "serve_callhome", "--host", callhome[0],
                            "--port", str(callhome[1])])] if callhome else [])

    def handle(self, *args, host, port, engine_config, engine_listen, drain_timeout,
               callhome_host, callhome_port, **options):
        call_command("migrate", interactive=False, verbosity=0)
        ensure_admin(self.stdout)
        callhome = (callhome_host or host, callhome_port)
        for where, (bind_host, bind_port) in (("the dashboard", (host, port)),
                                              ("the engine", engine_address(engine_config,
                                                                            engine_listen)),
                                              ("the call-home listener", callhome)):
            if not wait_port_free(bind_host, bind_port, PORT_WAIT_SECONDS):
                raise CommandError(f"port {bind_port} for {where} is in use by another process")
        self.children = [Child(name, argv)
                         for name, argv in self.processes(host, port, engine_config,
                                                          engine_listen, callhome)]
        self.preexec = die_with_parent_hook()
        self.stop_requests = 0
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        record = environment.record_running_stack(settings.BASE_DIR / "var", settings.DATA_DIR)
        try:
            self.run_children(host, port, callhome, drain_timeout)
        finally:
            if record is not None:
                environment.forget_running_stack(record)

    def run_children(self, host: str, port: int, callhome: tuple[str, int],
                     drain_timeout: float) -> None:
        for child in self.children:
            self.start(child)
        self.stdout.write(f"vastmgr is up on http://{host}:{port}/ — Ctrl-C stops everything")
        self.stdout.write(f"instances call home on http://{callhome[0]}:{callhome[1]}/ "
                          "(vast-manager's protocol)")
        while not self.stop_requests:
            self.supervise_once()
            if all(child.given_up for child in self.children):
                self.stderr.write("every process was given up; stopping")
                raise SystemExit(1)
            time.sleep(POLL_SECONDS)
        self.stop(drain_timeout)

    def request_stop(self, signum, frame) -> None:
        self.stop_requests += 1

    # ---- supervision ----------------------------------------------------------------------

    def start(self, child: Child) -> None:
        # Own session: a terminal's Ctrl-C reaches `up` alone, which stops the children in order.
        # `up` runs no threads, so the preexec hook (one prctl) cannot deadlock.
        child.proc = subprocess.Popen(child.argv, start_new_session=True,
                                      preexec_fn=self.preexec)  # noqa: PLW1509
        child.started = time.monotonic()
        child.restart_at = None

    def supervise_once(self, names: tuple[str, ...] | None = None) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.given_up or (names is not None and child.name not in names):
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self.start(child)
                continue
            if child.exit_code is not None:
                self.schedule_restart(child, now)

    def schedule_restart(self, child: Child, now: float) -> None:
        code = child.exit_code
        assert code is not None, "only a child that exited is restarted"
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        if now - child.started >= STABLE_AFTER:
            child.backoff = BACKOFF_FIRST
        while child.restarts and now - child.restarts[0] > RESTART_WINDOW:
            child.restarts.popleft()
        if len(child.restarts) >= RESTART_CAP:
            child.given_up = True
            self.report(f"{child.name} {how}; it was restarted {RESTART_CAP} times within "
                        f"{RESTART_WINDOW:g}s, so it stays down (the others keep running)",
                        error=True)
            return
        child.restarts.append(now)
        child.restart_at = now + child.backoff
        self.report(f"{child.name} {how}; restarting it in {child.backoff:g}s "
                    f"(restart {len(child.restarts)} of at most {RESTART_CAP} per "
                    f"{RESTART_WINDOW:g}s)")
        child.backoff = min(child.backoff * 2, BACKOFF_MAX)

    def report(self, message: str, error: bool = False) -> None:
        self.stderr.write(message)
        from vastmgr.fleet.models import Event

        try:
            Event.record("supervisor", message,
                         level=Event.Level.ERROR if error else Event.Level.WARNING)
        except Exception as exc:  # noqa: BLE001 - the database being down must not stop `up`
            self.stderr.write(f"(could not record the event: {exc})")

    # ---- stopping -------------------------------------------------------------------------

    def stop(self, drain_timeout: float) -> None:
        by_name = {child.name: child for child in self.children}
        engine = by_name["engine"]
        others = [child for child in self.children if child is not engine]
        by_name["automation"].send(signal.SIGTERM)
        # The controller stays up while the engine drains: it collects each result and puts
        # each job the engine cancels back in the queue.
        engine.send(signal.SIGTERM)
        if engine.running:
            self.stdout.write("stopping: the engine finishes its running jobs "
                              "(Ctrl-C again to cancel them)")
        deadline = time.monotonic() + drain_timeout
        hurried = False
        while engine.running and time.monotonic() < deadline:
            if self.stop_requests > 1 and not hurried:
                hurried = True
                engine.send(signal.SIGTERM)  # the engine's second signal: cancel and exit
            self.supervise_once(("controller", "dashboard"))  # still needed while it drains
            engine.wait(POLL_SECONDS)
        if engine.running:
            engine.send(signal.SIGTERM)
            if not engine.wait(STOP_GRACE_SECONDS):
                self.stderr.write(f"engine did not stop in {drain_timeout:g}s; killing it")
                engine.kill()
        for child in others:
            if child.restart_at is not None:
                child.given_up = True  # waiting for a restart: stays down
            child.send(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in others:
            if not child.wait(deadline - time.monotonic()):
                self.stderr.write(f"{child.name} did not stop in {STOP_GRACE_SECONDS:g}s; "
                                  "killing it")
                child.kill()
        for child in self.children:
            child.wait(STOP_GRACE_SECONDS)
        self.stdout.write("stopped")


def engine_address(config: str | None, listen: str | None) -> tuple[str, int]:
    try:
        return parse_listen(listen) if listen else parse_listen(load_config(config).daemon.listen)
    except (ConfigError, OSError) as exc:
        raise CommandError(f"engine config: {exc}") from exc
