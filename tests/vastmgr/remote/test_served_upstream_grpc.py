"""Curio's cuzk daemon as Curio deploys it (gRPC on a unix socket, HTTP status server off) on a
machine behind the real OpenSSH server, driven on the served stack (`manage.py up`) over HTTP
as an operator's browser would: added from the form, watched, its metrics bridged onto
/metrics/engines, an SRS preloaded, a benchmark proof run to completion, a lie flagged; each page
held to the daemon's own answer (GetStatus) or the database at that moment."""

from __future__ import annotations

import asyncio
import html as entities
import json
import os
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import eventually
from tests.vastmgr.fake_cuzk_daemon import FakeCuzkDaemon, FakeGPU
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache
from vastmgr.fleet.transport import DaemonAddress
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.client import CuzkClient

from .served import Operator, machine_id, served_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

C1 = json.dumps({"registered_proof": "StackedDrg32GiBV1_1", "vanilla_proofs": {}})


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The fake daemon on a unix socket the machine's SSH user may open, as Curio's would."""
    run = tmp_path_factory.mktemp("curio-run")
    for folder in (run, *run.parents):
        if folder == Path("/"):
            break
        os.chmod(folder, os.stat(folder).st_mode | 0o001)
    with FakeCuzkDaemon(socket_path=run / "cuzk.sock", gpus=[FakeGPU(0, name="NVIDIA L40S")],
                        synthesis_s=1.0, gpu_s=2.0) as fake:
        os.chmod(run / "cuzk.sock", 0o777)
        yield fake


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, sshd):  # noqa: F811 - the fixture imported above
    yield from served_stack(tmp_path_factory.mktemp("served-grpc"), param_cache, {
        "VASTMGR_UPSTREAM_INTERVAL": "0.5", "VASTMGR_METRICS_RELAY_INTERVAL_S": "1"})


def daemon_call(daemon: FakeCuzkDaemon, call):
    """One call to the daemon as Curio (or anyone on its host) would make it."""
    async def run():
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            return await call(client)
    return asyncio.run(run())


def submit_as_curio(daemon: FakeCuzkDaemon, job: str) -> None:
    daemon_call(daemon, lambda c: c.submit(pb.SubmitProofRequest(
        request_id=job, proof_kind=pb.POREP_SEAL_COMMIT, sector_size=32 << 30,
        registered_proof=8, vanilla_proof=C1.encode(), sector_number=1, miner_id=1000)))


def panel(operator: Operator, machine: int) -> str:
    answer = operator.get(f"/fragments/machines/{machine}/")
    assert answer.status == 200
    return answer.body


def test_an_upstream_daemon_on_a_unix_socket_behind_sshd(stack, operator, sshd, daemon,
                                                         key_file, tmp_path):
    form = "/remote/machines/add/"
    assert 'name="engine_url"' in operator.get(form).body
    added = operator.post(form, {
        "name": "curio-served", "host": "127.0.0.1", "ssh_port": sshd.port,
        "ssh_user": sshd.user, "private_key": "", "key_file": str(key_file), "engine_port": "",
        "engine_flavour": "cuzk-upstream", "engine_url": daemon.url, "price_per_hour": "1.8",
        "then": ""})
    assert added.status == 200 and "/remote/machines/" in added.url, added.body[:300]
    machine = machine_id(stack, "curio-served")

    # Curio's load: one PoRep proving on the GPU's two workers, one waiting.
    for job in ("porep-1000-1", "porep-1000-2", "porep-1000-3"):
        submit_as_curio(daemon, job)

    def watched() -> str | None:
        body = panel(operator, machine)
        return body if 'data-queue="porep-c2"' in body and "data-gpu-job=" in body else None

    shown = eventually(watched, 60, "the panel never showed the daemon's GPUs and queues")
    truth = daemon_call(daemon, lambda c: c.get_status())
    assert 'data-gpu="0"' in shown and "NVIDIA L40S" in shown
    busy = {g.current_job_id for g in truth.gpus if g.current_job_id}
    assert busy == set(re.findall(r'data-gpu-job="([^"]+)"', shown))
    pending = dict(re.findall(r'<tr data-queue="([\w-]+)"><td>[\w-]+</td><td>(\d+)</td>', shown))
    assert {k: int(v) for k, v in pending.items()} == {q.proof_kind: q.pending
                                                     for q in truth.queues}
    assert "HTTP status server is off" in entities.unescape(shown)
    assert 'data-lie="gpus-per-worker"' in shown and 'data-lie="pinned-unreported"' in shown
    assert "srs-unlisted" in shown  # proving PoRep with no porep SRS listed
    assert sshd.log().count("Accepted publickey") == 1  # one SSH connection for all of it

    # Its metrics, bridged and labelled.
    def bridged() -> dict | None:
        answer = operator.get("/metrics/engines")
        assert answer.status == 200
        values = {(s.name, frozenset(s.labels.items())): s.value
                  for f in text_string_to_metric_families(answer.body) for s in f.samples}
        key = ("cuzk_upstream_gpu_workers", frozenset({("host", "curio-served")}))
        return values if key in values else None

    values = eventually(bridged, 30, "/metrics/engines never carried the daemon's series")
    assert values[("cuzk_upstream_gpu_workers", frozenset({("host", "curio-served")}))] == 2

    # An SRS preload from the machine page reaches the daemon.
    page = f"/machines/{machine}/"
    preload = operator.post(f"/machines/{machine}/srs/",
                            {"action": "preload", "circuit_id": "snap-32g"}, form=page)
    assert preload.status == 200
    eventually(lambda: daemon.calls("PreloadSRS") == ["snap-32g"], 30, "no PreloadSRS")
    eventually(lambda: 'data-daemon-circuit="snap-32g"' in panel(operator, machine), 30,
               "the preloaded SRS never showed")

    # A benchmark proof from a C1 output on the dashboard's disk, run to completion.
    c1 = tmp_path / "c1.json"
    c1.write_text(C1)
    submitted = operator.post(f"/machines/{machine}/benchmarks/", {
        "proof_kind": "porep-c2", "registered_proof": 8, "sector_size": 32 << 30,
        "miner_id": 1000, "sector_number": 9, "randomness": "", "partition_index": 0,
        "input_path": str(c1)}, form=page)
    assert submitted.status == 200 and "Benchmark 1 (porep-c2) stored" in submitted.body

    def completed() -> str | None:
        body = panel(operator, machine)
        return body if 'data-benchmark-status="completed"' in body else None

    done = eventually(completed, 90, "the benchmark never completed on the panel")
    (total_ms,), = stack.query("SELECT total_ms FROM proofs_benchmarkproof")
    rate = 3_600_000 / total_ms
    assert f'data-total-ms="{total_ms}"' in done and f'data-rate="{rate:.2f}"' in done
    assert f"{1.8 / rate:.4f}" in done  # $/proof at the machine's price
    assert daemon.calls("SubmitProof")[-1] == "vastmgr-bench-1"
