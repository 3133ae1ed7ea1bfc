"""Watching Curio's cuzk daemon through its gRPC API (GetStatus), merged with its status server
when that is on, and flagging where the two mislead. The daemon is the strict fake
(fake_cuzk_daemon.py); its status server, when a test turns it on, is fake_upstream.py."""

import html as entities
import json
import re
import time
import urllib.request
from decimal import Decimal

import asyncssh
import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from tests.vastmgr.controller.test_upstream import lies_in
from tests.vastmgr.fake_cuzk_daemon import FakeCuzkDaemon, FakeGPU
from tests.vastmgr.live_engine import running_controller, wait_until
from tests.vastmgr.remote.test_cuzk_grpc import C1_OUTPUT, porep
from vastmgr.controller.upstream import STATUS_OFF, map_daemon_status, merge_sources
from vastmgr.fleet.lie_detector import LieDetector
from vastmgr.fleet.models import Event, Machine, MachineAction, MachineStatus
from vastmgr.fleet.transport import DaemonAddress
from vastmgr.front import fragments, readmodel
from vastmgr.front.fleet_row import render_fleet_row
from vastmgr.proofs.models import BenchmarkProof
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.client import CuzkClient

UPSTREAM = Machine.Flavour.CUZK_UPSTREAM
NR = "not reported"


async def status_of(daemon: FakeCuzkDaemon):
    async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
        return await client.get_status()


async def proving(daemon: FakeCuzkDaemon, job: str) -> None:
    """Submit a PoRep as Curio would, and wait until a GPU worker holds it."""
    async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
        await client.submit(porep(job))
        deadline = time.monotonic() + 10
        while not any(g.current_job_id == job for g in (await client.get_status()).gpus):
            assert time.monotonic() < deadline, f"{job} never reached a GPU"


def checked(raw, problem, status, detector=None):
    detector = detector or LieDetector()
    merged = merge_sources(raw, problem, status, 1)
    return merged, {lie.code for lie in detector.check(merged, time.time())}


# ---- the mapping ----------------------------------------------------------------------------

async def test_get_status_is_gathered_per_gpu_and_hard_coded_zeros_are_not_reported():
    with FakeCuzkDaemon(gpus=[FakeGPU(0), FakeGPU(1)], synthesis_s=5, gpu_s=5) as daemon:
        await proving(daemon, "porep-1000-42")
        mapped = map_daemon_status(await status_of(daemon))
    assert [g["ordinal"] for g in mapped["gpus"]] == [0, 1]
    assert [g["entries"] for g in mapped["gpus"]] == [2, 2]
    jobs = [j for g in mapped["gpus"] for j in g["jobs"]]
    assert jobs == [{"job_id": "porep-1000-42", "proof_kind": "porep-c2"}]
    assert mapped["gpus"][0]["vram_total_bytes"] == 32 << 30
    assert "pinned_memory_bytes" not in mapped and "pinned_memory_limit_bytes" not in mapped
    assert mapped["total_proofs_completed"] == 0  # a real 0 stays 0


async def test_a_gpu_nvidia_smi_did_not_list_has_no_name_or_vram():
    with FakeCuzkDaemon(gpus=[], workers_per_gpu=1) as daemon:
        daemon.state.workers.append((3, None))  # a worker on ordinal 3, which nvidia-smi lacks
        mapped = map_daemon_status(await status_of(daemon))
    assert mapped["gpus"] == [{"ordinal": 3, "entries": 1, "jobs": []}]


# ---- the lies, each caught against the fake ------------------------------------------------

async def test_gpus_listed_once_per_worker_are_flagged():
    with FakeCuzkDaemon(workers_per_gpu=2) as two, FakeCuzkDaemon(workers_per_gpu=1) as one:
        assert "gpus-per-worker" in checked(None, STATUS_OFF, await status_of(two))[1]
        assert "gpus-per-worker" not in checked(None, STATUS_OFF, await status_of(one))[1]


