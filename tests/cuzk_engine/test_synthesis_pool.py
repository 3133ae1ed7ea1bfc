"""The synthesis pool never outlives its engine: kill -9 of the engine takes the workers, the
forkserver and the resource tracker with it, and a new engine kills a pool a crash left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from cuzk_engine.engine.pool import OWNER_ENV
from tests.conftest import REPO, eventually, free_port, wait_for_http

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


def marked_processes(owner_pid: int | None = None) -> set[int]:
    """Pids whose environment carries a pool marker (of `owner_pid`, when given)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(f"{OWNER_ENV}=".encode()):
                owner = int(item.split(b"=", 1)[1].split(b":")[0])
                if owner_pid is None or owner == owner_pid:
                    found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def start_engine(cache) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cuzk_engine", "serve", "--listen", f"127.0.0.1:{port}",
         "--param-cache", str(cache), "--log-level", "warning"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def died() -> str | None:
        if proc.poll() is None:
            return None
        return f"engine exited: {proc.stderr.read()[-2000:]}"

    wait_for_http(url + "/status", 60, died)
    return proc, url


def prove(url: str) -> None:
    body = json.dumps({"kind": "winning-post", "profile": "tiny", "seed": 1}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/proofs", data=body),
                                timeout=5) as r:
        job_id = json.load(r)["job_id"]
    with urllib.request.urlopen(f"{url}/v1/proofs/{job_id}?wait=60", timeout=70) as r:
        assert json.load(r)["status"] == "done"


def test_kill_9_of_the_engine_takes_its_whole_pool_with_it(tiny_cache):
    engine, url = start_engine(tiny_cache)
    try:
        prove(url)  # the pool starts lazily: now the forkserver, workers and tracker exist
        pool = marked_processes(engine.pid)
        assert len(pool) >= 3, "expected a forkserver, a resource tracker and a worker"
    finally:
        engine.send_signal(signal.SIGKILL)
        engine.wait(10)
    eventually(lambda: not any(alive(pid) for pid in pool), 10,
               f"pool processes {sorted(p for p in pool if alive(p))} outlived the engine")


def test_a_new_engine_kills_a_pool_left_behind_by_a_dead_one(tiny_cache):
    # A process marked as belonging to an engine that no longer runs (this pid with another
    # start time: a reused pid), as a pool would be if its watcher never got to run. It sleeps
    # until it is killed, as an idle pool worker would.
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, OWNER_ENV: f"{os.getpid()}:1"})
    engine, _ = start_engine(tiny_cache)
    try:
        assert stale.wait(10) == -signal.SIGKILL
    finally:
        stale.kill()
        engine.terminate()
        engine.wait(30)
