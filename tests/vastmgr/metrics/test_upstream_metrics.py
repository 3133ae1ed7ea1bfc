"""Upstream cuzk's metrics exist only inside GetMetrics and break Prometheus' conventions: the
controller scrapes them per machine, renames them (vastmgr.remote.cuzk_grpc.metrics) and the
dashboard serves them on /metrics/engines with a `host` label, and promtool accepts the result."""

import shutil
import subprocess

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.vastmgr.fake_cuzk_daemon import FakeCuzkDaemon
from tests.vastmgr.live_engine import running_controller, wait_until
from tests.vastmgr.remote.test_cuzk_grpc import porep
from vastmgr.fleet.models import Machine
from vastmgr.fleet.transport import DaemonAddress
from vastmgr.metrics.models import RelayedMetrics
from vastmgr.remote.cuzk_grpc.client import CuzkClient
from vastmgr.remote.cuzk_grpc.metrics import DROPPED, bridge

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool not installed (Debian's prometheus package; .ci/run has it)")


def promtool_check(text: str) -> subprocess.CompletedProcess:
    assert promtool is not None
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def proofs(daemon: FakeCuzkDaemon, count: int) -> str:
    """Run `count` PoRep proofs to the end; the daemon's GetMetrics text after them."""
    async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
        for number in range(count):
            await client.submit(porep(f"porep-1000-{number}"))
            await client.await_proof(f"porep-1000-{number}", timeout=20)
        return await client.get_metrics()


@needs_promtool
async def test_upstreams_text_fails_promtool_and_the_bridged_text_passes():
    with FakeCuzkDaemon(synthesis_s=0.01, gpu_s=0.01, srs_load_s=0.01) as daemon:
        upstream = await proofs(daemon, 1)
    refused = promtool_check(upstream)
    assert refused.returncode != 0
    assert 'cuzk_proofs_completed counter metrics should have "_total" suffix' in (
        refused.stdout + refused.stderr)
    bridged = bridge(upstream)
    checked = promtool_check(bridged)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    values = samples(bridged)
    assert values[("cuzk_upstream_proofs_completed_total", frozenset())] == 1
    assert values[("cuzk_upstream_proofs_completed_by_kind_total",
                   frozenset({("kind", "porep-c2")}))] == 1
    assert values[("cuzk_upstream_gpu_workers", frozenset())] == 2
    assert values[(DROPPED, frozenset())] == 0


async def test_the_ring_summary_becomes_gauges_that_may_fall():
    """Upstream's summary counts the last 1000 proofs only (a ring of 2 here): as a gauge it may
    fall, which a summary's _count must never do."""
    with FakeCuzkDaemon(synthesis_s=0.01, gpu_s=0.01, srs_load_s=0.01, ring=2) as daemon:
        values = samples(bridge(await proofs(daemon, 3)))
    kind = frozenset({("kind", "porep-c2")})
    assert values[("cuzk_upstream_proofs_completed_total", frozenset())] == 3
    assert values[("cuzk_upstream_recent_proofs", kind)] == 2
    assert values[("cuzk_upstream_recent_proofs_duration_seconds", kind)] > 0
    families = {f.name: f.type for f in text_string_to_metric_families(bridge(
        "# TYPE cuzk_proof_duration_seconds summary\n"
        'cuzk_proof_duration_seconds_count{proof_kind="snap_update"} 5\n'))}
    assert families["cuzk_upstream_recent_proofs"] == "gauge"


def test_unknown_or_malformed_samples_are_dropped_and_counted():
    values = samples(bridge("cuzk_new_thing 3\ncuzk_running_jobs NaN\ncuzk_gpu_workers{x=} 1\n"
                            "cuzk_running_jobs 2\n"))
    assert values[(DROPPED, frozenset())] == 3
    assert values[("cuzk_upstream_running_jobs", frozenset())] == 2


@needs_promtool
@pytest.mark.django_db(transaction=True)
async def test_the_controller_relays_a_daemons_metrics_with_a_host_label(monkeypatch, settings):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    settings.VASTMGR_METRICS_RELAY_INTERVAL = 0.5
    with FakeCuzkDaemon(synthesis_s=0.01, gpu_s=0.01, srs_load_s=0.01) as daemon:
        await proofs(daemon, 2)
        machine = await Machine.objects.acreate(
            name="curio-metrics", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour="cuzk-upstream", state="running")
        async with running_controller():
            await wait_until(lambda: RelayedMetrics.objects.filter(
                source="engine", origin=machine.name).aexists(), timeout=15)
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            truth = await client.get_status()
    response = await sync_to_async(Client(REMOTE_ADDR="127.0.0.1").get)("/metrics/engines")
    assert response.status_code == 200
    body = response.content.decode()
    values = samples(body)
    host = frozenset({("host", "curio-metrics")})
    assert values[("cuzk_upstream_proofs_completed_total", host)] == truth.total_proofs_completed
    assert values[("cuzk_upstream_proofs_completed_by_kind_total",
                   host | {("kind", "porep-c2")})] == 2
    checked = promtool_check(body)
    assert checked.returncode == 0, checked.stdout + checked.stderr
