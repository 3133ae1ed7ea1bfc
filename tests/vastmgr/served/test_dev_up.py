"""`./dev up` starts, serves the login page, and stops cleanly on Ctrl-C."""

import http.cookiejar
import io
import json
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.conftest import eventually, free_port, wait_for_http
from vastmgr.ops.management.commands.up import ensure_admin

STARTUP_TIMEOUT = 120


def test_dev_up_serves_login_and_stops_on_ctrl_c(repo, clean_env):
    port = free_port()
    env = {**clean_env, "VASTMGR_ADMIN_USER": "ops", "VASTMGR_ADMIN_PASSWORD": "pw-for-tests-1"}
    proc = subprocess.Popen([str(repo / "dev"), "up", "--port", str(port)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def exited() -> str | None:
        return f"./dev up exited with {proc.returncode}" if proc.poll() is not None else None

    try:
        assert wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", STARTUP_TIMEOUT,
                             exited) == 200
        # The call-home listener is up on vast-manager's instance port, secret required.
        assert eventually(lambda: http_status("http://127.0.0.1:1235/status"),
                          STARTUP_TIMEOUT, "the call-home listener did not answer") == 401
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "admin account 'ops' created from the environment" in output
    assert "stopped" in output
    assert "instances call home on http://127.0.0.1:1235/" in output
    assert "did not stop" not in output, output
    assert_nothing_serves(port)


def test_dev_up_vast_fake_is_a_trial_with_a_market_to_search(repo, clean_env):
    """The evaluators' one command: the stack and the strict fake Vast beside it, the key to
    paste printed; with it pasted, the Offers search answers the fake's market (the oracle:
    the fake's own line says how many offers it lists)."""
    port, callhome = free_port(), free_port()
    env = {**clean_env, "VASTMGR_ADMIN_USER": "ops", "VASTMGR_ADMIN_PASSWORD": "pw-for-tests-1",
           "VASTMGR_CALLHOME_PORT": str(callhome)}
    proc = subprocess.Popen(
        [str(repo / "dev"), "up", "--vast-fake", "--port", str(port), "--engine-listen",
         f"127.0.0.1:{free_port()}"], cwd=repo, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()

    def exited() -> str | None:
        return f"./dev up exited with {proc.returncode}" if proc.poll() is not None else None

    try:
        assert wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", STARTUP_TIMEOUT,
                             exited) == 200
        said = eventually(lambda: next((m for line in list(lines) if (
            m := re.search(r"fake Vast on (http://127\.0\.0\.1:\d+) with (\d+) offers; "
                           r"its API key: (\S+)", line))), None), 30, "the fake's line")
        offers, key = int(said.group(2)), said.group(3)
        assert any(f"paste its API key on the Offers page: {key}" in line for line in lines)
        browser = Session(f"http://127.0.0.1:{port}")
        browser.log_in("ops", "pw-for-tests-1")
        browser.post("/remote/offers/api-key/", {"api_key": key})
        found = json.loads(browser.get("/api/v1/offers"))
        assert len(found) == offers > 0, found
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(10)
    assert proc.returncode == 0, "".join(lines)
    assert_nothing_serves(port)


class Session:
    """A person's browser session over plain HTTP: cookies and the CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as answer:
            return answer.read().decode()

    def post(self, path: str, form: dict[str, str]) -> str:
        csrf = next(c.value for c in self.jar if c.name == "csrftoken")
        data = urllib.parse.urlencode({**form, "csrfmiddlewaretoken": csrf}).encode()
        request = urllib.request.Request(self.base + path, data=data,
                                         headers={"Referer": self.base + path})
        with self.opener.open(request, timeout=30) as answer:
            return answer.read().decode()

    def log_in(self, user: str, password: str) -> None:
        self.get("/accounts/login/")
        page = self.post("/accounts/login/", {"username": user, "password": password})
        assert "Log out" in page, "not logged in"


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def assert_nothing_serves(port: int) -> None:
    """Every child really stopped: the dashboard port no longer answers."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
    except urllib.error.URLError:
        return
    raise AssertionError(f"something still serves port {port} after Ctrl-C")


@pytest.mark.django_db
def test_ensure_admin_keeps_the_password_hash_so_sessions_survive_a_restart(monkeypatch):
    monkeypatch.setenv("VASTMGR_ADMIN_USER", "ops")
    monkeypatch.setenv("VASTMGR_ADMIN_PASSWORD", "pw-for-tests-1")
    out = io.StringIO()
    ensure_admin(out)
    user = get_user_model().objects.get(username="ops")
    client = Client()
    client.force_login(user)
    first_hash = user.password
    ensure_admin(out)  # the next start with the same environment
    assert get_user_model().objects.get(username="ops").password == first_hash
    assert client.get("/").status_code == 200, "a restart logged the admin out"
    assert "created" in out.getvalue() and "unchanged" in out.getvalue()
    monkeypatch.setenv("VASTMGR_ADMIN_PASSWORD", "a-new-password-2")
    ensure_admin(out)
    user = get_user_model().objects.get(username="ops")
    assert user.check_password("a-new-password-2") and user.is_superuser


class ExitedProcess:
    returncode = -signal.SIGKILL

    def poll(self):
        return self.returncode


@pytest.mark.django_db
def test_a_crashing_child_is_restarted_with_backoff_then_left_down_after_the_cap():
    from vastmgr.fleet.models import Event
    from vastmgr.ops.management.commands import up

    command = up.Command(stdout=io.StringIO(), stderr=io.StringIO())
    child = up.Child("engine", ["true"], proc=ExitedProcess())
    now, delays = 1000.0, []
    for _ in range(up.RESTART_CAP):
        child.started = now
        command.schedule_restart(child, now)
        delays.append(child.restart_at - now)
        now = child.restart_at + 0.5  # it starts and crashes half a second later
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert not child.given_up
    command.schedule_restart(child, now)
    assert child.given_up, "a sixth crash within the window must leave the child down"
    events = list(Event.objects.filter(kind="supervisor").values_list("level", "message"))
    assert len(events) == up.RESTART_CAP + 1
    assert all("engine was killed by SIGKILL" in message for _, message in events)
    assert events[0][0] == Event.Level.ERROR and "stays down" in events[0][1]
