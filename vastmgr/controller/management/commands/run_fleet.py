"""`manage.py run_fleet`: the fleet controller, a long-running process (like `sendalerts`)."""

import asyncio
import gc
import os
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from vastmgr.controller.service import FleetController, engine_session
from vastmgr.controller.upstream import poll_interval
from vastmgr.fleet.leases import Leases
from vastmgr.front.publish import LayerPublisher, SocketPublisher
from vastmgr.lib.errors import SettingsError


def uses_shared_layer() -> bool:
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    return not backend.endswith("InMemoryChannelLayer")


def uses_leases() -> bool:
    """PostgreSQL (scale-out): hosts are leased, so several controllers can share them. SQLite
    (embedded): one controller watches every host, as it has no row locks to share them by."""
    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


class Command(BaseCommand):
    help = "Watch every engine, push live fragments, dispatch queued proofs, keep history."

    def add_arguments(self, parser):
        parser.add_argument("--dashboard-url",
                            default=os.environ.get("VASTMGR_DASHBOARD_URL", "http://127.0.0.1:8000"),
                            help="daphne to push fragments to (its push socket) when there is no Redis "
                                 "(default: $VASTMGR_DASHBOARD_URL or http://127.0.0.1:8000)")
        parser.add_argument("--tick", type=float, default=0.5,
                            help="seconds between pushes; updates within a tick are coalesced")
        parser.add_argument("--interval", type=float, default=1.0,
                            help="expected seconds between engine snapshots; stale after 3")
        parser.add_argument("--grace", type=float, default=60.0,
                            help="seconds a machine may be offline before its jobs are re-queued")
        parser.add_argument("--lease", type=float, default=10.0,
                            help="scale-out mode: seconds a host stays this controller's after "
                                 "its last heartbeat (a dead controller's hosts move after this)")

    def handle(self, *args, dashboard_url, tick, interval, grace, lease, **options):
        for name, value in (("--tick", tick), ("--interval", interval), ("--grace", grace),
                            ("--lease", lease)):
            if value <= 0:
                raise CommandError(f"{name} must be positive (got {value})")
        try:
            poll_interval(interval)  # upstream daemons are polled; refuse a bad setting now
        except SettingsError as exc:
            raise CommandError(str(exc)) from None
        # What is loaded by now (Django, the apps, the templates) lives as long as the process:
        # kept out of the collector's generations, the full collections that a thousand
        # snapshots a second set off do not walk it every time.
        gc.freeze()
        # A snapshot's JSON lives about a second (until the host's next one replaces it), far
        # longer than the default 700 allocations between young collections at a thousand
        # snapshots a second: each got promoted into the oldest generation, whose growth set
        # off full collections every few seconds (14 % of the controller's CPU at 1,000 hosts,
        # measured with gc.callbacks). Collected young every 20,000 allocations, it dies
        # before it is promoted (the collector's share fell to 2 %); a young collection then
        # takes about 12 ms.
        gc.set_threshold(20_000, 20, 10)
        asyncio.run(self.serve(dashboard_url, tick, interval, grace, lease))

    async def serve(self, dashboard_url, tick, interval, grace, lease):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        session = engine_session()
        publisher: LayerPublisher | SocketPublisher
        if uses_shared_layer():
            publisher = LayerPublisher()
            where = "the shared channel layer"
        else:
            publisher = SocketPublisher(dashboard_url, session)
            where = f"the dashboard at {dashboard_url} (push socket)"
        leases = Leases(lease) if uses_leases() else None
        controller = FleetController(publisher=publisher, tick=tick, interval=interval, grace=grace,
                                     leases=leases)
        controller.session = session
        self.stdout.write(f"fleet controller running; fragments go to {where}")
        if leases is not None:
            self.stdout.write(f"sharing the hosts with any other controller as {leases.name} "
                              f"(leases of {lease:g} s in the database)")
        await controller.run(stop)
        self.stdout.write("fleet controller stopped")
