"""Prometheus metrics: cuzk's families read from the live snapshot at scrape time (so they can
never drift from /status), plus per-phase duration histograms observed as jobs end."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cuzk_engine.engine.orchestrator import Engine, Job

_PHASES = ("queue", "srs_load", "synthesis", "gpu", "finalize", "total")
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def _label(kind: str) -> str:
    return kind.replace("-", "_")


class _SnapshotCollector(Collector):
    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        snap = self.engine.snapshot()
        c = snap.counters
        for name, by_kind, doc in (
            ("cuzk_proofs_completed", c.completed_by_kind, "Proofs completed"),
            ("cuzk_proofs_failed", c.failed_by_kind, "Proofs failed"),
            ("cuzk_proofs_cancelled", c.cancelled_by_kind, "Proofs cancelled"),
        ):
            fam = CounterMetricFamily(name, doc, labels=["proof_kind"])
            for kind in self.engine.stages.kinds:
                fam.add_metric([_label(kind)], by_kind.get(kind, 0))
            yield fam
        g = GaugeMetricFamily("cuzk_uptime_seconds", "Seconds since the engine started")
        g.add_metric([], snap.uptime_secs)
        yield g
        q = GaugeMetricFamily("cuzk_queue_depth", "Jobs waiting to start", labels=["proof_kind"])
        for kind in self.engine.stages.kinds:
            q.add_metric([_label(kind)], c.queue_depth_by_kind.get(kind, 0))
        yield q
        running = GaugeMetricFamily("cuzk_running_jobs", "Jobs started and not yet ended")
        running.add_metric([], sum(1 for p in snap.pipelines if p.status == "running"))
        yield running
        workers = GaugeMetricFamily("cuzk_gpu_workers", "Device workers")
        workers.add_metric([], len(snap.gpu_workers))
        yield workers
        busy = GaugeMetricFamily("cuzk_gpu_worker_busy", "1 while the worker holds a device step",
                                 labels=["worker_id", "gpu_ordinal"])
        busy_total = CounterMetricFamily("cuzk_gpu_worker_busy_seconds",
                                         "Seconds the worker spent on device steps",
                                         labels=["worker_id", "gpu_ordinal"])
        for w in snap.gpu_workers:
            labels = [str(w.worker_id), str(w.gpu_ordinal)]
            busy.add_metric(labels, 1 if w.state == "proving" else 0)
            busy_total.add_metric(labels, w.busy_total_secs)
        yield busy
        yield busy_total
        phases = GaugeMetricFamily("cuzk_partitions", "Partitions by phase", labels=["state"])
        counts: dict[str, int] = {}
        for p in snap.pipelines:
            for pt in p.partitions:
                counts[pt.state] = counts.get(pt.state, 0) + 1
        for state, n in sorted(counts.items()):
            phases.add_metric([state], n)
        yield phases
        mem = GaugeMetricFamily("cuzk_memory_bytes", "Memory budget", labels=["kind"])
        mem.add_metric(["total"], snap.memory.total_bytes)
        mem.add_metric(["used"], snap.memory.used_bytes)
        yield mem
        synth = GaugeMetricFamily("cuzk_synthesis_active", "Partitions being synthesized")
        synth.add_metric([], snap.synthesis.active)
        yield synth


class EngineMetrics:
    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        self.registry.register(_SnapshotCollector(engine))
        self.phase = Histogram("cuzk_phase_duration_seconds",
                               "Per-job time spent in each phase (summed over partitions)",
                               ["phase", "proof_kind"], registry=self.registry, buckets=_BUCKETS)
        self.proof = Histogram("cuzk_proof_duration_seconds", "Submit-to-done time of proofs",
                               ["proof_kind"], registry=self.registry, buckets=_BUCKETS)
        engine.job_listeners.append(self.observe)

    def observe(self, job: Job) -> None:
        if job.status != "done":
            return
        t = job.result()["timings"]
        kind = _label(job.kind)
        for phase in _PHASES:
            value = t[f"{phase}_ms"]
            if value is not None:
                self.phase.labels(phase, kind).observe(value / 1000.0)
        self.proof.labels(kind).observe(t["total_ms"] / 1000.0)
