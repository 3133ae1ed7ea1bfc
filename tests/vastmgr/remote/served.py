"""The served stack (`manage.py up`: daphne, controller, automation, a local engine) driven over
HTTP as an operator's browser would: a session cookie, the CSRF token from each form, status
codes and timings of every answer kept, so a test can assert that no page 500s or waits."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devtools.fake_vast import FakeVast
from tests.conftest import eventually
from tests.vastmgr.served.test_faults import ADMIN, PASSWORD, Stack


@dataclass(frozen=True)
class Answer:
    status: int
    url: str  # where the answer came from, after redirects
    body: str
    seconds: float


class Operator:
    """One logged-in browser session on a served stack."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.answers: list[tuple[str, Answer]] = []

    def _send(self, request: urllib.request.Request, timeout: float) -> Answer:
        started = time.monotonic()
        try:
            with self.stack.http.open(request, timeout=timeout) as response:
                answer = Answer(response.status, response.geturl(),
                                response.read().decode(errors="replace"),
                                time.monotonic() - started)
        except urllib.error.HTTPError as exc:
            answer = Answer(exc.code, exc.geturl(), exc.read().decode(errors="replace"),
                            time.monotonic() - started)
        self.answers.append((request.full_url, answer))
        return answer

    def get(self, path: str, timeout: float = 60) -> Answer:
        return self._send(urllib.request.Request(self.stack.url + path), timeout)

    def post(self, path: str, fields: dict | None = None, *, form: str | None = None,
             timeout: float = 60) -> Answer:
        """Post `fields` with the CSRF token of the page at `form` (the page itself by default),
        as a browser submits a form it shows."""
        token = self.csrf(form or path)
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **(fields or {})},
                                      doseq=True)
        request = urllib.request.Request(self.stack.url + path, data=body.encode(),
                                         headers={"Referer": self.stack.url + (form or path)})
        return self._send(request, timeout)

    def csrf(self, path: str) -> str:
        page = self.get(path).body
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page) or \
            re.search(r'"X-CSRFToken": *"([^"]+)"', page)
        assert found, f"no CSRF token on {path}"
        return found.group(1)

    def login(self) -> None:
        answer = self.post("/accounts/login/", {"username": ADMIN, "password": PASSWORD})
        assert "/accounts/login/" not in answer.url, answer.body[:500]

    def server_errors(self) -> list[str]:
        return [f"{url}: {a.status}" for url, a in self.answers if a.status >= 500]


class FakeOnItsLoop:
    """The strict fake Vast on its own event loop in a thread, for the stack's processes to
    call; the test reaches its state on that loop, never from another thread. `options` go to
    FakeVast (its boot times, SSH endpoint, market)."""

    def __init__(self, api_key: str, **options) -> None:
        self.api_key = api_key
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake = FakeVast(api_key, **options)
        self.url = asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(30)

    def __call__(self, function, *args, **kwargs):
        async def run():
            return function(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def console(self, instance_id: int, state: str) -> None:
        """Stop or start an instance as another Vast client does (the console, the CLI)."""
        request = urllib.request.Request(
            f"{self.url}/api/v0/instances/{instance_id}/", method="PUT",
            data=json.dumps({"state": state}).encode(),
            headers={"Authorization": f"Bearer {self.api_key}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start_stack(root: Path, param_cache: Path, env: dict[str, str]) -> Stack:
    stack = Stack(root, param_cache)
    stack.env.update(env)
    stack.start()
    return stack


def served_stack(root: Path, param_cache: Path, env: dict[str, str]) -> Iterator[Stack]:
    """A module fixture's body: the stack served while the module's tests run, then stopped
    with Ctrl-C and anything it left behind killed."""
    stack = start_stack(root, param_cache, env)
    yield stack
    if stack.up.poll() is None:
        stack.ctrl_c()
    for line in stack.leftovers():
        os.kill(int(line.split(":")[0]), signal.SIGKILL)


def machine_state(stack: Stack, name: str) -> str | None:
    rows = stack.query("SELECT state FROM fleet_machine WHERE name = ? AND state != 'killed'",
                       name)
    return rows[0][0] if rows else None


def machine_id(stack: Stack, name: str) -> int:
    return stack.query("SELECT id FROM fleet_machine WHERE name = ? AND state != 'killed'",
                       name)[0][0]


def events_of(stack: Stack, machine: int, after: int = 0) -> list[tuple[int, str, str]]:
    return stack.query("SELECT id, level, message FROM fleet_event WHERE machine_id = ? "
                       "AND id > ? ORDER BY id", machine, after)


def last_event(stack: Stack) -> int:
    return stack.query("SELECT COALESCE(MAX(id), 0) FROM fleet_event")[0][0]


def wait_state(stack: Stack, machine: int, name: str, state: str, *, after: int = 0,
               timeout: float = 300) -> None:
    """Until the machine is in `state`; fail at once with its Events when an error is
    recorded after Event `after`."""
    def reached():
        errors = [e for e in events_of(stack, machine, after) if e[1] == "error"]
        assert not errors, "\n".join(m for _, _, m in events_of(stack, machine))
        return machine_state(stack, name) == state
    eventually(reached, timeout, f"{name} never reached {state}",
               logs=lambda: "\n".join(m for _, _, m in events_of(stack, machine)), every=0.3)


def wait_event(stack: Stack, machine: int, text: str, *, after: int = 0,
               timeout: float = 120) -> str:
    def found():
        return next((m for _, _, m in events_of(stack, machine, after) if text in m), None)
    return eventually(found, timeout, f"no event {text!r}",
                      logs=lambda: "\n".join(m for _, _, m in events_of(stack, machine)),
                      every=0.3)
