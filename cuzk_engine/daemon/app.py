"""The engine's HTTP + WebSocket API (aiohttp).

Every input is validated and every error is a JSON body ``{"error": "..."}`` with a 4xx status;
a bearer token, when configured, guards every route.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import logging
import math
import os
import re
import time
import uuid
from typing import Any, NoReturn

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cuzk_engine.daemon.metrics import EngineMetrics
from cuzk_engine.engine.orchestrator import Engine
from cuzk_engine.engine.snapshot import StreamHeartbeat
from cuzk_engine.errors import (
    BudgetExceeded,
    CuzkError,
    EngineNotAccepting,
    InvalidRequest,
    JobNotFound,
    RequestConflict,
    SrsInUse,
)

log = logging.getLogger("cuzk_engine.daemon")

ENGINE_KEY = web.AppKey("engine", Engine)
METRICS_KEY = web.AppKey("metrics", EngineMetrics)
STREAMS_KEY = web.AppKey("streams", set[web.WebSocketResponse])
MAX_WAIT_SECONDS = 300.0
MAX_JSON_DEPTH = 8
# Who this engine process is: whoever started it may choose the id (CUZK_INSTANCE_ID), so a
# health check can tell the engine it just started from an old one still holding the port.
INSTANCE_ID = os.environ.get("CUZK_INSTANCE_ID") or uuid.uuid4().hex
_SUBMIT_FIELDS = {"request_id", "kind", "profile", "seed", "priority"}
_STATUS_FOR = (
    (InvalidRequest, 400),
    (JobNotFound, 404),
    (RequestConflict, 409),
    (SrsInUse, 409),
    (BudgetExceeded, 413),
    (EngineNotAccepting, 503),
)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.content_type == "application/json":
            raise
        return error(e.status, e.reason if not e.text or e.text.startswith(str(e.status))
                     else e.text)
    except _BodyError as e:
        return error(e.status, str(e))
    except CuzkError as e:
        for cls, status in _STATUS_FOR:
            if isinstance(e, cls):
                return error(status, str(e))
        return error(400, str(e))
    except Exception:
        # A bug, not the client's fault; still a JSON body, and the traceback stays in the log.
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal error (logged by the engine)")


def auth_middleware(token: str | None) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is not None:
            header = request.headers.get("Authorization", "")
            given = header[7:] if header.startswith("Bearer ") else ""
            # surrogatepass: a header of undecodable bytes arrives as lone surrogates.
            if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode()):
                return error(401, "missing or wrong bearer token (Authorization: Bearer ...)")
        return await handler(request)

    return check


async def get_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENGINE_KEY].snapshot().to_json())


async def get_info(request: web.Request) -> web.Response:
    return web.json_response({**request.app[ENGINE_KEY].info(), "instance_id": INSTANCE_ID,
                              "pid": os.getpid()})


async def post_proof(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    if not isinstance(body, dict):
        return error(400, "request body must be a JSON object")
    unknown = set(body) - _SUBMIT_FIELDS
    if unknown:
        return error(400, f"unknown field(s): {', '.join(sorted(unknown))} "
                          f"(allowed: {', '.join(sorted(_SUBMIT_FIELDS))})")
    missing = [k for k in ("kind", "profile", "seed") if k not in body]
    if missing:
        return error(400, f"missing field(s): {', '.join(missing)}")
    job, position, created = engine.submit(
        body["kind"], body["profile"], body["seed"], priority=body.get("priority"),
        request_id=body.get("request_id"))
    return web.json_response(
        {"job_id": job.job_id, "queue_position": position, "status": job.status,
         "created": created},
        status=202 if created else 200)


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or a 4xx saying what is wrong with it. The body size is
    bounded by the app's client_max_size (413); here: charset, nesting depth, syntax."""
    charset = request.charset or "utf-8"
    try:
        utf8 = codecs.lookup(charset).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        raise _BodyError(415, f"unsupported charset {charset[:40]!r}: send UTF-8 JSON")
    try:
        text = (await request.read()).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _BodyError(400, f"request body is not valid UTF-8: {e}") from None
    depth = _nesting_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise _BodyError(400, f"request body is nested {depth} deep; at most {MAX_JSON_DEPTH}")
    try:
        return json.loads(text, parse_float=_no_float, parse_constant=_no_constant)
    except ValueError as e:  # JSONDecodeError, a float, NaN/Infinity, an int of > 4300 digits
        raise _BodyError(400, f"request body is not valid JSON: {e}") from None


