"""The gRPC client for Curio's cuzk daemon against the strict fake (fake_cuzk_daemon.py): the wire
contract, a unix socket and TCP, upstream's answers, the 128 MiB limit, and a unix socket on a
machine reached through the real OpenSSH server."""

import filecmp
import json
import os
from pathlib import Path

import grpc
import pytest
from asgiref.sync import sync_to_async

from tests.vastmgr.fake_cuzk_daemon import FakeCuzkDaemon, FakeGPU
from vastmgr.fleet.models import Machine
from vastmgr.fleet.transport import DaemonAddress
from vastmgr.remote.cuzk_grpc import generate
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.client import MAX_MESSAGE_BYTES, CuzkClient, CuzkError
from vastmgr.remote.models import RemoteMachine, Secret
from vastmgr.remote.ssh import LinkPool
from vastmgr.remote.tunnel import SSHTunnelTransport

C1_OUTPUT = json.dumps({"registered_proof": "StackedDrg32GiBV1_1", "vanilla_proofs": {}}).encode()


def porep(request_id: str, c1: bytes = C1_OUTPUT) -> pb.SubmitProofRequest:
    return pb.SubmitProofRequest(request_id=request_id, proof_kind=pb.POREP_SEAL_COMMIT,
                                 sector_size=32 << 30, registered_proof=8, vanilla_proof=c1,
                                 sector_number=42, miner_id=1000)


# ---- the contract ---------------------------------------------------------------------------

def test_the_generated_code_is_what_grpcio_tools_makes_of_the_proto(tmp_path):
    generate.generate(tmp_path)
    ours = generate.PACKAGE
    theirs = tmp_path / ours.relative_to(generate.ROOT)
    names = ["proving_pb2.py", "proving_pb2.pyi", "proving_pb2_grpc.py"]
    _match, mismatch, errors = filecmp.cmpfiles(ours, theirs, names, shallow=False)
    assert not mismatch and not errors, f"regenerate: {mismatch or errors}"


def test_the_wire_contract_is_upstreams():
    """Names and field numbers as in Curio's extern/cuzk/cuzk-proto/proto/cuzk/v1/proving.proto."""
    assert pb.DESCRIPTOR.package == "cuzk.v1"
    service = pb.DESCRIPTOR.services_by_name["ProvingEngine"]
    assert service.full_name == "cuzk.v1.ProvingEngine"
    assert [m.name for m in service.methods] == [
        "SubmitProof", "AwaitProof", "Prove", "CancelProof", "GetStatus", "GetMetrics",
        "PreloadSRS", "EvictSRS"]
    fields = {name: {f.name: f.number for f in message.fields}
              for name, message in pb.DESCRIPTOR.message_types_by_name.items()}
    assert fields["SubmitProofRequest"] == {
        "request_id": 1, "proof_kind": 2, "sector_size": 3, "registered_proof": 4, "priority": 5,
        "vanilla_proof": 10, "vanilla_proofs": 11, "sector_number": 20, "miner_id": 21,
        "randomness": 22, "partition_index": 23, "comm_r_old": 30, "comm_r_new": 31,
        "comm_d_new": 32}
    assert fields["AwaitProofResponse"] == {
        "job_id": 1, "status": 2, "proof": 3, "error_message": 4, "queue_wait_ms": 10,
        "srs_load_ms": 11, "synthesis_ms": 12, "gpu_compute_ms": 13, "total_ms": 14}
    assert fields["GetStatusResponse"] == {
        "gpus": 1, "loaded_srs": 2, "queues": 3, "total_proofs_completed": 4,
        "total_proofs_failed": 5, "uptime_seconds": 6, "pinned_memory_bytes": 7,
        "pinned_memory_limit_bytes": 8}
    assert fields["GPUStatus"] == {"ordinal": 1, "name": 2, "vram_total_bytes": 3,
                                   "vram_free_bytes": 4, "current_job_id": 5,
                                   "current_proof_kind": 6}
    assert fields["SRSStatus"] == {"circuit_id": 1, "tier": 2, "size_bytes": 3, "ref_count": 4}
    assert fields["QueueStatus"] == {"proof_kind": 1, "pending": 2, "in_progress": 3}
    assert fields["SubmitProofResponse"] == {"job_id": 1, "queue_position": 2, "assigned_gpu": 3}
    assert {v.name: v.number for v in pb.ProofKind.DESCRIPTOR.values} == {
        "PROOF_KIND_UNSPECIFIED": 0, "POREP_SEAL_COMMIT": 1, "SNAP_DEALS_UPDATE": 2,
        "WINDOW_POST_PARTITION": 3, "WINNING_POST": 4}
    assert pb.AwaitProofResponse.Status.Name(4) == "TIMEOUT"
    assert pb.SRSStatus.Tier.Name(0) == "HOT"


@pytest.mark.parametrize(("url", "target"), [
    ("grpc://127.0.0.1:9820", "127.0.0.1:9820"),
    ("unix:///run/curio/cuzk.sock", "unix:///run/curio/cuzk.sock"),
    (" grpc://[::1]:9820/ ", "[::1]:9820"),
])
def test_engine_urls(url, target):
    assert DaemonAddress.parse(url).target == target


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9821", "grpc://127.0.0.1", "grpc://:9820", "unix://run/cuzk.sock",
    "unix:///run/cuzk.sock?x=1", "grpc://127.0.0.1:9820/cuzk", "grpc://127.0.0.1:99999", "",
])
def test_bad_engine_urls_say_what_is_wrong(url):
    with pytest.raises(ValueError, match="grpc://|unix://|port"):
        DaemonAddress.parse(url)


# ---- the daemon's answers -------------------------------------------------------------------

