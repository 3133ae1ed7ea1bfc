"""Serve the instance call-home protocol on its own address (daphne, in this process)."""

from daphne.cli import CommandLineInterface  # type: ignore[import-untyped]
from django.core.management.base import BaseCommand

from vastmgr.instances.config import DEFAULT_PORT


class Command(BaseCommand):
    help = "Serve vast-manager's instance protocol (/register, /bench-done, ...) on its own port."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=DEFAULT_PORT)

    def handle(self, *args, host, port, **options):
        CommandLineInterface().run(["-b", host, "-p", str(port),
                                    "vastmgr.remote.callhome.asgi:application"])