async def test_hard_coded_pinned_memory_and_srs_fields_are_flagged():
    with FakeCuzkDaemon() as daemon:
        _, before = checked(None, STATUS_OFF, await status_of(daemon))
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            await client.preload_srs("porep-32g")
        _, after = checked(None, STATUS_OFF, await status_of(daemon))
    assert "pinned-unreported" in before and "srs-hardcoded" not in before
    assert {"pinned-unreported", "srs-hardcoded"} <= after


async def test_an_srs_loaded_on_demand_is_missing_from_loaded_srs():
    with FakeCuzkDaemon(synthesis_s=5, gpu_s=5) as daemon:
        await proving(daemon, "porep-1000-43")
        _, lies = checked(None, STATUS_OFF, await status_of(daemon))
        assert "srs-unlisted" in lies
    with FakeCuzkDaemon(synthesis_s=5, gpu_s=5) as preloaded:
        async with CuzkClient(DaemonAddress.parse(preloaded.url).target) as client:
            await client.preload_srs("porep-32g")
        await proving(preloaded, "porep-1000-44")
        assert "srs-unlisted" not in checked(None, STATUS_OFF, await status_of(preloaded))[1]


async def test_one_kind_under_three_names_is_flagged():
    """GetStatus calls a PoRep's SRS porep-32g and its job porep-c2; the metrics say porep_c2."""
    with FakeCuzkDaemon() as daemon:
        assert "kind-names" not in checked(None, STATUS_OFF, await status_of(daemon))[1]
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            await client.preload_srs("porep-32g")
        merged = merge_sources(None, STATUS_OFF, await status_of(daemon), 1)
    lies = {lie.code: lie for lie in LieDetector().check(merged, time.time())}
    assert lies["kind-names"].title == \
        "porep-c2 is porep-32g in loaded_srs and porep_c2 in the metrics"


def status_of_server(daemon: FakeCuzkDaemon) -> dict:
    """The daemon's GET /status, over HTTP as the watcher reads it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.status_port}/status",
                                timeout=5) as answer:
        return json.loads(answer.read())


async def on_the_gpu(daemon: FakeCuzkDaemon) -> dict:
    """/status once a partition is on the GPU (after the SRS load and the synthesis)."""

    def with_a_partition_on_the_gpu() -> dict | None:
        raw = status_of_server(daemon)
        on_gpu = any(p["state"] == "gpu" for pipe in raw["pipelines"] for p in pipe["partitions"])
        return raw if on_gpu else None

    return await wait_until(with_a_partition_on_the_gpu, timeout=10, every=0.05)


async def test_status_counters_below_the_grpc_totals_are_flagged():
    """A WinningPoSt proof is monolithic: it ends through the gRPC path only, so GetStatus
    counts it and /status does not."""
    with FakeCuzkDaemon(synthesis_s=0.05, gpu_s=0.05, status_listen=True) as daemon:
        assert "counters-undercount" not in checked(status_of_server(daemon), "",
                                                    await status_of(daemon))[1]
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            await client.submit(pb.SubmitProofRequest(
                request_id="winning-1", proof_kind=pb.WINNING_POST, sector_size=32 << 30,
                registered_proof=4, vanilla_proofs=[b"sector proof"], randomness=b"r" * 32))
            await client.await_proof("winning-1", timeout=10)
        raw = status_of_server(daemon)
        merged, lies = checked(raw, "", await status_of(daemon))
    assert raw["counters"]["total_completed"] == 0 and raw["pipelines"] == []
    assert merged["daemon"]["total_proofs_completed"] == 1
    assert "counters-undercount" in lies
    assert merged["sources"]["pipelines"] == "GET /status"


async def test_queues_that_leave_out_waiting_partitions_are_flagged():
    """While one partition of a PoRep is on the GPU, the other nine wait for it (synth_done in
    /status); GetStatus' queues count only jobs not started, so they read 0 pending."""
    with FakeCuzkDaemon(synthesis_s=0.1, gpu_s=10, status_listen=True) as daemon:
        await proving(daemon, "porep-1000-45")
        raw = await on_the_gpu(daemon)
        status = await status_of(daemon)
    states = [p["state"] for p in raw["pipelines"][0]["partitions"]]
    assert states.count("gpu") == 1 and states.count("synth_done") == 9
    assert not status.queues or all(q.pending == 0 for q in status.queues)
    _, lies = checked(raw, "", status)
    assert "queue-hides-partitions" in lies
    # The fake's /status keeps upstream's invariants otherwise: no other lie of /status.
    assert lies - {"queue-hides-partitions", "gpus-per-worker", "pinned-unreported",
                   "srs-unlisted"} == set()


