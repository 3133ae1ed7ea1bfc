"""What the controller asks of an upstream cuzk daemon through its gRPC API, beyond watching it:
SRS preload and evict (operator actions), and benchmark proofs.

Upstream answers some calls without doing anything (`EvictSRS`, `CancelProof`: "not yet
implemented" in service.rs); those answers are recorded as given, with what they mean.
"""

from __future__ import annotations

import grpc
from channels.db import database_sync_to_async
from django.utils import timezone

from vastmgr.fleet.lie_detector import LieDetector
from vastmgr.fleet.models import Event, MachineAction
from vastmgr.lib.errors import TransportError
from vastmgr.proofs.models import BenchmarkProof
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.client import CuzkClient, CuzkError

# Loading a 32 GiB SRS from disk takes minutes; the call blocks until it is loaded.
PRELOAD_TIMEOUT_S = 900.0


async def srs_action(daemon: CuzkClient, action: str, circuit_id: str) -> tuple[str, str]:
    """(what happened, error): one of them is empty."""
    try:
        if action == MachineAction.Action.PRELOAD:
            loaded = await daemon.preload_srs(circuit_id, timeout=PRELOAD_TIMEOUT_S)
            if loaded.already_loaded:
                return "already loaded (PreloadSRS)", ""
            return f"preloaded in {loaded.load_time_ms / 1000:.1f} s (PreloadSRS)", ""
        evicted = await daemon.evict_srs(circuit_id)
    except TransportError as exc:
        return "", str(exc)
    if not evicted.was_loaded and not evicted.freed_bytes:
        return "", ("the daemon answered was_loaded=false, freed 0 bytes: EvictSRS is not "
                    "implemented upstream, so nothing was evicted (restart the daemon to free it)")
    return f"evicted, {evicted.freed_bytes} bytes freed (EvictSRS)", ""


# ---- benchmark proofs -----------------------------------------------------------------------

# Curio waits this long for a proof from cuzk ([Cuzk] ProveTimeout): past it, we stop waiting
# (the daemon may still finish it: upstream cannot cancel) and say so.
AWAIT_TIMEOUT_S = 30 * 60.0
PROOF_KINDS = {"porep-c2": pb.POREP_SEAL_COMMIT, "snap-update": pb.SNAP_DEALS_UPDATE,
               "window-post": pb.WINDOW_POST_PARTITION, "winning-post": pb.WINNING_POST}


def submit_request(bench: BenchmarkProof) -> pb.SubmitProofRequest:
    """The SubmitProofRequest for a benchmark: a PoRep C1 output goes in `vanilla_proof`, a
    PoSt sector's or SnapDeals partition's vanilla proof as the one entry of `vanilla_proofs`."""
    request = pb.SubmitProofRequest(
        request_id=bench.request_id, proof_kind=PROOF_KINDS[bench.proof_kind],
        sector_size=bench.sector_size, registered_proof=bench.registered_proof,
        sector_number=bench.sector_number, miner_id=bench.miner_id,
        randomness=bytes(bench.randomness), partition_index=bench.partition_index)
    if bench.proof_kind == "porep-c2":
        request.vanilla_proof = bytes(bench.input_bytes)
    else:
        request.vanilla_proofs.append(bytes(bench.input_bytes))
    return request


