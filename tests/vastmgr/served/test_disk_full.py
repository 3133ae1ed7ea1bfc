"""The data directory's disk full under the served stack (`manage.py up`, whose SQLite database
lives there): the data directory is a small tmpfs of the test's own, filled while a proof is in
flight. What a person sees: a form that cannot be saved answers with a page that says so (never
a 500), reading pages still works, and an Event tells of it; the proof finished meanwhile and
those done before are all kept; once space returns, everything carries on by itself."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.vastmgr import live_engine
from tests.vastmgr.remote.served import Operator, served_stack
from tests.vastmgr.served.test_faults import CHILD_MARK, Stack

param_cache = live_engine.param_cache

DATA_DISK = "32m"
PROOF_TIMEOUT = 150

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux")
                       or shutil.which("mount") is None,
                       reason="needs root and mount(8) for a tmpfs of the test's own"),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache):
    root = tmp_path_factory.mktemp("disk-full")
    data = root / "data"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DATA_DISK},mode=0755", "tmpfs",
                    str(data)], check=True)
    try:
        yield from served_stack(root, param_cache, {})
    finally:
        subprocess.run(["umount", "--lazy", str(data)], check=False)


def fill(directory: Path) -> Path:
    """A file that takes every free byte of `directory`'s file system."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            with contextlib.suppress(OSError):
                while True:
                    out.write(block)
    assert shutil.disk_usage(directory).free == 0
    return filler


def engine_status(stack: Stack, job: str) -> str | None:
    """What the engine says of a job (submitted under the job's id), None before it has it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.engine_port}/v1/proofs/{job}",
                                    timeout=10) as response:
            return json.load(response)["status"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def final(stack: Stack, jobs: list[str]) -> dict[str, tuple]:
    """The jobs' (status, verified) once every one has ended, else nothing."""
    rows = stack.jobs(jobs)
    return rows if all(s[0] in ("done", "failed", "cancelled") for s in rows.values()) else {}


def test_a_full_data_disk_says_so_loses_nothing_and_recovers(stack: Stack):
    operator = Operator(stack)
    operator.login()
    done_before = stack.submit(seed=1, count=2)
    eventually(lambda: final(stack, done_before), PROOF_TIMEOUT, "the first proofs done",
               stack.log)
    # A proof of ten partitions: on the engine, not yet done, when the disk fills.
    known = {row[0] for row in stack.query("SELECT id FROM proofs_proofjob")}
    operator.post("/proofs/new/", {"kind": "porep-c2", "profile": "tiny", "seed": 3,
                                   "count": 1, "priority": "", "machine": ""})
    [in_flight] = [str(uuid.UUID(row[0])) for row in stack.query(
        "SELECT id FROM proofs_proofjob") if row[0] not in known]
    eventually(lambda: engine_status(stack, in_flight), PROOF_TIMEOUT,
               "the engine received the proof", stack.log, every=0.05)
    filler = fill(stack.data)

    # The engine finishes the proof; the controller cannot write its result.
    eventually(lambda: engine_status(stack, in_flight) == "done", PROOF_TIMEOUT,
               "the engine finished the proof in flight", stack.log)
    eventually(lambda: "disk is full" in stack.log(), 30,
               "the controller tried to write the result", stack.log)

    # A form cannot be saved: the page says why, with the place to free.
    answer = operator.post("/proofs/new/", {"kind": "winning-post", "profile": "tiny",
                                            "seed": 9, "count": 1, "priority": "",
                                            "machine": ""})
    assert answer.status == 507, (answer.status, answer.body[:2000])
    assert "disk is full" in answer.body and str(stack.data) in answer.body, answer.body[:2000]
    # Reading still works.
    assert operator.get("/").status == 200
    assert operator.get("/proofs/").status == 200

    filler.unlink()
    freed = time.monotonic()
    eventually(lambda: final(stack, [in_flight]), PROOF_TIMEOUT,
               "the proof finished during the fault recorded once space is back", stack.log)
    # The figure for docs/reliability.md (shown with -s).
    print(f"disk full: the proof finished meanwhile recorded {time.monotonic() - freed:.1f} s "
          "after space returned")
    jobs = stack.jobs([*done_before, in_flight])
    assert all(state == ("done", 1) for state in jobs.values()), jobs
    # Nothing proved twice: no job went back to the queue.
    assert stack.events("no longer knows") == []
    # An Event tells of the full disk, with the place.
    [told] = eventually(lambda: [m for m in stack.events("disk was full")
                                 if str(stack.data) in m], 30, "an Event about the full disk",
                        stack.log)
    assert "nothing could be saved meanwhile; space is back" in told, told
    # Every process of the stack still runs (none was left down for failing meanwhile), and a
    # new proof is saved and done.
    assert set(stack.children()) == set(CHILD_MARK), stack.log()
    [after] = stack.submit(seed=10, count=1)
    eventually(lambda: final(stack, [after]), PROOF_TIMEOUT, "a proof after the fault",
               stack.log)
    assert stack.jobs([after])[after] == ("done", 1)
    # The one answer past 499 is the refused form's 507, which names its cause.
    assert operator.server_errors() == [f"{stack.url}/proofs/new/: 507"]
