"""Watching Curio's Rust `cuzk` daemon (flavour `cuzk-upstream`): its gRPC API and its status
server.

Curio deploys the daemon with its gRPC API (`cuzk.v1.ProvingEngine`) on a unix socket and its HTTP
status server off. A machine with an engine URL (`Machine.engine_url`) is watched through
`GetStatus` (GPUs, loaded SRS, queues, totals, uptime, pinned memory) and `GetMetrics`, merged
with `GET /status` when the operator enabled it (`daemon.status_listen`: hand-rolled HTTP/1.1,
`Connection: close`, no auth, no stream, no seq; schema in cuzk-notes §4.2); one without is
watched through `GET /status` only. Work is never dispatched to an upstream daemon.

`map_snapshot` turns an upstream snapshot into a `PartialSnapshot`, the shape our panels render.
It trusts nothing: any field may be absent, null or of the wrong type, and then it is left out of
the mapped snapshot, so the panel says "not reported" instead of showing a zero that was never
measured.
`map_daemon_status` does the same for GetStatus, where proto3 cannot tell 0 from "not sent": the
figures upstream hard-codes to 0 are left out. `UpstreamWatcher` polls `/status`,
`GrpcUpstreamWatcher` polls the gRPC API (and `/status` when there is one); both map, run the lie
detector and hand the result to the controller exactly as `MachineWatcher` does for our engine;
`watcher_for` picks the watcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, cast

import aiohttp

from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.errors import EngineError
from cuzk_engine.vocabulary import PARTITION_PHASES, WORKER_STATES
from vastmgr.controller.watcher import MachineLive, MachineWatcher, RampSlot
from vastmgr.fleet.lie_detector import LieDetector
from vastmgr.fleet.liveness import STALE_AFTER_INTERVALS
from vastmgr.fleet.models import Machine
from vastmgr.fleet.partial_snapshot import (
    DaemonGPU,
    DaemonQueue,
    DaemonSRS,
    DaemonStatus,
    PartialSnapshot,
)
from vastmgr.fleet.transport import DaemonAddress, EngineEndpoint, EngineTransport
from vastmgr.lib.errors import SettingsError, TransportError
from vastmgr.remote.cuzk_grpc import proving_pb2 as pb
from vastmgr.remote.cuzk_grpc.client import CuzkClient

log = logging.getLogger(__name__)

FLAVOUR = Machine.Flavour.CUZK_UPSTREAM.value
DEFAULT_INTERVAL = 1.5  # what the seeds' vast-manager polled at
INTERVAL_VARIABLE = "VASTMGR_UPSTREAM_INTERVAL"

# Upstream has no finalizing phase (a partition reads `gpu` until its finalizer is done) and no
# cancel: a state outside these is not one upstream reports.
PARTITION_STATES = tuple(p for p in PARTITION_PHASES if p not in ("finalizing", "cancelled"))
BUFFERS = ("synth_in_flight", "provers_in_flight", "aux_in_flight", "shells_in_flight",
           "pending_handles")


def poll_interval(controller_interval: float) -> float:
    """Seconds between polls of an upstream daemon: $VASTMGR_UPSTREAM_INTERVAL, by default 1.5
    (or 2 controller intervals, if that is less).

    The controller calls a host stale after 3 of its own intervals without news, so polling
    that rarely would make every upstream host flicker stale: such a setting is refused."""
    limit = STALE_AFTER_INTERVALS * controller_interval
    raw = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not raw:
        return min(DEFAULT_INTERVAL, 2 * controller_interval)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{INTERVAL_VARIABLE}={raw!r} is not a number") from None
    if not 0 < value < limit:
        raise SettingsError(f"{INTERVAL_VARIABLE}={raw!r} must be above 0 and below {limit:g} s "
                          "(3 controller intervals, after which a host counts as stale)")
    return value


# ---- mapping ------------------------------------------------------------------------------

def _number(value) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _pick(source, fields: dict[str, Callable]) -> dict:
    """The fields of `source` that are present and of the right type (others are dropped)."""
    if not isinstance(source, dict):
        return {}
    picked = {}
    for name, convert in fields.items():
        value = convert(source.get(name))
        if value is not None:
            picked[name] = value
    return picked


def _choice(options):
    return lambda value: value if value in options else None


def _counts(value) -> dict | None:
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if _number(v) is not None}


def _flag(value) -> bool | None:
    return value if isinstance(value, bool) else None


def _list(source, key: str, convert: Callable[[dict], dict]) -> list[dict] | None:
    items = source.get(key) if isinstance(source, dict) else None
    if not isinstance(items, list):
        return None
    return [convert(item) for item in items if isinstance(item, dict)]


def _partition(raw: dict) -> dict:
    return _pick(raw, {"index": _number, "state": _choice(PARTITION_STATES),
                       "synth_ms": _number, "gpu_ms": _number})


def _pipeline(raw: dict) -> dict:
    pipeline = _pick(raw, {"job_id": _text, "proof_kind": _text, "started_secs_ago": _number,
                           "total_partitions": _number, "partitions_done": _number})
    partitions = _list(raw, "partitions", _partition)
    if partitions is not None:
        pipeline["partitions"] = sorted(partitions, key=lambda p: p.get("index", -1))
    return pipeline


def _worker(raw: dict) -> dict:
    worker = _pick(raw, {"worker_id": _number, "gpu_ordinal": _number,
                         "state": _choice(WORKER_STATES), "busy_secs": _number})
    # Present-but-null job fields are meaningful here (an idle worker has none): keep them.
    for key, convert in (("current_job", _text), ("current_partition", _number)):
        if isinstance(raw, dict) and key in raw:
            worker[key] = convert(raw[key])
    return worker


def _allocation(raw: dict) -> dict:
    return _pick(raw, {"circuit_id": _text, "bytes": _number, "last_used_secs_ago": _number,
                       "evictable": _flag})


def map_snapshot(raw, poll: int) -> PartialSnapshot:
    """An upstream `/status` body in our snapshot's shape, with only what it reported.

    `poll` numbers the snapshots (upstream has no seq); `flavour` tells the templates which
    daemon spoke. Pipelines come in HashMap order upstream: sorted oldest first here, so rows do
    not jump between polls."""
    if not isinstance(raw, dict):
        raise EngineError(f"GET /status: the answer is not a JSON object: {str(raw)[:80]!r}")
    snapshot: dict[str, Any] = {"flavour": FLAVOUR, "seq": poll}
    if (uptime := _number(raw.get("uptime_secs"))) is not None:
        snapshot["uptime_secs"] = uptime
    for key, fields in (
        ("memory", {"total_bytes": _number, "used_bytes": _number, "available_bytes": _number}),
        ("synthesis", {"max_concurrent": _number, "active": _number}),
        ("counters", {"total_completed": _number, "total_failed": _number,
                      "completed_by_kind": _counts, "failed_by_kind": _counts,
                      "queue_depth": _number}),
        ("buffers", dict.fromkeys(BUFFERS, _number)),
    ):
        if isinstance(raw.get(key), dict):
            snapshot[key] = _pick(raw[key], fields)
    pipelines = _list(raw, "pipelines", _pipeline)
    if pipelines is not None:
        snapshot["pipelines"] = sorted(
            pipelines, key=lambda p: (-p.get("started_secs_ago", 0), p.get("job_id", "")))
    workers = _list(raw, "gpu_workers", _worker)
    if workers is not None:
        snapshot["gpu_workers"] = sorted(workers, key=lambda w: w.get("worker_id", -1))
    if isinstance(raw.get("allocations"), dict):
        snapshot["allocations"] = {
            kind: allocations for kind in ("srs", "pce")
            if (allocations := _list(raw["allocations"], kind, _allocation)) is not None}
    return cast(PartialSnapshot, snapshot)


def map_daemon_status(status: pb.GetStatusResponse) -> DaemonStatus:
    """GetStatus in the panels' shape. Upstream lists one GPU entry per worker: they are gathered
    per ordinal. A 0 that upstream hard-codes (SRS size and ref count, pinned memory) or sends
    for "unknown" (VRAM of an ordinal nvidia-smi did not list) is left out."""
    gpus: dict[int, DaemonGPU] = {}
    for entry in status.gpus:
        gpu = gpus.setdefault(entry.ordinal, DaemonGPU(ordinal=entry.ordinal, entries=0, jobs=[]))
        gpu["entries"] = gpu.get("entries", 0) + 1
        if entry.name and entry.name != f"GPU {entry.ordinal}":  # upstream's fallback name
            gpu["name"] = entry.name
        if entry.vram_total_bytes:
            gpu["vram_total_bytes"] = entry.vram_total_bytes
            gpu["vram_free_bytes"] = entry.vram_free_bytes
        if entry.current_job_id:
            gpu.setdefault("jobs", []).append({"job_id": entry.current_job_id,
                                               "proof_kind": entry.current_proof_kind})
    srs = []
    for loaded in status.loaded_srs:
        row = DaemonSRS(circuit_id=loaded.circuit_id, tier=pb.SRSStatus.Tier.Name(loaded.tier))
        if loaded.size_bytes:
            row["size_bytes"] = loaded.size_bytes
        if loaded.ref_count:
            row["ref_count"] = loaded.ref_count
        srs.append(row)
    mapped = DaemonStatus(
        gpus=sorted(gpus.values(), key=lambda g: g.get("ordinal", 0)),
        loaded_srs=srs,
        queues=[DaemonQueue(proof_kind=q.proof_kind, pending=q.pending,
                            in_progress=q.in_progress) for q in status.queues],
        total_proofs_completed=status.total_proofs_completed,
        total_proofs_failed=status.total_proofs_failed,
        uptime_seconds=status.uptime_seconds)
    if status.pinned_memory_limit_bytes:
        mapped["pinned_memory_bytes"] = status.pinned_memory_bytes
        mapped["pinned_memory_limit_bytes"] = status.pinned_memory_limit_bytes
    return mapped


GRPC_PARTS = ("gpus", "srs", "queues", "totals")
STATUS_PARTS = ("pipelines", "workers", "memory", "synthesis", "buffers")


def merge_sources(status_raw, status_problem: str, daemon: pb.GetStatusResponse,
                  poll: int) -> PartialSnapshot:
    """One snapshot from GetStatus and, when there is one, the `/status` answer; `sources` says
    where each part came from (or why a part is missing)."""
    if status_raw is not None:
        snapshot = map_snapshot(status_raw, poll)
    else:
        snapshot = cast(PartialSnapshot, {"flavour": FLAVOUR, "seq": poll,
                                          "uptime_secs": daemon.uptime_seconds})
    snapshot["daemon"] = map_daemon_status(daemon)
    sources = dict.fromkeys(GRPC_PARTS, "GetStatus")
    for part in STATUS_PARTS:
        sources[part] = "GET /status" if status_raw is not None else status_problem
    snapshot["sources"] = sources
    return snapshot


# ---- the watchers -------------------------------------------------------------------------

class UpstreamWatcher(MachineWatcher):
    """Polls an upstream daemon's `GET /status`; the same interface as MachineWatcher.

    It never sets `live.client`: the dispatcher, SRS actions and result waiters only use hosts
    with a client, so nothing is ever submitted to a daemon whose API we do not speak."""

    def __init__(self, live: MachineLive, transport: EngineTransport,
                 session: aiohttp.ClientSession, clock: Callable[[], float],
                 interval: float, *, connect_slots: asyncio.Semaphore | None = None):
        super().__init__(live, transport, session, clock, interval, connect_slots=connect_slots)
        self.detector = live.detector = LieDetector()
        self.polls = 0

    async def _follow(self, endpoint: EngineEndpoint, slot: RampSlot) -> None:
        """Poll GET /status until it fails: upstream has no stream."""
        slot.release()
        # Upstream has no auth; a token, if the operator gave one, is sent and ignored.
        client = EngineClient(endpoint.base_url, token=endpoint.token,
                              timeout=max(self.interval, 3.0), session=self.session)
        while True:
            self.take(await client.status())
            await asyncio.sleep(self.interval)

    def take(self, raw) -> None:
        """Map one upstream answer, flag its lies, and hand it to the controller."""
        self.polls += 1
        now = self.clock()
        snapshot = map_snapshot(raw, self.polls)
        snapshot["lies"] = [lie.as_dict() for lie in self.detector.check(snapshot, now)]
        snapshot["lie_tally"] = self.detector.tally_rows()
        snapshot["poll_interval"] = self.interval
        self.live.accept(snapshot, "poll", now)


STATUS_OFF = "not reported: the daemon's HTTP status server is off (status_listen)"


class GrpcUpstreamWatcher(UpstreamWatcher):
    """Polls an upstream daemon's gRPC GetStatus (and GET /status when its status server is on);
    a daemon that does not answer GetStatus is down, whatever its status server says."""

    def __init__(self, live: MachineLive, transport: EngineTransport,
                 session: aiohttp.ClientSession, clock: Callable[[], float],
                 interval: float, *, address: DaemonAddress, status_server: bool,
                 connect_slots: asyncio.Semaphore | None = None):
        super().__init__(live, transport, session, clock, interval, connect_slots=connect_slots)
        self.address = address
        self.status_server = status_server

    async def _watch_once(self, backoff: float, seen: float | None) -> float:
        async with RampSlot(self.connect_slots) as slot:
            try:
                target = await self.transport.grpc_target(self.address)
                async with CuzkClient(target, timeout=max(self.interval, 3.0)) as client:
                    try:
                        await self._follow_grpc(client, slot)
                    finally:
                        self.live.daemon = None
            except TransportError as exc:  # CuzkError too: the daemon did not answer
                slot.release()
                return await self._down(str(exc), backoff, seen)
        return self.interval

    async def _status_server(self) -> tuple[object | None, str]:
        """The /status answer, or None and why there is none (the gRPC API still answers)."""
        if not self.status_server:
            return None, STATUS_OFF
        try:
            endpoint = await self.transport.connect()
            client = EngineClient(endpoint.base_url, timeout=max(self.interval, 3.0),
                                  session=self.session)
            return await client.status(), ""
        except (TransportError, EngineError) as exc:
            return None, f"not reported: GET /status failed ({exc})"

    async def _follow_grpc(self, client: CuzkClient, slot: RampSlot) -> None:
        while True:
            status = await client.get_status()
            self.live.daemon = client
            slot.release()
            raw, problem = await self._status_server()
            self.take_grpc(status, raw, problem)
            await asyncio.sleep(self.interval)

    def take_grpc(self, status: pb.GetStatusResponse, raw, problem: str) -> None:
        self.polls += 1
        now = self.clock()
        snapshot = merge_sources(raw, problem, status, self.polls)
        snapshot["lies"] = [lie.as_dict() for lie in self.detector.check(snapshot, now)]
        snapshot["lie_tally"] = self.detector.tally_rows()
        snapshot["poll_interval"] = self.interval
        self.live.accept(snapshot, "GetStatus", now)


def watcher_for(machine, live: MachineLive, transport: EngineTransport,
                session: aiohttp.ClientSession, clock: Callable[[], float],
                interval: float, connect_slots: asyncio.Semaphore | None = None) -> MachineWatcher:
    """The watcher for this machine's engine flavour (`interval`: the controller's)."""
    if machine.speaks_grpc:
        return GrpcUpstreamWatcher(live, transport, session, clock, poll_interval(interval),
                                   address=DaemonAddress.parse(machine.engine_url),
                                   status_server=machine.status_server,
                                   connect_slots=connect_slots)
    if machine.is_upstream:
        return UpstreamWatcher(live, transport, session, clock, poll_interval(interval),
                               connect_slots=connect_slots)
    return MachineWatcher(live, transport, session, clock, interval, connect_slots=connect_slots)
