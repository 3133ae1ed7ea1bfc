"""The fault suite: `manage.py up` (own ports, own data dir, tiny proofs) with jobs in flight.

Each fault — kill -9 of every child, SIGTERM of the engine, Ctrl-C of `up` and a rerun, kill -9
of `up` and a rerun — must end with every job done and verified by the dashboard, no result lost
(a job proved twice shows up as "the engine no longer knows this job" where nothing was lost),
no process of the stack left behind, and the operator still logged in.

The tests share one stack and run in order; they synchronise on states (rows, pids, Events),
never on fixed sleeps.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, eventually, free_port
from tests.vastmgr import live_engine

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")]
param_cache = live_engine.param_cache

ADMIN, PASSWORD = "ops", "pw-for-fault-tests-1"
JOBS_PER_FAULT = 6
START_TIMEOUT = 120
PROOF_TIMEOUT = 150
GONE_TIMEOUT = 10  # kill -9 of `up`: every process of the stack must be gone this soon
CHILD_MARK = {"dashboard": "daphne", "controller": "run_fleet",
              "automation": "remote_automation", "engine": "cuzk_engine serve"}


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Stack:
    """One `manage.py up` with its own data dir and ports; every process it starts carries a
    marker in its environment, so what is left behind can be found however it was started."""

    def __init__(self, root: Path, cache: Path):
        self.root = root
        self.port, self.engine_port, self.callhome_port = free_port(), free_port(), free_port()
        self.marker = uuid.uuid4().hex
        self.data = root / "data"
        self.config = root / "engine.toml"
        self.config.write_text(f'[srs]\nparam_cache = "{cache}"\n'
                               f'[daemon]\nlisten = "127.0.0.1:{self.engine_port}"\n')
        self.env = {k: v for k, v in os.environ.items()
                    if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG"}}
        self.env.update(VASTMGR_DATA_DIR=str(self.data), PYTHONPATH=str(REPO),
                        DJANGO_SETTINGS_MODULE="vastmgr.settings", VASTMGR_ADMIN_USER=ADMIN,
                        VASTMGR_ADMIN_PASSWORD=PASSWORD, VASTMGR_FAULT_SUITE=self.marker,
                        VASTMGR_CALLHOME_PORT=str(self.callhome_port))
        self.up: subprocess.Popen | None = None
        self.runs = 0
        self.cookies = http.cookiejar.CookieJar()
        self.http = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))
        self.url = f"http://127.0.0.1:{self.port}"

    # ---- processes ------------------------------------------------------------------------

    def start(self) -> None:
        self.runs += 1
        log = open(self.root / f"up-{self.runs}.log", "w")  # noqa: SIM115 - lives with `up`
        self.up = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(self.port),
             "--engine-config", str(self.config)],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own group, like a terminal's foreground job
        eventually(lambda: self.up_exited() or self.live(), START_TIMEOUT,
                 "the stack did not come up")
        assert not self.up_exited(), self.log()

    def up_exited(self) -> str | None:
        return f"up exited with {self.up.returncode}" if self.up.poll() is not None else None

    def log(self) -> str:
        return (self.root / f"up-{self.runs}.log").read_text()[-4000:]

    def children(self) -> dict[str, int]:
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (state := proc_state(int(entry))) and \
                    state[1] == self.up.pid and state[0] != "Z":
                line = cmdline(int(entry))
                for name, mark in CHILD_MARK.items():
                    if mark in line:
                        found[name] = int(entry)
        return found

    def leftovers(self) -> list[str]:
        """Every live process carrying this stack's marker."""
        left = []
        needle = f"VASTMGR_FAULT_SUITE={self.marker}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    marked = needle in f.read().split(b"\0")
            except OSError:
                continue
            state = proc_state(int(entry))
            if marked and state and state[0] != "Z":
                left.append(f"{entry}: {cmdline(int(entry))[:100]}")
        return left

    def ctrl_c(self) -> float:
        """SIGINT to up's process group, as a terminal's Ctrl-C; returns the seconds it took."""
        started = time.monotonic()
        os.killpg(self.up.pid, signal.SIGINT)
        self.up.wait(120)
        return time.monotonic() - started

    # ---- the database (read only) ---------------------------------------------------------

    def query(self, sql: str, *args) -> list[tuple]:
        db = sqlite3.connect(f"file:{self.data / 'vastmgr.sqlite3'}?mode=ro", uri=True,
                             timeout=10)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def live(self) -> bool:
        """The dashboard answers and the controller sees the local engine live and accepting."""
        try:
            with urllib.request.urlopen(self.url + "/accounts/login/", timeout=2):
                pass
            rows = self.query("SELECT s.snapshot FROM fleet_machinestatus s JOIN fleet_machine m "
                              "ON m.id = s.machine_id WHERE m.name = 'local' AND s.connected")
        except (OSError, sqlite3.Error):
            return False
        return bool(rows) and json.loads(rows[0][0] or "{}").get("accepting") is True \
            and len(self.children()) == 4

    def jobs(self, ids: list[str]) -> dict[str, tuple[str, int | None]]:
        marks = ",".join("?" * len(ids))
        rows = self.query(f"SELECT id, status, verified FROM proofs_proofjob WHERE id IN ({marks})",
                          *[i.replace("-", "") for i in ids])
        return {str(uuid.UUID(row[0])): (row[1], row[2]) for row in rows}

    def events(self, contains: str) -> list[str]:
        return [r[0] for r in self.query("SELECT message FROM fleet_event WHERE message LIKE ?",
                                         f"%{contains}%")]

    # ---- the operator's browser -----------------------------------------------------------

    def csrf(self, path: str) -> str:
        with self.http.open(self.url + path, timeout=10) as r:
            page = r.read().decode()
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

    def post(self, path: str, fields: dict) -> str:
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": self.csrf(path), **fields})
        request = urllib.request.Request(self.url + path, data=body.encode(),
                                         headers={"Referer": self.url + path})
        with self.http.open(request, timeout=30) as r:
            return r.geturl()

    def login(self) -> None:
        landed = self.post("/accounts/login/", {"username": ADMIN, "password": PASSWORD})
        assert "/accounts/login/" not in landed

    def logged_in(self) -> bool:
        eventually(self.live, START_TIMEOUT, "the stack is not live")  # a restarted dashboard
        with self.http.open(self.url + "/", timeout=10) as r:
            return "/accounts/login/" not in r.geturl()

    def submit(self, seed: int, count: int = JOBS_PER_FAULT) -> list[str]:
        # The form fails jobs at once when no engine is live: wait for a restarted one.
        eventually(self.live, START_TIMEOUT, "the stack is not live")
        before = {r[0] for r in self.query("SELECT id FROM proofs_proofjob")}
        self.post("/proofs/new/", {"kind": "winning-post", "profile": "tiny", "seed": seed,
                                   "count": count, "priority": "", "machine": ""})
        new = [str(uuid.UUID(r[0])) for r in self.query("SELECT id FROM proofs_proofjob")
               if r[0] not in before]
        assert len(new) == count
        return new

    def wait_running(self, ids: list[str]) -> None:
        """Until an engine holds one of these jobs (dispatched to it or running there) while
        others wait: the fault hits work in flight. A tiny proof can go from dispatched to done
        between two of the controller's looks, so "running" alone may never be seen."""
        def running():
            states = self.jobs(ids)
            assert any(s in ("queued", "dispatched", "running") for s, _ in states.values()), \
                f"every job ended before the fault: {states}"
            return any(status in ("dispatched", "running") for status, _ in states.values())

        eventually(running, 60, f"no job started on the engine: {self.jobs(ids)}\n{self.log()}")

    def all_done(self, ids: list[str]) -> dict:
        def final():
            states = self.jobs(ids)
            if all(s in ("done", "failed", "cancelled") for s, _ in states.values()):
                return states
            return None

        states = eventually(final, PROOF_TIMEOUT, f"jobs still in flight: {self.jobs(ids)}")
        assert all(status == "done" and verified for status, verified in states.values()), \
            states
        return states

    def lost_results(self, ids: list[str]) -> list[str]:
        return [m for m in self.events("no longer knows this job") if any(i in m for i in ids)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache):
    stack = Stack(tmp_path_factory.mktemp("faults"), param_cache)
    stack.start()
    stack.login()
    yield stack
    if stack.up.poll() is None:
        stack.ctrl_c()
    left = stack.leftovers()
    for line in left:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert not left, f"left behind: {left}"


