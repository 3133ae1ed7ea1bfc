"""The remote automation loop: reconcile Vast instances and apply lifecycle rules every tick."""

import asyncio
import os
import signal

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.management.base import BaseCommand

from vastmgr.autopilot.models import Autopilot
from vastmgr.autopilot.pilot import Pilot
from vastmgr.fleet.faults import FaultRecorder
from vastmgr.fleet.models import Event
from vastmgr.lib.errors import SecretUnavailable
from vastmgr.remote import provision, vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import Automation
from vastmgr.remote.models import Secret
from vastmgr.remote.ssh import Backoff, LinkPool


class Command(BaseCommand):
    help = "Reconcile provider instances and run lifecycle automation (timeouts, alerts)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.faults = FaultRecorder("remote automation tick")
        self.links = LinkPool(backoff=Backoff.from_env())  # one SSH connection per host, kept
        self.pilot = Pilot(None)  # plans where it holds the autopilot's lease

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval", type=float,
            default=float(os.environ.get("VASTMGR_AUTOMATION_INTERVAL_S") or 60.0),
            help="seconds per tick (default: VASTMGR_AUTOMATION_INTERVAL_S, else 60)")
        parser.add_argument("--once", action="store_true", help="run one tick and exit")

    def handle(self, *args, interval: float, once: bool, **options):
        asyncio.run(self.loop(interval, once))

    async def loop(self, interval: float, once: bool) -> None:
        # `./dev up` stops its children with SIGTERM: finish the tick in hand, then exit quietly.
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        while not stop.is_set():
            try:
                await self.tick()
            except Exception as exc:  # noqa: BLE001 - one failed tick must not end the loop
                await self.faults.record(exc)
            if once:
                return
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
        await sync_to_async(Autopilot.release)(self.pilot.owner)

    async def tick(self) -> None:
        """Reconcile (a Vast failure is an Event, never the end of the loop), then the rules."""
        client = None
        if await sync_to_async(Secret.is_set)(Secret.VAST_API_KEY):
            try:
                client = await sync_to_async(vast.VastClient.from_settings)(background=True)
                settings = await sync_to_async(RemoteSettings.load)()
                await vast.reconcile(client, webhook_url=settings.alert_webhook_url)
            except (vast.VastError, SecretUnavailable) as exc:
                await sync_to_async(Event.record)("vast", f"reconcile failed: {exc}",
                                                  level=Event.Level.ERROR)
            except Exception as exc:  # noqa: BLE001 - e.g. a broken reply: the rules still run
                await self.faults.record(exc)
        if client is not None:
            await self.pull_bills(client)
        automation = Automation(vast_client=client)
        await automation.tick()
        await provision.revive_crashed(automation, self.links)
        self.pilot.client = client
        await self.pilot.tick()

    async def pull_bills(self, client: vast.VastClient) -> None:
        """Vast's charges, after the reconcile has written what changed: the ledger keeps them
        beside its estimate (a failed pull leaves the last bill, shown with its age)."""
        try:
            await vast.pull_bills(client, tolerance=django_settings.VASTMGR_BILLING_TOLERANCE)
        except vast.VastError as exc:
            await sync_to_async(Event.record)("vast", f"pulling Vast's charges failed: {exc}",
                                              level=Event.Level.WARNING)
        except Exception as exc:  # noqa: BLE001 - the rules and the pilot still run
            await self.faults.record(exc)
