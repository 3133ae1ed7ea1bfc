"""What the dashboard's `/metrics` and `/metrics/engines` answer."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from vastmgr.metrics.fleet import FleetCollector
from vastmgr.metrics.models import RelayedMetrics

# A relayed scrape older than this many relay intervals is no longer served.
FRESH_INTERVALS = 3


class RelayedCollector(Collector):
    """The fresh relayed scrapes of one source, each sample labelled with its origin
    (`controller` or `host`); families of the same name from several origins are merged."""

    def __init__(self, source: str, label: str):
        self.source = source
        self.label = label

    def collect(self) -> Iterator[Metric]:
        fresh = timezone.now() - timedelta(
            seconds=FRESH_INTERVALS * settings.VASTMGR_METRICS_RELAY_INTERVAL)
        merged: dict[str, Metric] = {}
        for origin, text in (RelayedMetrics.objects.filter(source=self.source,
                                                           fetched_at__gte=fresh)
                             .order_by("origin").values_list("origin", "text")):
            for family in text_string_to_metric_families(text):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation,
                                                             family.type, family.unit))
                into.samples.extend(
                    Sample(s.name, {self.label: origin, **s.labels}, s.value, s.timestamp,
                           s.exemplar) for s in family.samples)
        yield from merged.values()


def fleet_exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    registry.register(RelayedCollector(RelayedMetrics.Source.CONTROLLER, "controller"))
    return generate_latest(registry)


def engines_exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayedCollector(RelayedMetrics.Source.ENGINE, "host"))
    return generate_latest(registry)
