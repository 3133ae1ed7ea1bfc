"""`./dev up`: migrate, make sure an admin exists, then run and supervise every process."""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

STOP_GRACE_SECONDS = 15


def ensure_admin(stdout) -> None:
    """Create the first admin; print a generated password exactly once."""
    User = get_user_model()
    username = os.environ.get("VASTMGR_ADMIN_USER")
    password = os.environ.get("VASTMGR_ADMIN_PASSWORD")
    if username or password:
        if not (username and password):
            raise SystemExit("VASTMGR_ADMIN_USER and VASTMGR_ADMIN_PASSWORD must be set together")
        user, created = User.objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        stdout.write(f"admin account {username!r} {'created' if created else 'updated'} from the environment")
        return
    if User.objects.filter(is_superuser=True).exists():
        return
    password = secrets.token_urlsafe(12)
    User.objects.create_superuser("admin", "", password)
    stdout.write("Created the admin account (shown once; change it in /admin/):")
    stdout.write(f"    username: admin\n    password: {password}")


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

    def processes(self, host: str, port: int, engine_config: str | None = None,
                  engine_listen: str | None = None) -> list[tuple[str, list[str]]]:
        python = sys.executable
        manage = str(Path(__file__).resolve().parents[4] / "manage.py")
        dashboard = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        return [
            ("dashboard", [python, "-m", "daphne", "-b", host, "-p", str(port),
                           "vastmgr.asgi:application"]),
            ("controller", [python, manage, "run_fleet", "--dashboard-url", dashboard]),
            ("automation", [python, manage, "remote_automation"]),
            ("engine", [python, manage, "run_engine"]
             + (["--config", engine_config] if engine_config else [])
             + (["--listen", engine_listen] if engine_listen else [])),
        ]

    def handle(self, *args, host, port, engine_config, engine_listen, **options):
        call_command("migrate", interactive=False, verbosity=0)
        ensure_admin(self.stdout)
        children = {
            name: subprocess.Popen(argv, start_new_session=True)
            for name, argv in self.processes(host, port, engine_config, engine_listen)
        }
        self.stdout.write(f"vastmgr is up on http://{host}:{port}/ — Ctrl-C stops everything")
        stopping = False

        def request_stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        exit_code = 0
        while not stopping:
            for name, proc in children.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with code {proc.returncode}; stopping")
                    exit_code = proc.returncode or 1
                    stopping = True
            time.sleep(0.2)
        self.stop(children)
        if exit_code:
            raise SystemExit(exit_code)

    def stop(self, children: dict[str, subprocess.Popen]) -> None:
        # Children run in their own sessions, so Ctrl-C reaches only us: forward it once,
        # give them time to drain, then kill what is left.
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for name, proc in children.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in {STOP_GRACE_SECONDS}s; killing it")
                proc.kill()
                proc.wait()
        self.stdout.write("stopped")
