import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eventually(predicate: Callable[[], object], timeout: float, what: str,
               logs: Callable[[], str] = lambda: "", every: float = 0.1):
    """Poll `predicate` until it returns something truthy (returned); fail with `what` and,
    when given, `logs()` of the processes under test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s\n{logs()}")
        time.sleep(every)


def wait_for_http(url: str, timeout: float, died: Callable[[], str | None] = lambda: None) -> int:
    """Poll `url` until it answers and return its status; fail at once with `died()`'s message
    when a process the answer depends on has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if message := died():
            raise AssertionError(message)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            # TimeoutError: accepted but not answered yet (a busy machine, still starting).
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout}s")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def clean_env(tmp_path):
    """An environment for child processes: our data dir in tmp, no inherited config variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                        "VASTMGR_HTTPS", "VASTMGR_ADMIN_USER", "VASTMGR_ADMIN_PASSWORD"}}
    env["VASTMGR_DATA_DIR"] = str(tmp_path / "data")
    env["DJANGO_SETTINGS_MODULE"] = "vastmgr.settings"
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture
def python() -> str:
    return sys.executable
