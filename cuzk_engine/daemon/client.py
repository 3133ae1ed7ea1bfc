"""An async client for the engine API (used by the dashboard and its tools; no Django here).

Failures come in two kinds (both in `cuzk_engine.errors`) so callers can act on them honestly:

- `EngineAPIError`: the engine answered and refused (HTTP 4xx: unknown kind or profile, a
  request id reused with other parameters, a bad token). Repeating the request will not help;
  a job that gets this should fail with the message.
- `EngineUnreachable`: there is no usable answer (connection refused or lost, timeout, a 5xx,
  a body that is not JSON, the status stream closing). What the engine thinks is unknown, so
  the caller should retry later.

Snapshots come typed (`EngineSnapshot`); one that does not have the snapshot's shape raises
`SnapshotFormatError` (the engine answered, with something no reader can trust).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, Self

import aiohttp

from cuzk_engine.engine.snapshot import EngineSnapshot, StreamHeartbeat
from cuzk_engine.errors import EngineAPIError, EngineUnreachable

# Statuses that say "not now" rather than "never": retried like a lost connection.
RETRY_LATER = frozenset({408, 429})
# After a quiet timeout the stream is read once more with this timeout, which ends as soon as
# the event loop has had one more turn: only a stream with nothing waiting is silent.
BUFFERED_ONLY = 1e-6


class StreamedSnapshot:
    """A snapshot from the status stream as the JSON it came as (`stream_status(keep_json=
    True)`): `data` is `text` decoded. It is checked when it arrives (`EngineSnapshot.check_json`
    refuses what `from_json` refuses, with its message) but read into the typed `snapshot`
    only when that is first asked for: a reader that stores or renders the JSON (the fleet
    controller, a thousand snapshots a second) then pays for the typed form only where it
    uses it."""

    __slots__ = ("_snapshot", "data", "text")

    def __init__(self, data: dict, text: str):
        EngineSnapshot.check_json(data)
        self.data = data
        self.text = text
        self._snapshot: EngineSnapshot | None = None

    @property
    def seq(self) -> int:
        return self.data["seq"]

    @property
    def snapshot(self) -> EngineSnapshot:
        if self._snapshot is None:
            self._snapshot = EngineSnapshot.from_json(self.data)
        return self._snapshot


class EngineClient:
    """``async with EngineClient("http://127.0.0.1:9821", token=...) as c: await c.snapshot()``

    `timeout` bounds every request (a long-poll `get` gets its wait on top). Pass `session` to
    share one connection pool between many clients (a fleet controller watching many engines);
    the client then leaves it open on `close()`.
    """

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0,
                 session: aiohttp.ClientSession | None = None, heartbeat: float = 20.0):
        if timeout <= 0 or heartbeat <= 0:
            raise ValueError("timeout and heartbeat must be positive")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.heartbeat = heartbeat
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_session = session is None
        self._session = session or aiohttp.ClientSession()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session:
            await self._session.close()

    async def _call(self, method: str, path: str, *, timeout: float | None = None,
                    text: bool = False, **kw) -> Any:
        where = f"{method} {path}"
        try:
            async with self._session.request(
                method, self.base_url + path, headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout), **kw,
            ) as r:
                body = await r.text()
                status = r.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(f"{where}: {type(exc).__name__} {exc}".rstrip()) from exc
        if status >= 500 or status in RETRY_LATER:
            raise EngineUnreachable(f"{where}: HTTP {status} {_error_text(body)}".rstrip(),
                                    status)
        if status >= 400:
            raise EngineAPIError(status, _error_text(body) or f"{where} refused")
        if text:
            return body
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            raise EngineUnreachable(f"{where}: the answer is not JSON: {body[:80]!r}") from None

    async def submit(self, kind: str, profile: str, seed: int, *, priority: str | None = None,
                     request_id: str | None = None) -> dict:
        """Submit a proof; with `request_id`, submitting the same request again is harmless."""
        payload: dict[str, Any] = {"kind": kind, "profile": profile, "seed": seed}
        if priority is not None:
            payload["priority"] = priority
        if request_id is not None:
            payload["request_id"] = request_id
        return await self._call("POST", "/v1/proofs", json=payload)

    async def get(self, job_id: str, *, wait: float | None = None) -> dict:
        """The job's record; with `wait`, the engine holds the answer up to that many seconds
        for the job to finish. A job the engine does not know raises EngineAPIError 404."""
        params = {"wait": f"{wait:g}"} if wait else {}
        return await self._call("GET", f"/v1/proofs/{job_id}", params=params,
                                timeout=(wait or 0) + self.timeout)

    async def cancel(self, job_id: str) -> dict:
        return await self._call("DELETE", f"/v1/proofs/{job_id}")

    async def snapshot(self) -> EngineSnapshot:
        """The engine's status snapshot (GET /status)."""
        return EngineSnapshot.from_json(await self.status())

    async def status(self) -> dict:
        """GET /status as sent, unchecked: for daemons whose status has another schema
        (Curio's upstream cuzk) and for tests of the wire format."""
        return await self._call("GET", "/status")

    async def info(self) -> dict:
        return await self._call("GET", "/v1/info")

    async def preload(self, circuit_id: str) -> dict:
        # Loading parameters from disk can take minutes for large profiles.
        return await self._call("POST", f"/v1/srs/{circuit_id}/preload",
                                timeout=max(self.timeout, 600.0))

    async def evict(self, circuit_id: str) -> dict:
        return await self._call("DELETE", f"/v1/srs/{circuit_id}")

    async def metrics(self) -> str:
        return await self._call("GET", "/metrics", text=True)

    async def stream_snapshots(self, *, idle: float | None = None
                               ) -> AsyncIterator[EngineSnapshot | None]:
        """Yields the full snapshot first, then one per change (coalesced by the engine).

        The engine sends nothing while nothing changes, so silence is not a failure: with
        `idle`, None is yielded after that many quiet seconds (the caller can then ask
        `snapshot()` whether the engine is alive). A connection that dies is found by the
        websocket heartbeat; it, and any close of the stream, raise EngineUnreachable.
        """
        async with aclosing(self.stream_status(idle=idle)) as messages:
            async for message in messages:
                assert not isinstance(message, StreamedSnapshot), "only with keep_json"
                if not isinstance(message, StreamHeartbeat):  # not asked for: nothing to say
                    yield message

    async def stream_status(self, *, idle: float | None = None, heartbeat: float | None = None,
                            keep_json: bool = False,
                            loads: Callable[[str], Any] = json.loads
                            ) -> AsyncGenerator[EngineSnapshot | StreamedSnapshot
                                                | StreamHeartbeat | None]:
        """`stream_snapshots`, and with `heartbeat` the engine is asked to send a
        `StreamHeartbeat` (its seq now) after that many seconds with nothing sent. An engine
        that does not know heartbeats ignores the ask and stays silent, so the caller still
        needs `idle` (set it above `heartbeat`) to tell silence from a heartbeat. With
        `keep_json` each snapshot comes as a `StreamedSnapshot`. `loads` decodes each message
        (any JSON decoder whose errors are ValueErrors: a reader of a thousand streams may
        bring a faster one than the standard library's)."""
        url = self.base_url + "/v1/status/stream"
        params = {} if heartbeat is None else {"heartbeat": f"{heartbeat:g}"}
        try:
            async with self._session.ws_connect(url, headers=self._headers, params=params,
                                                heartbeat=self.heartbeat,
                                                timeout=aiohttp.ClientWSTimeout(ws_close=5.0)
                                                ) as ws:
                while True:
                    try:
                        message = await ws.receive(timeout=idle)
                    except TimeoutError:
                        # An event loop that stalled past `idle` runs the expired timeout
                        # before the read it woke with: frames that arrived meanwhile are
                        # waiting, and a stream with frames waiting is not silent.
                        try:
                            message = await ws.receive(timeout=BUFFERED_ONLY)
                        except TimeoutError:
                            yield None
                            continue
                    if message.type == aiohttp.WSMsgType.TEXT:
                        try:
                            data = loads(message.data)
                        except ValueError as exc:
                            raise EngineUnreachable(
                                "status stream sent something that is not JSON") from exc
                        beat = StreamHeartbeat.from_json(data)
                        if beat is not None:
                            yield beat
                        elif keep_json:
                            yield StreamedSnapshot(data, message.data)
                        else:
                            yield EngineSnapshot.from_json(data)
                    elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                          aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        raise EngineUnreachable(f"status stream closed ({message.type.name})")
        except aiohttp.WSServerHandshakeError as exc:
            if 400 <= exc.status < 500 and exc.status not in RETRY_LATER:
                raise EngineAPIError(exc.status, f"status stream refused: {exc.message}") from exc
            raise EngineUnreachable(f"status stream: HTTP {exc.status} {exc.message}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(f"status stream: {type(exc).__name__} {exc}") from exc


def _error_text(body: str) -> str:
    """The engine's own message from an error body (JSON `error`), else the start of the text."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()[:300]
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            if data.get(key):
                return str(data[key])[:500]
    return body.strip()[:300]
