"""Deliver pending notifications until stopped (started by `up`, or its own systemd unit)."""

import asyncio

from channels.db import database_sync_to_async
from django.core.management.base import BaseCommand

from vastmgr.fleet.faults import FaultRecorder
from vastmgr.notify import watch
from vastmgr.notify.outbox import deliver_due

WATCH_EVERY = 10.0  # seconds between looks at the budget and the upstream daemons


class Command(BaseCommand):
    help = "Send notifications to their channels, retrying failed ones with backoff."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--poll", type=float, default=1.0,
                            help="seconds between looks for due deliveries (default 1)")

    def handle(self, *args, poll: float, **options) -> None:
        self.stdout.write("notifier running")
        try:
            asyncio.run(self.deliver(poll))
        except KeyboardInterrupt:  # SIGINT: `up`'s Ctrl-C, or systemd's KillSignal
            pass
        self.stdout.write("notifier stopped")

    async def deliver(self, poll: float) -> None:
        faults = FaultRecorder("notifier")
        loop = asyncio.get_running_loop()
        watched = float("-inf")
        while True:
            try:
                if loop.time() - watched >= WATCH_EVERY:
                    watched = loop.time()
                    await database_sync_to_async(watch.check)()
                tried = await database_sync_to_async(deliver_due)()
            except Exception as exc:  # noqa: BLE001 - one bad round must not stop delivery
                await faults.record(exc)
                tried = 0
            if not tried:
                await asyncio.sleep(poll)
