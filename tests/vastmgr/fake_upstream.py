"""A fake of Curio's Rust `cuzk` daemon status server, replaying scripted snapshots.

Written from the upstream server's behaviour (cuzk-notes §4.1) and its `/status` schema (§4.2),
not from our engine or our client: one read of up to 4096 bytes, `GET /status` → 200
`application/json` with `Access-Control-Allow-Origin: *` and `Connection: close`, anything else
→ 404 text, no auth, no keep-alive (the socket is closed after every answer), no stream, no seq.
Stricter than the real one: the request line must be exactly `GET /status HTTP/1.x`.

`SCRIPT` is a sequence of snapshots an operator could really see, each known lie once, with a
truthful snapshot after it; `expect` names the lie codes (vastmgr.fleet.lie_detector) each step must
raise, and `advance` the seconds to let pass before it (history lies need time).
"""

from __future__ import annotations

import copy
import json
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Self

GIB = 1 << 30
U64_MAX = (1 << 64) - 1
JOB = "porep-1000-42-task7"  # Curio's PoRep ids: porep-<miner>-<sector>(-<task>)


def partitions(*states: str) -> list[dict]:
    """Partition dicts as upstream writes them: synth_ms/gpu_ms elapsed or null."""
    rows = []
    for index, state in enumerate(states):
        synth = None if state == "pending" else 41_000 + 100 * index
        gpu = 9_500 + 10 * index if state in ("gpu", "done") else None
        rows.append({"index": index, "state": state, "synth_ms": synth, "gpu_ms": gpu})
    return rows


def worker(worker_id: int, job: str | None = None, partition: int | None = None,
           busy: float | None = None, ordinal: int = 0) -> dict:
    return {"worker_id": worker_id, "gpu_ordinal": ordinal,
            "state": "proving" if job is not None else "idle",
            "current_job": job, "current_partition": partition, "busy_secs": busy}


def snapshot(uptime: float, *, pipelines=None, workers=None, srs=None, synth_active=None,
             buffers=None, counters=None, memory_used=48 * GIB, synth_max=16) -> dict:
    """A full upstream snapshot, fields in serialization order (§4.2)."""
    pipelines = pipelines if pipelines is not None else []
    states = [p["state"] for pipe in pipelines for p in pipe["partitions"]]
    in_flight = {"synth_in_flight": states.count("synthesizing"),
                 "provers_in_flight": states.count("gpu"),
                 "aux_in_flight": states.count("gpu"),
                 "shells_in_flight": states.count("gpu"),
                 "pending_handles": states.count("synth_done")}
    return {
        "uptime_secs": uptime,
        "memory": {"total_bytes": 250 * GIB, "used_bytes": memory_used,
                   "available_bytes": 250 * GIB - memory_used},
        "synthesis": {"max_concurrent": synth_max,
                      "active": states.count("synthesizing") if synth_active is None
                      else synth_active},
        "pipelines": pipelines,
        "gpu_workers": workers if workers is not None else [worker(0), worker(1)],
        "allocations": {
            "srs": srs if srs is not None else [
                {"circuit_id": "porep-32g", "bytes": 47 * GIB, "last_used_secs_ago": 0.0,
                 "evictable": False}],
            "pce": [{"circuit_id": "porep-32g", "bytes": 26 * GIB, "last_used_secs_ago": 812.5,
                     "evictable": True}],
        },
        "counters": counters or {"total_completed": 17, "total_failed": 0,
                                 "completed_by_kind": {"porep-c2": 15, "snap-update": 2},
                                 "failed_by_kind": {}, "queue_depth": 3},
        "buffers": {**in_flight, **(buffers or {})},
    }


def pipeline(job: str, states: list[str], started: float, kind: str = "porep-c2") -> dict:
    parts = partitions(*states)
    return {"job_id": job, "proof_kind": kind, "started_secs_ago": started,
            "total_partitions": len(parts),
            "partitions_done": sum(1 for p in parts if p["state"] == "done"),
            "partitions": parts}


PROVING = ["done", "done", "done", "gpu", "gpu", "synth_done", "synthesizing", "synthesizing",
           "pending", "pending"]


def healthy(uptime: float) -> dict:
    """A PoRep job in full flow and a snap job starting: every invariant holds."""
    return snapshot(uptime, pipelines=[
        pipeline("snap-1000-7", ["synthesizing"] + ["pending"] * 15, 2.5, "snap-update"),
        pipeline(JOB, PROVING, 95.0),
    ], workers=[worker(0, JOB, 3, 4.2), worker(1, JOB, 4, 1.1)])


@dataclass
class Step:
    name: str
    body: dict | str  # a snapshot, or raw text the daemon would send
    expect: set[str] = field(default_factory=set)
    advance: float = 0.0


def _finalizer_reset(uptime):
    body = healthy(uptime)
    body["gpu_workers"][1] = worker(1)  # W1 reset while partition 4 is still in its finalizer
    return body


def _failed_partition(uptime, started, active, failed=(2,)):
    states = ["failed" if i in failed else "done" for i in range(10)]
    return snapshot(uptime, pipelines=[pipeline(JOB, states, started)], synth_active=active)


def _all_done(uptime, started):
    return snapshot(uptime, pipelines=[pipeline(JOB, ["done"] * 10, started)])