@pytest.mark.parametrize("child", ["controller", "dashboard", "automation", "engine"])
def test_kill_9_of_a_child_restarts_it_and_loses_no_job(stack, child):
    seed = 1000 * (list(CHILD_MARK).index(child) + 1)
    ids = stack.submit(seed)
    stack.wait_running(ids)
    before = stack.children()
    restarts = len(stack.events(f"{child} was killed by SIGKILL"))
    os.kill(before[child], signal.SIGKILL)
    eventually(lambda: len(stack.events(f"{child} was killed by SIGKILL")) > restarts, 10,
             "no Event for the restart")
    eventually(lambda: stack.children().get(child) not in (None, before[child]), 30,
             f"{child} was not restarted")
    others = {name: pid for name, pid in stack.children().items() if name != child}
    assert others == {name: pid for name, pid in before.items() if name != child}, \
        "another process was stopped for it"
    stack.all_done(ids)
    if child != "engine":
        # The engine kept every job: nothing re-queued, nothing proved twice.
        assert stack.lost_results(ids) == []
        assert not [m for m in stack.events("re-queued") if any(i in m for i in ids)]
    assert stack.logged_in()


def test_sigterm_of_the_engine_drains_and_loses_nothing(stack):
    ids = stack.submit(5000)
    stack.wait_running(ids)
    engine = stack.children()["engine"]
    os.kill(engine, signal.SIGTERM)
    eventually(lambda: stack.children().get("engine") not in (None, engine), 60,
             "the engine was not started again")
    stack.all_done(ids)
    assert stack.lost_results(ids) == [], "a result finished during the drain was lost"


def test_ctrl_c_of_up_stops_everything_and_a_rerun_finishes_the_jobs(stack):
    ids = stack.submit(6000)
    stack.wait_running(ids)
    stack.ctrl_c()
    assert stack.up.returncode == 0, stack.log()
    assert stack.leftovers() == []
    states = stack.jobs(ids)
    assert all(status in ("done", "queued") for status, _ in states.values()), \
        f"a job was left in flight or cancelled by the stop: {states}"
    stack.start()  # at once: the ports are free
    stack.all_done(ids)
    assert stack.lost_results(ids) == []
    assert stack.logged_in(), "the restart logged the operator out"


def test_kill_9_of_up_leaves_nothing_and_a_rerun_finishes_the_jobs(stack):
    ids = stack.submit(7000)
    stack.wait_running(ids)
    stack.up.kill()
    stack.up.wait(10)
    eventually(lambda: not stack.leftovers(), GONE_TIMEOUT,
             f"processes outlived up: {stack.leftovers()}")
    stack.start()
    stack.all_done(ids)
    assert stack.logged_in(), "the restart logged the operator out"
    assert stack.ctrl_c() <= 5 + 1, "an idle stack took more than 5 s to stop"
    assert stack.leftovers() == []
