"""Dispatch on the served stack (`manage.py up`: daphne, controller, automation, a local engine),
driven over HTTP as an operator: a backlog submitted from the Run-test-proof form stays queued
in the dashboard beyond what the one engine can start soon; a second engine that becomes
running takes its share within a tick; a WinningPoSt submitted behind the backlog overtakes it.

The oracle, at each look: the proofs page against both engines' `GET /status` read just before
and just after it. A job the page shows queued (in the dashboard) is on no engine; a job it
shows on an engine is listed there; an engine never holds more normal jobs than its workers
plus the look-ahead."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

import pytest

from tests.conftest import REPO, eventually, free_port
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engines' cache
from tests.vastmgr.remote.served import Operator, served_stack
from vastmgr.proofs.placement import LOOK_AHEAD

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BACKLOG = 14
ROW = re.compile(r'<tr id="job-([0-9a-f-]{36})"[^>]*>(.*?)</tr>', re.DOTALL)
STATUS = re.compile(r'data-job-status="([a-z]+)"')
CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.DOTALL)
MACHINE = re.compile(r'<span class="truncate" title="([^"]+)">')
MACHINE_CELL = 6  # Job, Kind, Profile, Seed, Status, Progress, Machine
PLACES = re.compile(r'id="proof-places" data-queued="(\d+)" data-dispatched="(\d+)" '
                    r'data-running="(\d+)"')


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache):  # noqa: F811 - the fixture imported above
    yield from served_stack(tmp_path_factory.mktemp("served-dispatch"), param_cache, {})


def engine_status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as answer:
        return json.load(answer)


@dataclass(frozen=True)
class Shown:
    status: str  # the job's status as the page's data-job-status says
    machine: str | None


def proofs_page(operator: Operator) -> dict[str, Shown]:
    """Every job the proofs page lists (fewer than a page of them here), checked against the
    page's own count of unfinished jobs by place."""
    answer = operator.get("/proofs/")
    assert answer.status == 200, answer.body[:300]
    shown = {}
    for job, row in ROW.findall(answer.body):
        machine = MACHINE.search(CELL.findall(row)[MACHINE_CELL])
        shown[job] = Shown(STATUS.search(row).group(1), machine.group(1) if machine else None)
    places = dict(zip(("queued", "dispatched", "running"),
                      map(int, PLACES.search(answer.body).groups()), strict=True))
    # The counts are read just before the rows, and jobs only move forward meanwhile (queued,
    # dispatched, running, ended): the jobs up to each place then are those rows now, plus at
    # most the rows that have moved past it.
    order = ["queued", "dispatched", "running"]
    for i in range(len(order)):
        counted = sum(places[place] for place in order[:i + 1])
        rows = sum(1 for s in shown.values() if s.status in order[:i + 1])
        assert rows <= counted <= len(shown), (order[i], places, shown)
    return shown


def on_engine(status: dict, ids: set[str]) -> dict[str, str]:
    """Our jobs the engine lists as unfinished: request id → its status there."""
    return {p["request_id"]: p["status"] for p in status["pipelines"]
            if p.get("request_id") in ids and p["status"] in ("queued", "running")}


def look(operator: Operator, engines: dict[str, int], ids: set[str]) -> dict[str, Shown]:
    """One look at the proofs page, judged against the engines read around it."""
    before = {name: on_engine(engine_status(port), ids) for name, port in engines.items()}
    shown = {job: s for job, s in proofs_page(operator).items() if job in ids}
    after = {name: engine_status(port) for name, port in engines.items()}
    for job, s in shown.items():
        if s.status == "queued":
            holders = [name for name, held in before.items() if job in held]
            assert not holders, f"{job} shown queued in the dashboard while {holders} held it"
        elif s.status in ("dispatched", "running"):
            assert s.machine in engines, (job, s)
            listed = job in before[s.machine] or any(
                p.get("request_id") == job for p in after[s.machine]["pipelines"])
            assert listed, f"{job} shown on {s.machine}, which does not list it"
    for name, status in after.items():
        normal = [p for p in status["pipelines"] if p.get("request_id") in ids
                  and p["status"] in ("queued", "running") and p["priority"] == "normal"]
        room = len(status["gpu_workers"]) + LOOK_AHEAD
        assert len(normal) <= room, f"{name} holds {len(normal)} normal jobs, room {room}"
    return shown


