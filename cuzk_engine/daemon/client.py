"""A small async client for the engine API (used by the dashboard; no Django here)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Self

import aiohttp

from cuzk_engine.errors import CuzkError


class EngineAPIError(CuzkError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class EngineClient:
    """``async with EngineClient("http://127.0.0.1:9821", token=...) as c: await c.status()``"""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = aiohttp.ClientSession(headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def _call(self, method: str, path: str, *, timeout: float | None = None,
                    **kw) -> Any:
        extra = {"timeout": aiohttp.ClientTimeout(total=timeout)} if timeout else {}
        async with self._session.request(method, self.base_url + path, **kw, **extra) as r:
            try:
                body = await r.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ContentTypeError):
                body = {"error": (await r.text())[:200]}
            if r.status >= 400:
                raise EngineAPIError(r.status, body.get("error", "") if isinstance(body, dict)
                                     else str(body))
            return body

    async def submit(self, kind: str, profile: str, seed: int, *, priority: str | None = None,
                     request_id: str | None = None) -> dict:
        payload: dict[str, Any] = {"kind": kind, "profile": profile, "seed": seed}
        if priority is not None:
            payload["priority"] = priority
        if request_id is not None:
            payload["request_id"] = request_id
        return await self._call("POST", "/v1/proofs", json=payload)

    async def get(self, job_id: str, *, wait: float | None = None) -> dict:
        params = {"wait": str(wait)} if wait else {}
        return await self._call("GET", f"/v1/proofs/{job_id}", params=params,
                                timeout=(wait + 30.0) if wait else None)

    async def cancel(self, job_id: str) -> dict:
        return await self._call("DELETE", f"/v1/proofs/{job_id}")

    async def status(self) -> dict:
        return await self._call("GET", "/status")

    async def info(self) -> dict:
        return await self._call("GET", "/v1/info")

    async def preload(self, circuit_id: str) -> dict:
        return await self._call("POST", f"/v1/srs/{circuit_id}/preload", timeout=600.0)

    async def evict(self, circuit_id: str) -> dict:
        return await self._call("DELETE", f"/v1/srs/{circuit_id}")

    async def metrics(self) -> str:
        async with self._session.get(self.base_url + "/metrics") as r:
            if r.status >= 400:
                raise EngineAPIError(r.status, await r.text())
            return await r.text()

    async def stream_snapshots(self) -> AsyncIterator[dict]:
        """Yields the full snapshot first, then one per change (coalesced by the engine)."""
        async with self._session.ws_connect(self.base_url + "/v1/status/stream",
                                            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                                            heartbeat=30.0) as ws:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    yield json.loads(msg.data)
                elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
