"""Upstream cuzk's Prometheus text (only inside `GetMetrics`) renamed to Prometheus' conventions.

Upstream writes (cuzk-server/src/service.rs, `get_metrics`) a counter without `_total`
(`cuzk_proofs_completed{proof_kind}`, beside `cuzk_proofs_completed_total` without labels), a
summary whose `_count`/`_sum` come from a ring of the last 1,000 proofs (so they fall as old
proofs leave it: not a summary), and `porep_c2`-style kinds where its status says `porep-c2`. The
bridge maps every series it knows to a conventional name, type and label (the table below; docs/
upstream-cuzk.md prints it), drops what it does not know, and counts the drops in
`cuzk_upstream_bridge_dropped_samples` so an upstream change shows instead of passing silently.
The fleet controller adds nothing else: the dashboard's `/metrics/engines` adds the `host` label.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vastmgr.fleet.lie_detector import METRIC_LABEL


@dataclass(frozen=True)
class Bridged:
    name: str  # without the `_total` a counter's sample gets
    kind: str  # counter | gauge
    help: str


# Upstream sample name -> the bridged family.
MAPPING: dict[str, Bridged] = {
    "cuzk_proofs_completed_total": Bridged(
        "cuzk_upstream_proofs_completed", "counter",
        "Proofs the daemon completed, every path (upstream cuzk_proofs_completed_total)"),
    "cuzk_proofs_failed_total": Bridged(
        "cuzk_upstream_proofs_failed", "counter",
        "Proofs the daemon failed, every path (upstream cuzk_proofs_failed_total)"),
    "cuzk_proofs_completed": Bridged(
        "cuzk_upstream_proofs_completed_by_kind", "counter",
        "Proofs completed, by kind (upstream cuzk_proofs_completed, a counter without _total)"),
    "cuzk_proofs_failed": Bridged(
        "cuzk_upstream_proofs_failed_by_kind", "counter",
        "Proofs failed, by kind (upstream cuzk_proofs_failed, a counter without _total)"),
    "cuzk_uptime_seconds": Bridged(
        "cuzk_upstream_uptime_seconds", "gauge", "Seconds since the daemon started"),
    "cuzk_queue_depth": Bridged(
        "cuzk_upstream_queued_jobs", "gauge",
        "Jobs in the daemon's scheduler heap, not started; partitions waiting for synthesis or "
        "a GPU are not counted (upstream cuzk_queue_depth)"),
    "cuzk_running_jobs": Bridged(
        "cuzk_upstream_running_jobs", "gauge", "Proofs a GPU worker holds now"),
    "cuzk_gpu_workers": Bridged(
        "cuzk_upstream_gpu_workers", "gauge", "GPU workers (gpu_workers_per_device per GPU)"),
    "cuzk_proof_duration_seconds_count": Bridged(
        "cuzk_upstream_recent_proofs", "gauge",
        "Proofs among the daemon's last 1000, by kind (upstream's summary _count: it falls as "
        "proofs leave the ring, so it is a gauge)"),
    "cuzk_proof_duration_seconds_sum": Bridged(
        "cuzk_upstream_recent_proofs_duration_seconds", "gauge",
        "Total duration of those recent proofs, by kind (upstream's summary _sum)"),
}
DROPPED = "cuzk_upstream_bridge_dropped_samples"
# Upstream's metric labels (ProofKind::metric_label) in the kinds /status and GetStatus use.
KINDS = {label: kind for kind, label in METRIC_LABEL.items()}

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def _labels(text: str) -> dict[str, str] | None:
    labels, position = {}, 0
    while position < len(text):
        match = LABEL.match(text, position)
        if match is None:
            return None
        labels[match.group(1)] = match.group(2).encode().decode("unicode_escape")
        position = match.end()
    return labels


def bridge(upstream_text: str) -> str:
    """The daemon's GetMetrics text with every known series renamed (see MAPPING)."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    label_names: dict[str, list[str]] = {}
    dropped = 0
    for line in upstream_text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        bridged = MAPPING.get(match.group(1)) if match else None
        labels = _labels(match.group(2) or "") if match else None
        try:
            value = float(match.group(3)) if match else math.nan
        except ValueError:
            value = math.nan
        if match is None or bridged is None or labels is None or math.isnan(value):
            dropped += 1
            continue
        renamed = {("kind" if key == "proof_kind" else key):
                   (KINDS.get(val, val) if key == "proof_kind" else val)
                   for key, val in labels.items()}
        names = label_names.setdefault(bridged.name, sorted(renamed))
        if names != sorted(renamed):  # one family, one set of labels
            dropped += 1
            continue
        family = families.get(bridged.name)
        if family is None:
            family = families[bridged.name] = (
                CounterMetricFamily(bridged.name, bridged.help, labels=names)
                if bridged.kind == "counter" else
                GaugeMetricFamily(bridged.name, bridged.help, labels=names))
        family.add_metric([renamed[key] for key in names], value)
    dropped_family = GaugeMetricFamily(
        DROPPED, "Samples of the daemon's GetMetrics the bridge does not know (dropped)")
    dropped_family.add_metric([], dropped)
    families[DROPPED] = dropped_family
    return _exposition(list(families.values()))


class _Fixed(Collector):
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return iter(self.families)


def _exposition(families: list[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry).decode()
