"""The dashboard's /metrics: the fleet's figures from the database, who may read them, and the
relayed scrapes with their origin label."""

import asyncio
import math
from datetime import timedelta
from decimal import Decimal

import aiohttp
import pytest
from aiohttp import web
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cuzk_engine.daemon.client import EngineClient
from vastmgr.controller.hosts import WatchedMachine
from vastmgr.controller.instrumentation import SCRAPE_BATCH, SCRAPE_SPREAD, ControllerMetrics
from vastmgr.controller.service import FleetController
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Event, Machine, MachineStatus
from vastmgr.front.publish import LayerPublisher
from vastmgr.metrics.models import RelayedMetrics
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


def scrape(path: str = "/metrics", **headers) -> dict[tuple[str, frozenset], float]:
    response = Client(REMOTE_ADDR="127.0.0.1").get(path, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def finished_job(machine, kind: str, status: str, seconds: float) -> ProofJob:
    end = timezone.now()
    return ProofJob.objects.create(machine=machine, kind=kind, seed=1, status=status,
                                   started_at=end - timedelta(seconds=seconds), finished_at=end)


def test_fleet_figures_match_the_database(settings):
    settings.VASTMGR_BUDGET_DOLLARS_PER_HOUR = 2.5
    gpu = Machine.objects.create(name="gpu-1", provider="vast", state="running",
                                 price_per_hour=Decimal("0.5"), last_seen=timezone.now())
    ledger.bill(gpu, "running", gpu.price_per_hour, gpus=1, cause="rent",
                at=timezone.now() - timedelta(hours=2))
    MachineStatus.objects.create(machine=gpu, connected=True, interval=1.0, snapshot_at=timezone.now(),
                              snapshot={"uptime_secs": 100, "gpu_workers": [
                                  {"state": "proving"}, {"state": "idle"}], "pipelines": []})
    Machine.objects.create(name="spare", provider="ssh", state="stopped")
    finished_job(gpu, "porep-c2", "done", 3)
    finished_job(gpu, "porep-c2", "done", 40)
    finished_job(gpu, "porep-c2", "failed", 1)
    ProofJob.objects.create(kind="winning-post", seed=2, status="failed", error="no machine")
    ProofJob.objects.create(kind="snap-update", seed=3,
                            submitted_at=timezone.now() - timedelta(seconds=90))
    Event.record("ssh", "gpu-1: connection refused", machine=gpu, level=Event.Level.ERROR)

    s = scrape()
    assert value(s, "vastmgr_hosts", state="running", connection="live") == 1
    assert value(s, "vastmgr_hosts", state="stopped", connection="offline") == 1
    assert value(s, "vastmgr_hosts", state="running", connection="offline") == 0
    assert value(s, "vastmgr_host_up", host="gpu-1") == 1
    assert value(s, "vastmgr_host_up", host="spare") == 0
    assert value(s, "vastmgr_host_state", host="spare", state="stopped") == 1
    assert value(s, "vastmgr_host_gpu_workers", host="gpu-1", state="proving") == 1
    assert value(s, "vastmgr_host_engine_uptime_seconds", host="gpu-1") >= 100
    assert value(s, "vastmgr_host_cost_dollars_per_hour", host="gpu-1") == 0.5
    assert value(s, "vastmgr_host_spent_dollars_total", host="gpu-1") == pytest.approx(1.0, 0.01)
    assert value(s, "vastmgr_budget_dollars_per_hour") == 2.5
    assert value(s, "vastmgr_proofs_total", kind="porep-c2", host="gpu-1", status="done") == 2
    assert value(s, "vastmgr_proofs_total", kind="porep-c2", host="gpu-1", status="failed") == 1
    assert value(s, "vastmgr_proofs_total", kind="winning-post", host="none",
                 status="failed") == 1
    assert value(s, "vastmgr_proof_duration_seconds_count", kind="porep-c2") == 2
    assert value(s, "vastmgr_proof_duration_seconds_sum", kind="porep-c2") == pytest.approx(43)
    assert value(s, "vastmgr_proof_duration_seconds_bucket", kind="porep-c2", le="5.0") == 1
    assert value(s, "vastmgr_proof_duration_seconds_bucket", kind="porep-c2", le="60.0") == 2
    assert value(s, "vastmgr_proof_duration_seconds_bucket", kind="porep-c2", le="+Inf") == 2
    assert value(s, "vastmgr_backlog_jobs", kind="snap-update") == 1
    assert value(s, "vastmgr_backlog_jobs", kind="porep-c2") == 0
    assert 90 <= value(s, "vastmgr_backlog_oldest_age_seconds", kind="snap-update") < 120
    assert value(s, "vastmgr_backlog_budget_seconds", kind="winning-post") == 20
    assert value(s, "vastmgr_events_total", event_kind="ssh", level="error") == 1
    assert value(s, "vastmgr_events_total", event_kind="vast", level="error") == 0
    # No job ids anywhere: every label value is bounded.
    assert not any(str(job.pk) in str(labels) for job in ProofJob.objects.all()
                   for _, labels in s)


def test_upstream_lies_per_host_and_code():
    host = Machine.objects.create(name="curio-1", engine_flavour="cuzk-upstream",
                                  state="running", last_seen=timezone.now())
    MachineStatus.objects.create(machine=host, connected=True, snapshot={
        "lies": [{"code": "gpu_without_worker"}],
        "lie_tally": [{"code": "gpu_without_worker", "title": "t", "episodes": 3, "snapshots": 9,
                       "first_seen": 1.0, "last_seen": 2.0, "present": True},
                      {"code": "buffer_wrapped", "title": "t", "episodes": 1, "snapshots": 1,
                       "first_seen": 1.0, "last_seen": 1.0, "present": False}]})
    s = scrape()
    assert value(s, "vastmgr_upstream_lie", host="curio-1", code="gpu_without_worker") == 1
    assert value(s, "vastmgr_upstream_lie", host="curio-1", code="buffer_wrapped") == 0
    assert value(s, "vastmgr_upstream_lie_episodes_total", host="curio-1",
                 code="gpu_without_worker") == 3


def test_relayed_scrapes_carry_their_origin_and_age_out(settings):
    settings.VASTMGR_METRICS_RELAY_INTERVAL = 15.0
    now = timezone.now()
    text = ("# HELP cuzk_proofs_completed_total Proofs completed\n"
            "# TYPE cuzk_proofs_completed_total counter\n"
            'cuzk_proofs_completed_total{proof_kind="porep_c2"} 4.0\n')
    RelayedMetrics.objects.create(source="engine", origin="gpu-1", text=text, fetched_at=now)
    RelayedMetrics.objects.create(source="engine", origin="gpu-2", text=text.replace("4.0", "7.0"),
                                  fetched_at=now)
    RelayedMetrics.objects.create(source="engine", origin="gone", text=text,
                                  fetched_at=now - timedelta(seconds=46))
    RelayedMetrics.objects.create(
        source="controller", origin="ctl-1", fetched_at=now,
        text="# TYPE vastmgr_controller_hosts_watched gauge\nvastmgr_controller_hosts_watched 2\n")
    engines = scrape("/metrics/engines")
    assert value(engines, "cuzk_proofs_completed_total", host="gpu-1", proof_kind="porep_c2") == 4
    assert value(engines, "cuzk_proofs_completed_total", host="gpu-2", proof_kind="porep_c2") == 7
    assert not any(dict(labels).get("host") == "gone" for _, labels in engines)
    assert value(scrape(), "vastmgr_controller_hosts_watched", controller="ctl-1") == 2


def test_a_relay_stores_one_row_per_origin_with_its_latest_scrape():
    """The controller stores all its hosts' scrapes in one upsert: a scrape from an origin
    already stored replaces that row's text and time, a new origin gets its own row."""
    from vastmgr.controller.instrumentation import _store

    _store([("engine", "gpu-1", "a 1\n"), ("controller", "ctl-1", "c 1\n")])
    first = RelayedMetrics.objects.get(source="engine", origin="gpu-1").fetched_at
    _store([("engine", "gpu-1", "a 2\n"), ("engine", "gpu-2", "b 1\n")])
    rows = {(r.source, r.origin): r for r in RelayedMetrics.objects.all()}
    assert {key: r.text for key, r in rows.items()} == {
        ("engine", "gpu-1"): "a 2\n", ("engine", "gpu-2"): "b 1\n",
        ("controller", "ctl-1"): "c 1\n"}
    assert rows["engine", "gpu-1"].fetched_at > first


@pytest.mark.django_db(transaction=True)
async def test_a_relay_scrapes_its_engines_a_batch_at_a_time_spread_over_the_interval():
    """Real HTTP scrapes of 100 engines' /metrics (one server, a path per engine), timed where
    they arrive: never more than a batch at once (a thousand scrapes started together held
    the controller's event loop for over a second), the last batch started within the
    interval's spread share, and every engine's answer stored."""
    hosts, interval = 4 * SCRAPE_BATCH, 4.0
    batches = math.ceil(hosts / SCRAPE_BATCH)
    gap = interval * SCRAPE_SPREAD / batches
    loop = asyncio.get_running_loop()
    arrivals: list[float] = []

    async def metrics(request):
        arrivals.append(loop.time())
        return web.Response(text=f"engine_number {request.match_info['host']}\n")

    app = web.Application()
    app.router.add_get("/{host}/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    controller = FleetController(publisher=LayerPublisher())
    async with aiohttp.ClientSession() as session:
        for host in range(hosts):
            controller.hosts[host] = WatchedMachine(MachineLive(host, connected=True, client=EngineClient(
                f"http://127.0.0.1:{port}/{host}", session=session)))
        try:
            started = loop.time()
            await ControllerMetrics("test", interval).relay_once(controller)
        finally:
            await runner.cleanup()
    arrivals.sort()
    assert len(arrivals) == hosts
    # Any batch and one more scrape span at least the better part of a gap between batches.
    assert min(arrivals[i + SCRAPE_BATCH] - arrivals[i]
               for i in range(hosts - SCRAPE_BATCH)) > gap / 2
    assert arrivals[-1] - started < interval * SCRAPE_SPREAD
    stored = await database_sync_to_async(lambda: dict(
        RelayedMetrics.objects.filter(source="engine").values_list("origin", "text")))()
    assert stored == {str(host): f"engine_number {host}\n" for host in range(hosts)}


@pytest.mark.parametrize("path", ["/metrics", "/metrics/engines"])
def test_who_may_read_metrics(settings, path):
    settings.VASTMGR_METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="127.0.0.1").get(path).status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get(path).status_code == 403
    # Through a proxy on the same machine: the forwarded header shows it is not local.
    forwarded = Client(REMOTE_ADDR="127.0.0.1").get(path, headers={"X-Forwarded-For": "1.2.3.4"})
    assert forwarded.status_code == 403
    settings.VASTMGR_METRICS_TOKEN = "s3cret"
    assert Client(REMOTE_ADDR="127.0.0.1").get(path).status_code == 403
    assert Client(REMOTE_ADDR="10.1.2.3").get(
        path, headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert Client(REMOTE_ADDR="10.1.2.3").get(
        path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert Client().post(path).status_code in (403, 405)
