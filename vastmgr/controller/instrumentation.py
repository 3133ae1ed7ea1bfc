"""The fleet controller's side of the metrics: its own timings, and the engines' metrics relayed.

The controller runs apart from daphne, and most engines listen only on their host's loopback,
reached through the SSH tunnel the controller that holds the host keeps open. So the controller
measures its ticks and fan-out latency in its own registry and, every relay interval, stores
that registry's exposition and each of its connected engines' `/metrics` (read over the
tunnel it already has; an upstream cuzk daemon's `GetMetrics`, renamed to Prometheus'
conventions by `cuzk_grpc.metrics.bridge`) in `RelayedMetrics`. Any dashboard process then serves them; see
`exposition.py`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from cuzk_engine.errors import EngineAPIError, EngineUnreachable
from vastmgr.lib.errors import TransportError
from vastmgr.metrics.models import RelayedMetrics
from vastmgr.remote.cuzk_grpc.client import CuzkClient
from vastmgr.remote.cuzk_grpc.metrics import bridge

if TYPE_CHECKING:
    from vastmgr.controller.hosts import Controller

log = logging.getLogger(__name__)

TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
FANOUT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10)
ENGINE_SCRAPE_TIMEOUT = 5.0
# The engines are scraped this many at a time, the batches spread over this share of the
# relay interval: a thousand scrapes started at once kept the controller's event loop busy for
# over a second every interval, and every push of that second waited (its p99 over 1 s).
SCRAPE_BATCH = 25
SCRAPE_SPREAD = 0.5
FORGET_AFTER = timedelta(hours=1)


class ControllerMetrics:
    """One controller's registry, and the relay task that stores it with its engines' metrics."""

    def __init__(self, name: str, interval: float):
        self.name = name
        self.interval = interval
        self.registry = CollectorRegistry()
        self.tick = Histogram("vastmgr_controller_tick_seconds",
                              "Time one controller tick took", registry=self.registry,
                              buckets=TICK_BUCKETS)
        self.fanout = Histogram(
            "vastmgr_fanout_latency_seconds",
            "From an engine update reaching the controller to the end of the tick that pushed "
            "it to the pages", registry=self.registry, buckets=FANOUT_BUCKETS)
        self.watched = Gauge("vastmgr_controller_hosts_watched",
                             "Hosts this controller watches", registry=self.registry)
        self.pushed_seen: dict[int, float] = {}
        self.relaying = False

    def tick_done(self, controller: Controller, seconds: float) -> None:
        self.tick.observe(seconds)
        now = controller.clock()
        self.watched.set(len(controller.hosts))
        for machine_id, host in controller.hosts.items():
            # `pushed_seen` moves to an update's arrival time when the tick pushes it.
            if (math.isfinite(host.pushed_seen)
                    and host.pushed_seen != self.pushed_seen.get(machine_id)):
                self.pushed_seen[machine_id] = host.pushed_seen
                self.fanout.observe(max(now - host.pushed_seen, 0.0))
        if not self.relaying:
            # A background task of the controller: its shutdown cancels it.
            self.relaying = True
            controller.spawn(self.relay(controller))

    async def relay(self, controller: Controller) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.relay_once(controller)
            except Exception:  # metrics must never stop the controller: log, try again
                log.exception("relaying metrics failed")
            await asyncio.sleep(max(self.interval - (time.monotonic() - started), 0.0))

    async def relay_once(self, controller: Controller) -> None:
        engines: list[tuple[int, object]] = [
            (machine_id, engine.client) for machine_id in controller.hosts
            if (engine := controller.connected_engine(machine_id)) is not None]
        engines += [(machine_id, host.live.daemon) for machine_id, host in controller.hosts.items()
                    if host.live.connected and host.live.daemon is not None]
        batches = math.ceil(len(engines) / SCRAPE_BATCH)
        scrapes = {}
        for batch in range(batches):
            if batch:
                await asyncio.sleep(self.interval * SCRAPE_SPREAD / batches)
            for machine_id, client in engines[batch * SCRAPE_BATCH:(batch + 1) * SCRAPE_BATCH]:
                scrapes[machine_id] = asyncio.create_task(_scrape(client))
        rows = [(RelayedMetrics.Source.CONTROLLER, self.name,
                 generate_latest(self.registry).decode())]
        for machine_id, task in scrapes.items():
            text = await task
            if text is not None:
                rows.append((RelayedMetrics.Source.ENGINE, controller.machine_name(machine_id),
                             text))
        await database_sync_to_async(_store)(rows)


async def _scrape(client) -> str | None:
    try:
        if isinstance(client, CuzkClient):
            return bridge(await asyncio.wait_for(client.get_metrics(), ENGINE_SCRAPE_TIMEOUT))
        return await asyncio.wait_for(client.metrics(), ENGINE_SCRAPE_TIMEOUT)
    except (EngineUnreachable, EngineAPIError, TransportError, TimeoutError):
        return None  # the row ages out: the host's metrics vanish rather than lie


def _store(rows: list[tuple[str, str, str]]) -> None:
    now = timezone.now()
    # One upsert for every row: a thousand hosts' update_or_create (a read and a write each)
    # held the controller's only database thread for 1.5 s every relay interval, and every
    # push of those seconds waited behind it.
    RelayedMetrics.objects.bulk_create(
        [RelayedMetrics(source=source, origin=origin, text=text, fetched_at=now)
         for source, origin, text in rows],
        update_conflicts=True, unique_fields=["source", "origin"],
        update_fields=["text", "fetched_at"])
    # Origins that went away (a removed host, a controller's previous pid) long since.
    RelayedMetrics.objects.filter(fetched_at__lt=now - FORGET_AFTER).delete()


_by_controller: WeakKeyDictionary[Controller, ControllerMetrics] = WeakKeyDictionary()


def tick_done(controller: Controller, seconds: float) -> None:
    """Called by the controller after each tick (the one hook in its loop)."""
    metrics = _by_controller.get(controller)
    if metrics is None:
        name = controller.leases.name if controller.leases is not None else "embedded"
        metrics = _by_controller[controller] = ControllerMetrics(
            name, settings.VASTMGR_METRICS_RELAY_INTERVAL)
    metrics.tick_done(controller, seconds)