# ---- the controller and the panel -----------------------------------------------------------

@pytest.mark.django_db(transaction=True)
async def test_a_daemon_on_a_unix_socket_is_watched_through_get_status(monkeypatch):
    """Curio's own configuration: gRPC on a unix socket, the status server off."""
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    with FakeCuzkDaemon(gpus=[FakeGPU(0, name="NVIDIA RTX A6000")], synthesis_s=30,
                        gpu_s=30) as daemon:
        machine = await Machine.objects.acreate(
            name="curio-grpc", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running")
        async with running_controller() as controller:
            await wait_until(lambda: controller.hosts.get(machine.pk)
                             and controller.hosts[machine.pk].live.connected)
            await proving(daemon, "porep-1000-46")
            async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
                await client.submit(porep("porep-1000-47"))
                await client.submit(porep("porep-1000-48"))
            live = await wait_until(
                lambda: (s := controller.hosts[machine.pk].live.snapshot) and
                any(q["pending"] for q in s["daemon"]["queues"])
                and controller.hosts[machine.pk].live, timeout=10)
            truth = await status_of(daemon)
            assert live.client is None  # watched, never given work
            await wait_until(lambda: MachineStatus.objects.filter(
                machine=machine, snapshot__daemon__queues__0__pending__gte=1).aexists())
        html = await database_sync_to_async(fragments.render_machine_panel)(
            await Machine.objects.aget(pk=machine.pk))
    # The panel against the daemon's own answer at that moment.
    assert 'data-gpu="0"' in html and "NVIDIA RTX A6000" in html
    busy = {g.current_job_id for g in truth.gpus if g.current_job_id}
    assert busy and all(f'data-gpu-job="{job}"' in html for job in busy)
    pending = {q.proof_kind: q.pending for q in truth.queues}
    row = re.search(r'<tr data-queue="porep-c2"><td>porep-c2</td><td>(\d+)</td>', html)
    assert row and int(row.group(1)) == pending["porep-c2"]
    sources = {part: entities.unescape(source) for part, source in re.findall(
        r'data-source="(\w+)">\w+: (?:<b>|<span class="not-reported">)([^<]+)<', html)}
    assert sources["gpus"] == "GetStatus" and sources["queues"] == "GetStatus"
    assert sources["pipelines"].startswith("not reported: the daemon's HTTP status server is off")
    assert "Pipelines <span class=\"not-reported\"" in html
    assert {"gpus-per-worker", "pinned-unreported", "srs-unlisted"} <= lies_in(html)
    assert "through its gRPC API at <code>unix:///" in html
    # The fleet's row and count read the GPUs GetStatus lists, as for our engine's devices.
    view = (await database_sync_to_async(readmodel.load_machines)(time.time(), [machine.pk]))[0]
    assert '<td class="gpu-cell">1 × NVIDIA RTX A6000</td>' in render_fleet_row(view)
    assert await database_sync_to_async(readmodel.gpus_on_engines)([view]) == 1


@pytest.mark.django_db(transaction=True)
async def test_with_the_status_server_on_both_sources_are_merged(monkeypatch):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    with FakeCuzkDaemon(synthesis_s=0.1, gpu_s=10, status_listen=True) as daemon:
        machine = await Machine.objects.acreate(
            name="curio-both", provider="local", host="127.0.0.1", engine_port=daemon.status_port,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running")
        await proving(daemon, "porep-1000-50")
        await on_the_gpu(daemon)
        async with running_controller() as controller:
            live = await wait_until(lambda: controller.hosts.get(machine.pk)
                                    and controller.hosts[machine.pk].live.connected
                                    and controller.hosts[machine.pk].live)
        assert daemon.status_server is not None and daemon.status_server.requests
    assert live.snapshot["sources"]["pipelines"] == "GET /status"
    assert live.snapshot["sources"]["gpus"] == "GetStatus"
    assert [p["job_id"] for p in live.snapshot["pipelines"]] == ["porep-1000-50"]
    assert [w["current_job"] for w in live.snapshot["gpu_workers"]].count("porep-1000-50") == 1
    assert live.snapshot["daemon"]["gpus"][0]["jobs"] == [
        {"job_id": "porep-1000-50", "proof_kind": "porep-c2"}]
    assert "queue-hides-partitions" in {lie["code"] for lie in live.snapshot["lies"]}


@pytest.mark.django_db(transaction=True)
async def test_a_daemon_that_does_not_answer_get_status_is_down_with_the_reason(monkeypatch,
                                                                               tmp_path):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    machine = await Machine.objects.acreate(
        name="curio-gone", provider="local", host="127.0.0.1", engine_port=0,
        engine_url=f"unix://{tmp_path}/cuzk.sock", engine_flavour=UPSTREAM, state="running")
    async with running_controller() as controller:
        live = await wait_until(lambda: controller.hosts.get(machine.pk)
                                and controller.hosts[machine.pk].live.error
                                and controller.hosts[machine.pk].live)
    assert not live.connected and "GetStatus: UNAVAILABLE" in live.error


# ---- adding one -----------------------------------------------------------------------------

@pytest.mark.django_db
def test_machines_add_takes_a_grpc_or_unix_engine_url(capsys):
    call_command("machines", "add", "--name", "curio-tcp", "--engine-url", "grpc://127.0.0.1:9820",
                 "--flavour", "cuzk-upstream")
    call_command("machines", "add", "--name", "curio-sock", "--engine-url",
                 "unix:///run/curio/cuzk.sock", "--flavour", "cuzk-upstream",
                 "--status-url", "http://127.0.0.1:9821")
    tcp, sock = Machine.objects.get(name="curio-tcp"), Machine.objects.get(name="curio-sock")
    assert (tcp.engine_url, tcp.host, tcp.engine_port, tcp.state) == (
        "grpc://127.0.0.1:9820", "127.0.0.1", 0, "running")
    assert tcp.speaks_grpc and not tcp.status_server
    assert (sock.engine_url, sock.engine_port, sock.status_server) == (
        "unix:///run/curio/cuzk.sock", 9821, True)
    call_command("machines", "list")
    out = capsys.readouterr().out
    assert "grpc://127.0.0.1:9820 (status server off)" in out
    assert "unix:///run/curio/cuzk.sock + status :9821" in out


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--engine-url", "grpc://127.0.0.1:9820"], "--flavour cuzk-upstream"),
    (["--engine-url", "grpc://127.0.0.1", "--flavour", "cuzk-upstream"], "grpc://HOST:PORT"),
    (["--engine-url", "unix://run/cuzk.sock", "--flavour", "cuzk-upstream"], "absolute"),
    (["--engine-url", "http://127.0.0.1:9821", "--status-url", "http://127.0.0.1:1"],
     "--status-url goes with"),
])
def test_machines_add_refuses_bad_daemon_urls_clearly(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("machines", "add", "--name", "x", *args)
    assert not Machine.objects.exists()


@pytest.mark.django_db
def test_the_add_machine_form_takes_the_daemons_grpc_address(admin_client, tmp_path):
    page = admin_client.get("/remote/machines/add/").content.decode()
    assert 'name="engine_url"' in page and "unix:///run/curio/cuzk.sock" in page
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    base = {"name": "curio-ssh", "host": "127.0.0.1", "ssh_port": 22, "ssh_user": "root",
            "private_key": key, "key_file": "", "engine_port": "",
            "engine_url": "unix:///run/curio/cuzk.sock"}
    refused = admin_client.post("/remote/machines/add/", {**base, "engine_flavour": "cuzk_engine"})
    assert refused.status_code == 200 and "is for a cuzk-upstream daemon" in refused.content.decode()
    bad = admin_client.post("/remote/machines/add/", {**base, "engine_flavour": UPSTREAM,
                                                      "engine_url": "unix://cuzk.sock"})
    assert bad.status_code == 200 and "absolute" in bad.content.decode()
    assert not Machine.objects.exists()
    answer = admin_client.post("/remote/machines/add/", {**base, "engine_flavour": UPSTREAM})
    assert answer.status_code == 302
    machine = Machine.objects.get(name="curio-ssh")
    assert (machine.engine_url, machine.engine_port, machine.provider, machine.state) == (
        "unix:///run/curio/cuzk.sock", 0, "ssh", "running")


# ---- driving what upstream allows -----------------------------------------------------------

@pytest.mark.django_db(transaction=True)
async def test_srs_preload_and_evict_from_the_machine_page_go_through_grpc(monkeypatch):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    client = Client()
    await database_sync_to_async(client.force_login)(await database_sync_to_async(
        get_user_model().objects.create_user)("ops", is_staff=True))
    with FakeCuzkDaemon() as daemon:
        machine = await Machine.objects.acreate(
            name="curio-srs", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running")
        page = (await database_sync_to_async(client.get)(f"/machines/{machine.pk}/")).content
        assert b'id="host-srs-form"' in page and b"<code>porep-32g</code>" in page
        wrong = await database_sync_to_async(client.post)(
            f"/machines/{machine.pk}/srs/", {"action": "preload", "circuit_id": "porep-c2.tiny"})
        assert wrong.status_code == 400 and b"one of porep-32g, snap-32g" in wrong.content
        async with running_controller() as controller:
            await wait_until(lambda: controller.hosts.get(machine.pk)
                             and controller.hosts[machine.pk].live.connected)
            for action in ("preload", "evict"):
                answer = await database_sync_to_async(client.post)(
                    f"/machines/{machine.pk}/srs/", {"action": action, "circuit_id": "porep-32g"})
                assert answer.status_code == 302
            async def both_done() -> bool:
                return await MachineAction.objects.filter(done_at__isnull=False).acount() == 2

            await wait_until(both_done, timeout=10)

            async def stored_loaded() -> bool:
                # The status row the pages render, not only the controller's memory.
                row = await MachineStatus.objects.aget(machine=machine)
                return any(s["circuit_id"] == "porep-32g"
                           for s in row.snapshot.get("daemon", {}).get("loaded_srs", []))

            await wait_until(stored_loaded)
        assert daemon.calls("PreloadSRS") == ["porep-32g"]
        assert daemon.calls("EvictSRS") == ["porep-32g"]
    messages = sorted([e.message async for e in Event.objects.filter(kind="srs")])
    assert len(messages) == 2
    assert "not evicted: the daemon answered was_loaded=false" in messages[0]
    assert "EvictSRS is not implemented upstream, so nothing was evicted" in messages[0]
    assert messages[1].startswith("curio-srs: SRS porep-32g preloaded in ")
    html = await database_sync_to_async(fragments.render_machine_panel)(
        await Machine.objects.aget(pk=machine.pk))
    assert 'data-daemon-circuit="porep-32g"' in html  # still listed: upstream never evicts


async def staff_client() -> Client:
    client = Client()
    await database_sync_to_async(client.force_login)(await database_sync_to_async(
        get_user_model().objects.create_user)("bench-ops", is_staff=True))
    return client


def benchmark_post(**overrides) -> dict:
    return {"proof_kind": "porep-c2", "registered_proof": 8, "sector_size": 32 << 30,
            "miner_id": 1000, "sector_number": 7, "randomness": "", "partition_index": 0,
            "input_path": "", **overrides}


def c1_upload() -> SimpleUploadedFile:
    return SimpleUploadedFile("c1.json", C1_OUTPUT, content_type="application/json")


@pytest.mark.django_db(transaction=True)
async def test_a_benchmark_proof_runs_to_completion_and_its_rate_and_cost_appear(monkeypatch):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    client = await staff_client()
    with FakeCuzkDaemon(synthesis_s=0.5, gpu_s=1.0) as daemon:
        machine = await Machine.objects.acreate(
            name="curio-bench", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running",
            price_per_hour=Decimal("2.5"))
        async with running_controller() as controller:
            await wait_until(lambda: controller.hosts.get(machine.pk)
                             and controller.hosts[machine.pk].live.connected)
            answer = await database_sync_to_async(client.post)(
                f"/machines/{machine.pk}/benchmarks/", {**benchmark_post(),
                                                        "input_file": c1_upload()})
            assert answer.status_code == 302
            bench = await BenchmarkProof.objects.aget()
            # While it proves: SubmitProof named no GPU, GetStatus shows it on one.
            await wait_until(lambda: "assigned-gpu-empty" in {
                lie["code"] for lie in controller.hosts[machine.pk].live.snapshot["lies"]})

            async def completed() -> bool:
                return await BenchmarkProof.objects.filter(status="completed").aexists()

            await wait_until(completed, timeout=20)
        html = await database_sync_to_async(fragments.render_machine_panel)(
            await Machine.objects.aget(pk=machine.pk))
    bench = await BenchmarkProof.objects.aget(pk=bench.pk)
    assert daemon.calls("SubmitProof") == [f"vastmgr-bench-{bench.pk}"]
    assert bench.job_id == f"vastmgr-bench-{bench.pk}" and bench.assigned_gpu == ""
    assert bench.gpu_compute_ms == 1000 and bench.synthesis_ms == 500
    assert bench.total_ms is not None and bench.total_ms >= 1500
    rate = 3_600_000 / bench.total_ms
    assert bench.proofs_per_hour == pytest.approx(rate)
    assert bench.dollars_per_proof == pytest.approx(2.5 / rate)
    assert f'data-benchmark="{bench.pk}" data-benchmark-status="completed"' in html
    assert f'data-rate="{rate:.2f}"' in html and f"{2.5 / rate:.4f}" in html
    assert f'data-total-ms="{bench.total_ms}"' in html


@pytest.mark.django_db(transaction=True)
async def test_cancel_is_sent_honestly_and_the_proof_runs_on(monkeypatch, tmp_path):
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    client = await staff_client()
    c1 = tmp_path / "c1.json"
    c1.write_bytes(C1_OUTPUT)
    with FakeCuzkDaemon(synthesis_s=1.0, gpu_s=2.0) as daemon:
        machine = await Machine.objects.acreate(
            name="curio-cancel", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running")
        async with running_controller() as controller:
            await wait_until(lambda: controller.hosts.get(machine.pk)
                             and controller.hosts[machine.pk].live.connected)
            await database_sync_to_async(client.post)(
                f"/machines/{machine.pk}/benchmarks/", benchmark_post(input_path=str(c1)))
            bench = await BenchmarkProof.objects.aget()
            assert bench.input_name == str(c1)

            async def submitted() -> bool:
                return await BenchmarkProof.objects.filter(status="submitted").aexists()

            await wait_until(submitted, timeout=10)
            page = (await database_sync_to_async(client.get)(f"/machines/{machine.pk}/")).content
            assert b"Upstream cannot stop a running proof" in page
            answer = await database_sync_to_async(client.post)(
                f"/machines/{machine.pk}/benchmarks/{bench.pk}/cancel/", follow=True)
            assert b"upstream cannot stop a running proof" in answer.content
            again = await database_sync_to_async(client.post)(
                f"/machines/{machine.pk}/benchmarks/{bench.pk}/cancel/")
            assert again.status_code == 400 and b"already sent" in again.content
            await wait_until(lambda: "cancel-noop" in {
                lie["code"] for lie in controller.hosts[machine.pk].live.snapshot["lies"]})

            async def completed() -> bool:
                return await BenchmarkProof.objects.filter(status="completed").aexists()

            await wait_until(completed, timeout=20)
    bench = await BenchmarkProof.objects.aget(pk=bench.pk)
    assert daemon.calls("CancelProof") == [bench.job_id]
    assert bench.cancel_answer.startswith("CancelProof answered was_running=false: upstream does "
                                          "not implement cancel")
    assert bench.status == "completed"  # it ran on


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "message"), [
    ({}, "upload a file or name one"),
    ({"input_file": "bad"}, "not a PoRep C1 output"),
    ({"input_file": "c1", "input_path": "/etc/hostname"}, "one of the two"),
    ({"input_path": "relative/c1.json"}, "absolute path"),
    ({"input_path": "/nonexistent/c1.json"}, "No such file"),
    ({"input_file": "c1", "randomness": "zz"}, "64 hex digits"),
    ({"input_file": "c1", "proof_kind": "winning-post"}, "needs its 32-byte randomness"),
    ({"input_file": "c1", "proof_kind": "porep-c3"}, "not one of the available choices"),
])
def test_bad_benchmark_input_is_a_400_that_says_why(admin_client, fields, message):
    machine = Machine.objects.create(name="curio-b", provider="local", host="127.0.0.1",
                                     engine_port=0, engine_url="unix:///run/curio/cuzk.sock",
                                     engine_flavour=UPSTREAM, state="running")
    files = {"c1": c1_upload(), "bad": SimpleUploadedFile("c1.json", b"[1, 2]")}
    post = benchmark_post(**{k: v for k, v in fields.items() if k != "input_file"})
    if "input_file" in fields:
        post["input_file"] = files[fields["input_file"]]
    answer = admin_client.post(f"/machines/{machine.pk}/benchmarks/", post)
    assert answer.status_code == 400 and message in entities.unescape(answer.content.decode())
    assert not BenchmarkProof.objects.exists()


@pytest.mark.django_db
def test_benchmarks_need_staff_and_a_grpc_address(client, admin_client):
    watched = Machine.objects.create(name="curio-http", provider="local", host="127.0.0.1",
                                     engine_flavour=UPSTREAM, state="running")
    answer = admin_client.post(f"/machines/{watched.pk}/benchmarks/",
                               {**benchmark_post(), "input_file": c1_upload()})
    assert answer.status_code == 400 and b"no cuzk gRPC address" in answer.content
    client.force_login(get_user_model().objects.create_user("viewer"))
    assert client.post(f"/machines/{watched.pk}/benchmarks/").status_code == 403
    assert not BenchmarkProof.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_a_controller_that_restarts_mid_proof_awaits_the_same_job(monkeypatch):
    """Nothing in flight is lost: a submitted benchmark is awaited again (never submitted
    twice); one the daemon no longer knows (it restarted) fails with that reason."""
    monkeypatch.setenv("VASTMGR_UPSTREAM_INTERVAL", "0.2")
    with FakeCuzkDaemon(synthesis_s=0.5, gpu_s=0.5) as daemon:
        machine = await Machine.objects.acreate(
            name="curio-restart", provider="local", host="127.0.0.1", engine_port=0,
            engine_url=daemon.url, engine_flavour=UPSTREAM, state="running")
        fields = {"machine": machine, "proof_kind": "porep-c2", "registered_proof": 8,
                  "sector_size": 32 << 30, "miner_id": 1000, "sector_number": 1,
                  "input_name": "c1.json", "input_bytes": C1_OUTPUT, "status": "submitted"}
        known = await BenchmarkProof.objects.acreate(**fields)
        known.job_id = known.request_id
        await known.asave(update_fields=["job_id"])
        lost = await BenchmarkProof.objects.acreate(**fields, job_id="vastmgr-bench-gone")
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            await client.submit(porep(known.request_id))  # sent by the controller that died
        async with running_controller():
            async def settled() -> bool:
                return not await BenchmarkProof.objects.filter(status="submitted").aexists()

            await wait_until(settled, timeout=20)
    known, lost = [await BenchmarkProof.objects.aget(pk=b.pk) for b in (known, lost)]
    assert daemon.calls("SubmitProof") == [known.request_id]  # not submitted again
    assert known.status == "completed" and known.total_ms
    assert lost.status == "failed" and "no longer knows job vastmgr-bench-gone" in lost.error