def _aux(uptime, aux):
    body = healthy(uptime)
    body["buffers"]["aux_in_flight"] = aux
    return body


def _absent(uptime):
    """What an older or differently built daemon may send: sections missing or null."""
    return {"uptime_secs": uptime, "memory": None, "synthesis": {"active": None},
            "gpu_workers": [{"worker_id": 0, "state": "idle"}],
            "counters": {"total_completed": 5}, "buffers": {}}


SCRIPT: list[Step] = [
    Step("healthy", healthy(1000.0)),
    Step("worker reset before its finalizer", _finalizer_reset(1001.0), {"gpu-unheld"}),
    Step("healthy again", healthy(1002.0)),
    Step("monolithic PoSt invisible", snapshot(1003.0, buffers={"provers_in_flight": 1}),
         {"invisible-gpu-work"}),
    Step("idle", snapshot(1004.0)),
    # A GPU failure recorded as "done": the job never completes, so it never leaves.
    Step("gpu failure shown as done (first seen)", _all_done(1005.0, 300.0)),
    Step("gpu failure shown as done (2 min on)", _all_done(1125.0, 420.0),
         {"done-never-completed"}, advance=120.0),
    Step("idle after restart-free GC", snapshot(1126.0)),
    # A synthesis failure: the partition fails, synthesis.active is never decremented.
    Step("failed partition (first seen)", _failed_partition(1127.0, 60.0, 1),
         {"synthesis-active"}),
    Step("another synthesis fails (40 s on)", _failed_partition(1167.0, 100.0, 2, (2, 5)),
         {"synthesis-active-grows"}, advance=40.0),
    Step("failed partitions (20 min on)", _failed_partition(2367.0, 1300.0, 2, (2, 5)),
         {"failed-listed", "synthesis-active"}, advance=1200.0),
    Step("healthy after the failed job is gone", healthy(2368.0)),
    Step("synth_in_flight wrapped", snapshot(2369.0, buffers={"synth_in_flight": U64_MAX}),
         {"buffer-wrapped"}),
    Step("healthy 3", healthy(2370.0)),
    Step("aux_in_flight leaking (start)", _aux(2371.0, 40)),
    Step("aux_in_flight leaking (still growing)", _aux(2411.0, 57), {"buffer-grows"},
         advance=40.0),
    Step("aux_in_flight back down", healthy(2412.0)),
    Step("SRS list empty during a parameter load", snapshot(
        2413.0, pipelines=[pipeline(JOB, PROVING, 95.0)],
        workers=[worker(0, JOB, 3, 4.2), worker(1, JOB, 4, 1.1)], srs=[]), {"srs-empty"}),
    Step("healthy 4", healthy(2414.0)),
    # A retried task re-registered the same job id: two workers hold partition 3.
    Step("(job, partition) guard: reused job id", snapshot(
        2415.0, pipelines=[pipeline(JOB, PROVING, 2.0)],
        workers=[worker(0, JOB, 3, 40.2), worker(1, JOB, 3, 1.1)]),
        {"shared-partition", "gpu-unheld"}),
    Step("fields absent or null", _absent(2416.0)),
    Step("healthy 5", healthy(2417.0)),
    # The job failed in synthesis; W0 picked up its partition 3 anyway (marked busy before the
    # already-failed check) and skipped it: it shows "proving" until its next pickup.
    Step("skipped partition of a failed job", snapshot(
        2418.0, pipelines=[pipeline(JOB, ["failed", "done", "done", "synth_done"] + ["pending"] * 6,
                                    30.0)],
        workers=[worker(0, JOB, 3, 12.0), worker(1)]), {"worker-not-on-gpu"}),
    Step("healthy 6", healthy(2419.0)),
    # A 250 GiB budget over one SnapDeals partition: 27, though at most 18 synthesize at once.
    Step("max_concurrent ignores max_parallel_synthesis", snapshot(2420.0, synth_max=27),
         {"synthesis-max-uncapped"}),
    Step("healthy at the end", healthy(2421.0)),
]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        fake: FakeUpstream = self.server.fake  # type: ignore[attr-defined]
        data = self.request.recv(4096)  # one read, as upstream does
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        if line in ("GET /status HTTP/1.1", "GET /status HTTP/1.0"):
            body = fake.body()
            status, ctype = "200 OK", "application/json"
            payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            with fake.lock:
                fake.served += 1
        else:
            status, ctype, payload = "404 Not Found", "text/plain", b"Not Found"
        with fake.lock:
            fake.requests.append(line)
        head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\nAccess-Control-Allow-Origin: *\r\n"
                "Connection: close\r\n\r\n")
        self.request.sendall(head.encode() + payload)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeUpstream:
    """`with FakeUpstream(SCRIPT) as fake:` serves `fake.url`; `fake.go(i)` picks the step."""

    def __init__(self, script: list[Step] | None = None):
        self.script = script or SCRIPT
        self.step = 0
        self.served = 0
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.fake = self
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def body(self) -> dict | str:
        with self.lock:
            return copy.deepcopy(self.script[self.step].body)

    def go(self, step: int) -> Step:
        with self.lock:
            self.step = step
        return self.script[step]

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
