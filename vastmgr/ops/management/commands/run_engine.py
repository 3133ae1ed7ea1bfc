"""`manage.py run_engine`: register this host's engine as the `local` Machine, then become that
engine (`python -m cuzk_engine serve`), so the fleet controller finds and watches it."""

import os
import sys

from django.core.management.base import BaseCommand, CommandError

from cuzk_engine.config import is_loopback, load_config, parse_listen
from cuzk_engine.errors import ConfigError
from vastmgr.fleet.models import Event, Machine

LOCAL_NAME = "local"


def register_local_machine(port: int, token: str | None, name: str = LOCAL_NAME) -> Machine:
    machine, created = Machine.objects.get_or_create(
        name=name, defaults={"provider": Machine.Provider.LOCAL, "host": "127.0.0.1",
                             "engine_port": port})
    machine.provider = Machine.Provider.LOCAL
    machine.host = "127.0.0.1"
    machine.engine_port = port
    machine.engine_token = token or ""
    machine.enabled = True
    machine.save(update_fields=["provider", "host", "engine_port", "engine_token", "enabled",
                                "updated"])
    if machine.state in (Machine.State.REGISTERED, Machine.State.STOPPED):
        machine.transition(Machine.State.RUNNING, reason="local engine started")
    if created:
        Event.record("lifecycle", f"{name}: registered the local engine on port {port}",
                     machine=machine)
    return machine


class Command(BaseCommand):
    help = "Register the local Machine row and run the engine (python -m cuzk_engine serve)."

    def add_arguments(self, parser):
        parser.add_argument("--config", help="engine TOML file (default: built-in defaults)")
        parser.add_argument("--listen", help="override daemon.listen, e.g. 127.0.0.1:9821")
        parser.add_argument("--param-cache", help="override srs.param_cache")
        parser.add_argument("--name", default=LOCAL_NAME, help="Machine name (default: local)")

    def handle(self, *args, config, listen, param_cache, name, **options):
        try:
            engine_config = load_config(config)
            if listen:
                parse_listen(listen)
                engine_config.daemon.listen = listen
        except (ConfigError, OSError) as exc:
            raise CommandError(f"engine config: {exc}") from exc
        host, port = engine_config.daemon.host, engine_config.daemon.port
        if not is_loopback(host) and host not in ("0.0.0.0", "::"):
            raise CommandError(f"daemon.listen {host}:{port} is not reachable as 127.0.0.1; "
                               "a remote engine is a Machine with its own provider")
        machine = register_local_machine(port, engine_config.daemon.token, name)
        if machine.state == Machine.State.KILLED:
            raise CommandError(f"machine {name!r} was killed ({machine.kill_reason}); "
                               "pick another --name")
        self.stdout.write(f"machine {name!r} → engine on 127.0.0.1:{port}")
        sys.stdout.flush()
        argv = [sys.executable, "-m", "cuzk_engine", "serve"]
        for flag, value in (("--config", config), ("--listen", listen),
                            ("--param-cache", param_cache)):
            if value:
                argv += [flag, value]
        # Replace this process, so signals and the exit code are the engine's own.
        os.execv(sys.executable, argv)