async def follow_benchmark(bench_id: int, daemon: CuzkClient, detector: LieDetector | None,
                           price_per_hour) -> None:
    """Submit a queued benchmark (once) and await its end, recording what upstream says. A
    daemon that cannot be reached leaves it as it was (queued: not sent; submitted: awaited
    again when the daemon is back); a daemon that no longer knows a submitted job (it
    restarted) fails it, with that reason."""
    bench = await BenchmarkProof.objects.select_related("machine").aget(pk=bench_id)
    if bench.status == BenchmarkProof.Status.QUEUED:
        try:
            submitted = await daemon.submit(submit_request(bench))
        except CuzkError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                return  # never reached the daemon: still queued, sent when it is back
            if exc.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                await _finish(bench, error=f"SubmitProof refused it: {exc.code.name}: "
                                           f"{exc.details}")
                return
            # It may have arrived: the job id is the request id, so await that.
            bench.job_id = bench.request_id
        else:
            bench.job_id = submitted.job_id
            bench.queue_position = submitted.queue_position
            bench.assigned_gpu = submitted.assigned_gpu
            if detector is not None:
                detector.note_submitted(submitted.job_id, submitted.assigned_gpu)
        bench.status = BenchmarkProof.Status.SUBMITTED
        bench.submitted_at = timezone.now()
        await bench.asave(update_fields=["job_id", "queue_position", "assigned_gpu", "status",
                                         "submitted_at"])
        await _event(bench, f"benchmark {bench.pk} ({bench.proof_kind}) submitted as job "
                            f"{bench.job_id}, queue position {bench.queue_position}")
    try:
        result = await daemon.await_proof(bench.job_id, timeout=AWAIT_TIMEOUT_S)
    except CuzkError as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            await _finish(bench, error=f"the daemon no longer knows job {bench.job_id} (it "
                                       "restarted?): the proof is lost")
        elif exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            await _finish(bench, error=f"no result in {AWAIT_TIMEOUT_S / 60:.0f} min (Curio's "
                                       "ProveTimeout); the daemon may still be proving it")
        return  # unreachable: awaited again once the daemon is back
    if result.status == pb.AwaitProofResponse.COMPLETED:
        for field in ("queue_wait_ms", "srs_load_ms", "synthesis_ms", "gpu_compute_ms",
                      "total_ms"):
            setattr(bench, field, getattr(result, field))
        bench.proof_bytes = len(result.proof)
        bench.price_per_hour = price_per_hour
        await _finish(bench, completed=True)
    else:
        status = pb.AwaitProofResponse.Status.Name(result.status)
        await _finish(bench, error=f"{status}: {result.error_message or 'no message'}")


async def cancel_benchmark(bench_id: int, daemon: CuzkClient,
                           detector: LieDetector | None) -> None:
    """Send CancelProof and record its answer as given (upstream always says was_running=false
    and keeps proving: the benchmark goes on and is recorded when it ends)."""
    bench = await BenchmarkProof.objects.select_related("machine").aget(pk=bench_id)
    try:
        answer = await daemon.cancel(bench.job_id)
    except CuzkError as exc:
        bench.cancel_answer = f"CancelProof failed: {exc.code.name}: {exc.details}"
    else:
        if detector is not None:
            detector.note_cancelled(bench.job_id, answer.was_running)
        bench.cancel_answer = (
            f"CancelProof answered was_running={str(answer.was_running).lower()}"
            + ("" if answer.was_running else ": upstream does not implement cancel, the proof "
               "runs on and its result is still recorded"))
    await bench.asave(update_fields=["cancel_answer"])
    await _event(bench, f"benchmark {bench.pk}: {bench.cancel_answer}")


async def _finish(bench: BenchmarkProof, *, completed: bool = False, error: str = "") -> None:
    bench.status = BenchmarkProof.Status.COMPLETED if completed else BenchmarkProof.Status.FAILED
    bench.error = error
    bench.finished_at = timezone.now()
    # Only what the proof's end decides: a cancel's answer may have been saved meanwhile.
    await bench.asave(update_fields=["status", "error", "finished_at", "queue_wait_ms",
                                     "srs_load_ms", "synthesis_ms", "gpu_compute_ms", "total_ms",
                                     "proof_bytes", "price_per_hour"])
    if completed:
        rate = bench.proofs_per_hour
        cost = bench.dollars_per_proof
        await _event(bench, f"benchmark {bench.pk} ({bench.proof_kind}) completed in "
                            f"{(bench.total_ms or 0) / 1000:.1f} s: {rate:.1f} proofs/h"
                            + (f", ${cost:.4f}/proof" if cost is not None else ""))
    else:
        await _event(bench, f"benchmark {bench.pk} ({bench.proof_kind}) failed: {error}",
                     level=Event.Level.ERROR)


async def _event(bench: BenchmarkProof, message: str, level: str = Event.Level.INFO) -> None:
    await database_sync_to_async(Event.record)("benchmark", f"{bench.machine.name}: {message}",
                                               machine=bench.machine, level=level)