def submit(operator: Operator, kind: str, count: int, seed: int) -> list[str]:
    before = set(proofs_page(operator))
    answer = operator.post("/proofs/new/", {"kind": kind, "profile": "tiny", "seed": seed,
                                            "count": count, "priority": "", "machine": ""})
    assert answer.status == 200, answer.body[:300]
    new = [job for job in proofs_page(operator) if job not in before]
    assert len(new) == count, new
    return new


def test_a_new_engine_takes_its_share_of_the_backlog_and_urgent_work_overtakes_it(
        stack, operator, param_cache, tmp_path):  # noqa: F811
    engines = {"local": stack.engine_port}
    backlog = submit(operator, "porep-c2", BACKLOG, seed=100)
    ids = set(backlog)
    # The one engine holds what it can start soon; the rest waits in the dashboard.
    shown = eventually(lambda: (s := look(operator, engines, ids)) and any(
        v.machine == "local" for v in s.values()) and s, 60, "nothing reached the engine")
    queued_here = [job for job, s in shown.items() if s.status == "queued"]
    assert len(queued_here) >= BACKLOG - 2 * (len(engine_status(stack.engine_port)
                                                  ["gpu_workers"]) + LOOK_AHEAD), shown

    # A second engine becomes running: it takes jobs within a tick of going live.
    port = free_port()
    config = tmp_path / "second.toml"
    config.write_text(f'[srs]\nparam_cache = "{param_cache}"\n'
                      f'[daemon]\nlisten = "127.0.0.1:{port}"\n')
    second = subprocess.Popen([sys.executable, "manage.py", "run_engine", "--name", "second",
                               "--config", str(config)], cwd=REPO, env=stack.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        def live_row():
            rows = stack.query("SELECT s.snapshot FROM fleet_machinestatus s JOIN fleet_machine m "
                               "ON m.id = s.machine_id WHERE m.name = 'second' AND s.connected")
            return rows and json.loads(rows[0][0] or "{}").get("accepting") is True
        eventually(live_row, 90, "the controller never saw the second engine live")
        seen_live = time.monotonic()
        engines["second"] = port
        eventually(lambda: on_engine(engine_status(port), ids), 5,
                   "the second engine took no job of the backlog")
        took = time.monotonic() - seen_live
        assert took < 3, f"the second engine's first job came {took:.1f} s after it was live"
        look(operator, engines, ids)

        # A WinningPoSt behind the backlog goes at once and is done before it.
        urgent = submit(operator, "winning-post", 1, seed=500)[0]
        ids.add(urgent)
        done = eventually(lambda: (s := look(operator, engines, ids))[urgent].status == "done"
                          and s, 60, "the WinningPoSt was not done")
        still_waiting = [job for job in backlog if done[job].status in ("queued", "dispatched")]
        assert still_waiting, "the backlog ended before the WinningPoSt: nothing was overtaken"

        # Everything ends, each job proved once, on one of the two engines.
        final = eventually(lambda: (s := look(operator, engines, ids)) and all(
            v.status in ("done", "failed", "cancelled") for v in s.values()) and s, 300,
            "the backlog did not finish")
        assert all(v.status == "done" for v in final.values()), final
        assert {final[job].machine for job in backlog} == {"local", "second"}
        completed = sum(engine_status(p)["counters"]["completed_by_kind"].get("porep-c2", 0)
                        for p in engines.values())
        assert completed == BACKLOG, "a job was proved twice"
    finally:
        second.terminate()
        second.wait(30)