class _BodyError(Exception):
    """A request body the API cannot read; ``status`` is the 4xx it answers."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# Brackets outside strings; a string's escapes are skipped whole, so "\"" does not end it.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[{]|[\]}]', re.DOTALL)


def _nesting_depth(text: str) -> int:
    """Deepest bracket nesting, counted before parsing: json.loads recurses and would raise
    RecursionError on thousands of levels."""
    depth = deepest = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _no_float(s: str) -> NoReturn:
    raise ValueError(f"numbers must be integers, got {s[:40]}")


def _no_constant(s: str) -> NoReturn:
    raise ValueError(f"{s} is not a number JSON allows")


async def get_proof(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    raw = request.query.get("wait")
    wait = None
    if raw is not None:
        try:
            wait = float(raw)
        except ValueError:
            return error(400, f"wait must be a number of seconds, got {raw!r}")
        if not math.isfinite(wait) or not 0 <= wait <= MAX_WAIT_SECONDS:
            return error(400, f"wait must be between 0 and {MAX_WAIT_SECONDS:g} seconds")
    job = await engine.wait(request.match_info["job_id"], wait)
    return web.json_response(engine.result(job))


async def delete_proof(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(engine.result(engine.cancel(request.match_info["job_id"])))


async def preload_srs(request: web.Request) -> web.Response:
    circuit = request.match_info["circuit_id"]
    already, ms = await request.app[ENGINE_KEY].preload(circuit)
    return web.json_response({"circuit_id": circuit, "already_loaded": already,
                              "load_time_ms": round(ms, 3)})


async def evict_srs(request: web.Request) -> web.Response:
    circuit = request.match_info["circuit_id"]
    freed = request.app[ENGINE_KEY].evict(circuit)
    return web.json_response({"circuit_id": circuit, "was_loaded": freed > 0,
                              "freed_bytes": freed})


async def get_metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status_stream(request: web.Request) -> web.WebSocketResponse | web.Response:
    """First a full snapshot, then one per change, at most one per stream interval. With
    ``?heartbeat=S``, a heartbeat carrying the current seq after S seconds with nothing sent, so
    a quiet stream proves the engine alive and unchanged without a GET /status."""
    engine = request.app[ENGINE_KEY]
    interval = engine.config.daemon.stream_interval
    raw = request.query.get("heartbeat")
    heartbeat = None
    if raw is not None:
        try:
            heartbeat = StreamHeartbeat.interval(raw)
        except ValueError as exc:
            return error(400, str(exc))
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    streams = request.app[STREAMS_KEY]
    streams.add(ws)
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()
    pending = False

    def poke() -> None:  # called from writer threads; cheap and coalescing
        nonlocal pending
        if not pending:
            pending = True
            loop.call_soon_threadsafe(changed.set)

    async def reader() -> None:
        async for msg in ws:
            if msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                break

    engine.tracker.add_listener(poke)
    read_task = asyncio.create_task(reader())
    try:
        last_seq = -1
        last_sent = time.monotonic()
        while not ws.closed and not read_task.done():
            snap = engine.snapshot()
            if snap.seq != last_seq:
                last_seq = snap.seq
                await ws.send_str(json.dumps(snap.to_json()))
                last_sent = time.monotonic()
            checked_at = time.monotonic()
            wait_change = asyncio.create_task(changed.wait())
            while True:
                quiet_for = (None if heartbeat is None
                             else max(0.0, last_sent + heartbeat - time.monotonic()))
                done, _ = await asyncio.wait({wait_change, read_task}, timeout=quiet_for,
                                             return_when=asyncio.FIRST_COMPLETED)
                # A change whose listener call is still on its way is news, not a heartbeat.
                if done or engine.tracker.seq != last_seq:
                    break
                await ws.send_str(json.dumps(StreamHeartbeat(last_seq).to_json()))
                last_sent = time.monotonic()
            wait_change.cancel()
            if read_task in done:
                break
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - checked_at)))
            pending = False
            changed.clear()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        streams.discard(ws)
        engine.tracker.remove_listener(poke)
        read_task.cancel()
        await ws.close()
    return ws


async def close_streams(app: web.Application) -> None:
    """Ends every status stream when the API shuts down: a client that never asks anything
    else (one taking heartbeats as proof of life) would otherwise hold the shutdown until the
    websocket ping times out, and go on believing the engine alive meanwhile."""
    open_streams: set[web.WebSocketResponse] = app[STREAMS_KEY]
    for ws in list(open_streams):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"engine stopping")




def build_app(engine: Engine) -> web.Application:
    app = web.Application(
        middlewares=[errors_middleware, auth_middleware(engine.config.daemon.token)],
        client_max_size=64 * 1024,
    )
    app[ENGINE_KEY] = engine
    app[METRICS_KEY] = EngineMetrics(engine)
    app[STREAMS_KEY] = set()
    app.on_shutdown.append(close_streams)
    app.router.add_get("/status", get_status)
    app.router.add_get("/v1/status", get_status)
    app.router.add_get("/v1/status/stream", status_stream)
    app.router.add_get("/v1/info", get_info)
    app.router.add_post("/v1/proofs", post_proof)
    app.router.add_get("/v1/proofs/{job_id}", get_proof)
    app.router.add_delete("/v1/proofs/{job_id}", delete_proof)
    app.router.add_post("/v1/srs/{circuit_id}/preload", preload_srs)
    app.router.add_delete("/v1/srs/{circuit_id}", evict_srs)
    app.router.add_get("/metrics", get_metrics)
    return app
