"""A small async client for the engine API, as the controller needs it.

Errors are split in two so callers can decide honestly: `EngineRejected` means the engine
answered and refused (bad kind/profile: fail the job with its reason); `EngineUnreachable`
means we do not know what the engine thinks (connection down, timeout, 5xx: retry later).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

from .transport import EngineEndpoint


class EngineUnreachable(RuntimeError):
    pass


class EngineRejected(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class EngineClient:
    def __init__(self, session: aiohttp.ClientSession, endpoint: EngineEndpoint,
                 timeout: float = 5.0):
        self.session = session
        self.endpoint = endpoint
        self.timeout = timeout

    @property
    def headers(self) -> dict[str, str]:
        if self.endpoint.token:
            return {"Authorization": f"Bearer {self.endpoint.token}"}
        return {}

    async def _request(self, method: str, path: str, *, json_body=None, timeout=None,
                       allow_404=False):
        url = self.endpoint.base_url + path
        try:
            async with self.session.request(
                method, url, json=json_body, headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
            ) as response:
                body = await response.text()
                if response.status == 404 and allow_404:
                    return None
                if response.status >= 500:
                    raise EngineUnreachable(f"{method} {path}: engine error {response.status}")
                if response.status >= 400:
                    raise EngineRejected(response.status, _error_text(body, response.status))
                return json.loads(body) if body else {}
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(f"{method} {path}: {exc.__class__.__name__} {exc}") from exc
        except json.JSONDecodeError as exc:
            raise EngineUnreachable(f"{method} {path}: answer is not JSON") from exc

    async def status(self) -> dict:
        return await self._request("GET", "/status")

    async def stream(self) -> AsyncIterator[dict]:
        """Yield snapshots from the status stream; None when nothing came for `timeout` s."""
        url = self.endpoint.base_url + "/v1/status/stream"
        try:
            async with self.session.ws_connect(url, headers=self.headers, heartbeat=None,
                                               timeout=aiohttp.ClientWSTimeout(ws_close=2)) as ws:
                while True:
                    try:
                        message = await ws.receive(timeout=self.timeout)
                    except TimeoutError:
                        yield None
                        continue
                    if message.type == aiohttp.WSMsgType.TEXT:
                        yield json.loads(message.data)
                    elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                          aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                        raise EngineUnreachable(f"status stream closed ({message.type.name})")
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(f"status stream: {exc.__class__.__name__} {exc}") from exc
        except json.JSONDecodeError as exc:
            raise EngineUnreachable("status stream sent something that is not JSON") from exc

    async def submit(self, *, request_id: str, kind: str, profile: str, seed: int,
                     priority: str) -> dict:
        return await self._request("POST", "/v1/proofs", json_body={
            "request_id": request_id, "kind": kind, "profile": profile, "seed": seed,
            "priority": priority,
        })

    async def get(self, job_id: str, wait: float = 0) -> dict | None:
        """The job's record, or None when the engine does not know it (e.g. it restarted)."""
        path = f"/v1/proofs/{job_id}" + (f"?wait={wait:g}" if wait else "")
        return await self._request("GET", path, timeout=wait + self.timeout, allow_404=True)

    async def cancel(self, job_id: str) -> None:
        await self._request("DELETE", f"/v1/proofs/{job_id}", allow_404=True)

    async def srs_preload(self, circuit_id: str) -> None:
        await self._request("POST", f"/v1/srs/{circuit_id}/preload", timeout=120)

    async def srs_evict(self, circuit_id: str) -> None:
        await self._request("DELETE", f"/v1/srs/{circuit_id}")


def _error_text(body: str, status: int) -> str:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()[:500] or f"HTTP {status}"
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            if data.get(key):
                return str(data[key])[:500]
    return body[:500]
