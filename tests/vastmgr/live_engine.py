"""A real engine process on loopback for end-to-end tests (tiny profiles only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, wait_for_http

START_TIMEOUT = 60


class LiveEngine:
    def __init__(self, param_cache: Path, port: int | None = None):
        self.param_cache = param_cache
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiveEngine:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cuzk_engine", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--param-cache", str(self.param_cache), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        proc = self.proc
        wait_for_http(self.url + "/status", START_TIMEOUT, died=lambda: None if proc.poll() is None
                      else f"engine exited: {proc.stderr.read()[-2000:]}")
        return self

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=2) as response:
            return json.load(response)

    def submit(self, **body) -> dict:
        request = urllib.request.Request(self.url + "/v1/proofs", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def param_cache(tmp_path_factory) -> Path:
    """One parameter cache for the session: the seeded tiny setup runs once."""
    return tmp_path_factory.mktemp("params")


@pytest.fixture
def engine(param_cache):
    live = LiveEngine(param_cache).start()
    yield live
    live.stop()


class FakeClock:
    """The controller's clock, moved by the test (time.time() units)."""

    def __init__(self, start: float | None = None):
        self.now = start if start is not None else time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def session_cookie(username: str = "op") -> bytes:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username=username)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def ws_headers(cookie: bytes | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    return headers


async def wait_until(predicate, timeout: float = 30.0, every: float = 0.1):
    """Await an (async or sync) predicate until it returns something truthy."""
    import asyncio
    import inspect

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def running_controller(**options):
    """A fleet controller running its own loop (fast ticks) for the duration of the block."""
    from vastmgr.controller.service import FleetController
    from vastmgr.front.publish import LayerPublisher

    controller = FleetController(publisher=LayerPublisher(), tick=0.2, interval=0.5, **options)
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        yield controller
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