async def test_status_over_the_default_unix_socket():
    with FakeCuzkDaemon(gpus=[FakeGPU(0), FakeGPU(1, vram_free_bytes=1 << 30)]) as daemon:
        assert daemon.url.startswith("unix:///")
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            status = await client.get_status()
    # One entry per worker: two workers on each device.
    assert [g.ordinal for g in status.gpus] == [0, 0, 1, 1]
    assert status.gpus[2].vram_free_bytes == 1 << 30
    assert status.pinned_memory_bytes == 0 and status.pinned_memory_limit_bytes == 0
    assert not status.loaded_srs and not status.queues


async def test_a_proof_over_tcp_job_id_is_request_id_and_timings_come_back():
    with FakeCuzkDaemon(tcp=True) as daemon:
        assert daemon.url.startswith("grpc://127.0.0.1:")
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            submitted = await client.submit(porep("bench-1"))
            assert submitted.job_id == "bench-1" and submitted.assigned_gpu == ""
            result = await client.await_proof("bench-1", timeout=20)
            metrics = await client.get_metrics()
    assert result.status == pb.AwaitProofResponse.COMPLETED and len(result.proof) == 192
    assert result.total_ms >= result.synthesis_ms + result.gpu_compute_ms > 0
    assert result.srs_load_ms > 0  # loaded on demand
    assert 'cuzk_proofs_completed{proof_kind="porep_c2"} 1' in metrics


async def test_unknown_jobs_bad_kinds_and_what_upstream_does_not_implement():
    with FakeCuzkDaemon() as daemon:
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            with pytest.raises(CuzkError) as unknown:
                await client.await_proof("never-submitted", timeout=5)
            assert unknown.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(CuzkError) as bad:
                await client.submit(pb.SubmitProofRequest(request_id="x", proof_kind=9))
            assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "invalid proof_kind: 9" in str(bad.value)
            # Not a C1 output: the job fails, it is not refused.
            await client.submit(porep("junk", b"not json"))
            failed = await client.await_proof("junk", timeout=5)
            assert failed.status == pb.AwaitProofResponse.FAILED and failed.total_ms == 0
            assert (await client.cancel("junk")).was_running is False
            preload = await client.preload_srs("porep-32g")
            assert preload.already_loaded is False
            assert (await client.evict_srs("porep-32g")).was_loaded is False
            status = await client.get_status()
    assert [(s.circuit_id, s.tier, s.size_bytes) for s in status.loaded_srs] == [
        ("porep-32g", pb.SRSStatus.HOT, 0)]
    assert status.total_proofs_failed == 1
    assert daemon.calls("EvictSRS") == ["porep-32g"]


async def test_messages_above_128_mib_are_refused_both_ways():
    with FakeCuzkDaemon() as daemon:
        too_big = porep("huge", b"{" + b" " * MAX_MESSAGE_BYTES + b"}")
        async with CuzkClient(DaemonAddress.parse(daemon.url).target) as client:
            with pytest.raises(CuzkError, match="RESOURCE_EXHAUSTED.*128 MiB"):
                await client.submit(too_big)
        assert daemon.calls("SubmitProof") == []
        # A client that would send it (Go's allows 256 MiB): the daemon refuses it.
        options = [("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(DaemonAddress.parse(daemon.url).target,
                                             options=options) as channel:
            submit = channel.unary_unary("/cuzk.v1.ProvingEngine/SubmitProof",
                                         request_serializer=pb.SubmitProofRequest.SerializeToString,
                                         response_deserializer=pb.SubmitProofResponse.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await submit(too_big, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert daemon.calls("SubmitProof") == []


async def test_a_daemon_that_is_not_there_is_unavailable(tmp_path):
    async with CuzkClient(f"unix://{tmp_path}/none.sock", timeout=2) as client:
        with pytest.raises(CuzkError) as gone:
            await client.get_status()
    assert gone.value.code == grpc.StatusCode.UNAVAILABLE


# ---- through SSH ----------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
async def test_a_unix_socket_on_the_machine_through_the_real_sshd(sshd_host, client_key, tmp_path):
    """Curio's default deployment: the daemon on unix:///…/cuzk.sock, reached through the
    machine's one SSH link (a local port forwarded to the remote socket path)."""
    run = tmp_path / "run"
    run.mkdir()
    for folder in (run, *run.parents):
        if folder == Path("/"):
            break
        os.chmod(folder, os.stat(folder).st_mode | 0o001)
    with FakeCuzkDaemon(socket_path=run / "cuzk.sock") as daemon:
        os.chmod(run / "cuzk.sock", 0o777)  # the machine's user reaches it, as Curio's would
        machine = await Machine.objects.acreate(
            name="curio-1", provider="ssh", host="127.0.0.1", ssh_port=sshd_host.port,
            ssh_user=sshd_host.user, engine_flavour="cuzk-upstream", state="running")
        remote = await RemoteMachine.objects.acreate(machine=machine)
        await sync_to_async(Secret.store)(remote.ssh_key_secret_name,
                                          client_key.export_private_key().decode())
        pool = LinkPool()
        try:
            transport = SSHTunnelTransport(machine, pool=pool)
            address = DaemonAddress.parse(f"unix://{run}/cuzk.sock")
            target = await transport.grpc_target(address)
            assert await transport.grpc_target(address) == target  # one forward, reused
            async with CuzkClient(target) as client:
                preload = await client.preload_srs("wpost-32g")
                status = await client.get_status()
        finally:
            await pool.close()
    assert preload.already_loaded is False
    assert [s.circuit_id for s in status.loaded_srs] == ["wpost-32g"]
    assert daemon.calls("PreloadSRS") == ["wpost-32g"]
    assert sshd_host.log().count("Accepted publickey") == 1
