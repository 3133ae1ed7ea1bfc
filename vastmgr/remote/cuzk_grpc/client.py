"""A typed client for Curio's cuzk daemon (`cuzk.v1.ProvingEngine`, gRPC, no TLS, no auth).

A daemon is named by its engine URL, as the operator gives it: `grpc://HOST:PORT` (TCP; Curio's
docs use port 9820) or `unix:///path/to/cuzk.sock` (upstream's default, `unix:///run/curio/
cuzk.sock`). For a machine reached over SSH the URL is the address as seen *on the machine*: the
controller forwards a local port over the machine's one SSH link to that TCP port or socket path
(`MachineLink.tunnel` / `tunnel_to_path`) and dials the local end.

Every call has a deadline; a failed call raises `CuzkError` carrying the gRPC status code, so
callers can tell "the daemon does not know that job" (NOT_FOUND) from "the daemon is not there"
(UNAVAILABLE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import grpc
import grpc.aio

from vastmgr.lib.errors import TransportError
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.proving_pb2_grpc import ProvingEngineStub

# cuzk-daemon's server refuses messages above 128 MiB each way (main.rs); a PoRep C1 output is
# ~50 MB for a 32 GiB sector. Sending more would only be refused after the upload.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0

PROOF_KINDS: dict[str, int] = {
    "porep-c2": pb.POREP_SEAL_COMMIT,
    "snap-update": pb.SNAP_DEALS_UPDATE,
    "window-post": pb.WINDOW_POST_PARTITION,
    "winning-post": pb.WINNING_POST,
}
# Upstream's SRS circuit ids (cuzk-core srs_manager): the only names PreloadSRS accepts.
CIRCUIT_IDS = ("porep-32g", "snap-32g", "wpost-32g", "winning-32g")


class CuzkError(TransportError):
    """A gRPC call to a cuzk daemon failed; `code` is the gRPC status."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        self.method, self.code, self.details = method, code, details
        super().__init__(f"cuzk {method}: {code.name}: {details}")


def channel_options() -> Sequence[tuple[str, int]]:
    return (("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # A daemon that went away is retried by the watcher, which owns the backoff.
            ("grpc.enable_retries", 0))


class CuzkClient:
    """One channel to one daemon; `async with` closes it."""

    def __init__(self, target: str, *, timeout: float = DEFAULT_TIMEOUT):
        self.target = target
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(target, options=channel_options())
        self._stub = ProvingEngineStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request, timeout: float | None = None):
        call = getattr(self._stub, method)
        try:
            return await call(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.aio.AioRpcError as exc:
            raise CuzkError(method, exc.code(), exc.details() or "") from None

    async def get_status(self) -> pb.GetStatusResponse:
        return await self._call("GetStatus", pb.GetStatusRequest())

    async def get_metrics(self) -> str:
        response: pb.GetMetricsResponse = await self._call("GetMetrics", pb.GetMetricsRequest())
        return response.prometheus_text

    async def preload_srs(self, circuit_id: str, *, timeout: float | None = None
                          ) -> pb.PreloadSrsResponse:
        """Loading a 32 GiB SRS takes minutes: give a timeout that allows for it."""
        return await self._call("PreloadSRS", pb.PreloadSrsRequest(circuit_id=circuit_id),
                                timeout)

    async def evict_srs(self, circuit_id: str) -> pb.EvictSrsResponse:
        return await self._call("EvictSRS", pb.EvictSrsRequest(circuit_id=circuit_id))

    async def submit(self, request: pb.SubmitProofRequest) -> pb.SubmitProofResponse:
        if (size := request.ByteSize()) > MAX_MESSAGE_BYTES:
            raise CuzkError("SubmitProof", grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"the request is {size} bytes; the daemon takes at most "
                            f"{MAX_MESSAGE_BYTES} (128 MiB)")
        return await self._call("SubmitProof", request)

    async def await_proof(self, job_id: str, *, timeout: float) -> pb.AwaitProofResponse:
        """Upstream ignores `timeout_ms` and answers when the proof ends: our deadline is the
        only bound, and DEADLINE_EXCEEDED leaves the proof running there."""
        return await self._call("AwaitProof", pb.AwaitProofRequest(
            job_id=job_id, timeout_ms=int(timeout * 1000)), timeout)

    async def cancel(self, job_id: str) -> pb.CancelProofResponse:
        return await self._call("CancelProof", pb.CancelProofRequest(job_id=job_id))
