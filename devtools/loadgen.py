"""A load-generator status server for benchmarks: N simulated engines, one TCP port each,
serving GET /status and the status stream with a new snapshot `rate` times per second (and,
like the engine, a heartbeat with the seq on a stream quiet for the interval it asked).

It proves nothing; it only emits engine-shaped snapshots with increasing `seq`, and records
when each seq left, so a benchmark can measure how long it takes to reach a browser.

It must cost far less than the controller it loads: every port is a socket of one aiohttp
server, and one ticker task (not one sleeping task per host) sends each host's snapshots,
the fleet staggered over the period as real engines are. `python -m
devtools.loadgen` runs one in its own process (see `main`), so a benchmark can
spread the simulated fleet over processes.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import re
import signal
import socket
import sys
import time
from collections.abc import Callable

from aiohttp import web

from cuzk_engine.engine.snapshot import (
    BuffersSnapshot,
    CountersSnapshot,
    DeviceSnapshot,
    EngineSnapshot,
    MemorySnapshot,
    PartitionSnapshot,
    PipelineSnapshot,
    StreamHeartbeat,
    SynthesisSnapshot,
    WorkerSnapshot,
)

# The period is cut into this many slots; each slot's hosts send together.
SLOTS = 20
# The final report (every send time) is one line on stdout: megabytes for a long run.
REPORT_LIMIT = 1 << 28


def _snapshot(host: int, seq: int) -> dict:
    """A complete snapshot (built from the engine's own types, so it always reads back),
    changing with `seq`; its numbers need not add up."""
    busy = seq % 3
    done = seq % 10
    completed = seq // 20
    partitions = [PartitionSnapshot(index=i, state="done" if i < done else "gpu", synth_ms=10.0,
                                    gpu_ms=5.0, finalize_ms=1.0, synth_start_ms=0.0,
                                    gpu_start_ms=10.0, finalize_start_ms=15.0, worker_id=None)
                  for i in range(10)]
    return EngineSnapshot(
        seq=seq, version="loadgen", uptime_secs=seq, accepting=True,
        memory=MemorySnapshot(total_bytes=64 << 30, used_bytes=(seq % 64) << 30,
                              available_bytes=(64 - seq % 64) << 30),
        synthesis=SynthesisSnapshot(max_concurrent=4, active=busy),
        pipelines=[PipelineSnapshot(
            job_id=f"lg-{host}-{completed}", request_id=None, proof_kind="porep-c2",
            kind="porep-c2", profile="tiny", circuit_id="porep-c2.tiny", priority="normal",
            status="running", error=None, started_secs_ago=1.0, queued_ms=0.0, srs_load_ms=0.0,
            total_partitions=10, partitions_done=done, partitions=partitions)],
        gpu_workers=[WorkerSnapshot(worker_id=w, gpu_ordinal=0,
                                    state="proving" if w < busy else "idle", current_job=None,
                                    current_partition=None, busy_secs=None, busy_total_secs=0.0)
                     for w in range(2)],
        devices=[DeviceSnapshot(ordinal=0, name="loadgen", backend="none", description="",
                                workers=[0, 1])],
        allocations={"srs": [], "pce": []},
        counters=CountersSnapshot(
            total_completed=completed, total_failed=0, total_cancelled=0,
            completed_by_kind={"porep-c2": completed}, failed_by_kind={}, cancelled_by_kind={},
            queue_depth=busy, queue_depth_by_kind={"porep-c2": busy}),
        buffers=BuffersSnapshot(synth_in_flight=busy, pending_handles=0, provers_in_flight=0,
                                aux_in_flight=0),
    ).to_json()


class LoadGenerator:
    """`result`: a finished engine's proof record. With it the simulated engines also take
    proof submissions (counting each POST per request id, so a test can see that every job
    was submitted exactly once) and answer every job as finished with that record."""

    def __init__(self, hosts: int, rate: float, result: dict | None = None):
        self.hosts = hosts
        self.rate = rate
        self.result = result
        self.submissions: list[dict[str, int]] = [{} for _ in range(hosts)]
        self.seq = [0] * hosts
        self.sent_at: list[dict[int, float]] = [{} for _ in range(hosts)]
        self.ports: list[int] = []
        # What the controllers asked of the engines and got, over the whole run: GET /status
        # (polls, and checks of quiet streams) and heartbeats on quiet streams.
        self.status_requests = 0
        self.heartbeats_sent = 0
        self.running = True
        self.closing = False
        self._between_slots = asyncio.Event()
        self._by_port: dict[int, int] = {}
        self._streams: list[set[web.WebSocketResponse]] = [set() for _ in range(hosts)]
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task | None = None
        # Streams that asked for heartbeats: (host, interval, when the next is due), and the
        # due times in a heap (with stale entries, skipped when they come up).
        self._heartbeats: dict[web.WebSocketResponse, tuple[int, float, float]] = {}
        self._due: list[tuple[float, int, web.WebSocketResponse]] = []
        self._order = itertools.count()
        self._beat_soon = asyncio.Event()
        self._beater: asyncio.Task | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_get("/v1/status/stream", self._stream)
        if self.result is not None:
            app.router.add_post("/v1/proofs", self._submit)
            app.router.add_get("/v1/proofs/{job_id}", self._proof)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        for host in range(self.hosts):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            await web.SockSite(self._runner, sock).start()
            self.ports.append(port)
            self._by_port[port] = host
        self._ticker = asyncio.create_task(self._tick())
        self._beater = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        self.closing = True
        for task in (self._ticker, self._beater):
            if task is not None:
                task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def _host(self, request: web.Request) -> int:
        transport = request.transport
        assert transport is not None, "a request being handled has its connection"
        return self._by_port[transport.get_extra_info("sockname")[1]]

    async def _status(self, request: web.Request) -> web.Response:
        host = self._host(request)
        self.status_requests += 1
        return web.json_response(_snapshot(host, self.seq[host]))

    def streams(self, host: int) -> int:
        """Status streams open to this host now (one per controller watching it)."""
        return len(self._streams[host])

    async def _submit(self, request: web.Request) -> web.Response:
        host = self._host(request)
        request_id = (await request.json())["request_id"]
        self.submissions[host][request_id] = self.submissions[host].get(request_id, 0) + 1
        return web.json_response({"job_id": request_id, "request_id": request_id,
                                  "status": "queued"}, status=202)

    async def _proof(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        if job_id not in self.submissions[self._host(request)]:
            return web.json_response({"error": f"no job {job_id}"}, status=404)
        assert self.result is not None, "the proof routes are served only with a result"
        return web.json_response({**self.result, "job_id": job_id, "request_id": job_id})

    async def _stream(self, request: web.Request) -> web.WebSocketResponse | web.Response:
        host = self._host(request)
        heartbeat = None
        if "heartbeat" in request.query:  # as the engine does: a bad ask is refused, not guessed
            try:
                heartbeat = StreamHeartbeat.interval(request.query["heartbeat"])
            except ValueError as exc:
                return web.json_response({"error": str(exc)}, status=400)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps(_snapshot(host, self.seq[host])))
        self._streams[host].add(ws)
        if heartbeat is not None:
            self._heartbeats[ws] = (host, heartbeat, 0.0)
            self._sent(ws)
        try:
            async for _ in ws:  # engines ignore what clients send; this waits for the close
                pass
        finally:
            self._streams[host].discard(ws)
            self._heartbeats.pop(ws, None)
        return ws

    async def _send_to(self, ws: web.WebSocketResponse, text: str) -> None:
        await ws.send_str(text)
        self._sent(ws)

    def _sent(self, ws: web.WebSocketResponse) -> None:
        """A stream with heartbeats gets its next one due that long after its last message."""
        beating = self._heartbeats.get(ws)
        if beating is not None:
            host, heartbeat, _ = beating
            due = time.monotonic() + heartbeat
            self._heartbeats[ws] = (host, heartbeat, due)
            heapq.heappush(self._due, (due, next(self._order), ws))
            if self._due[0][0] == due:  # sooner than the heartbeat task sleeps for
                self._beat_soon.set()

    async def _beat(self) -> None:
        """Sends each stream's heartbeats, as the engine does: its seq, once the stream has sent
        nothing for the interval it asked. One task for all streams, sleeping until the first
        one due; heap entries of streams that sent since are skipped."""
        while not self.closing:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                due, _, ws = heapq.heappop(self._due)
                beating = self._heartbeats.get(ws)
                if beating is None or beating[2] != due:
                    continue  # closed, or sent something since this was due
                host = beating[0]
                try:
                    await self._send_to(ws, json.dumps(StreamHeartbeat(self.seq[host]).to_json()))
                    self.heartbeats_sent += 1
                except ConnectionResetError:
                    self._streams[host].discard(ws)
                    self._heartbeats.pop(ws, None)
            self._beat_soon.clear()
            wait = self._due[0][0] - time.monotonic() if self._due else None
            try:
                await asyncio.wait_for(self._beat_soon.wait(), wait)
            except TimeoutError:
                pass

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        slot_length = 1.0 / self.rate / SLOTS
        next_slot = loop.time()
        slot = 0
        while not self.closing:
            next_slot += slot_length
            await asyncio.sleep(max(next_slot - loop.time(), 0.0))
            if self.running:  # quiet (but connected) before and after the measured run
                for host in range(slot, self.hosts, SLOTS):
                    await self._send(host)
            else:
                self._between_slots.set()
            slot = (slot + 1) % SLOTS

    async def pause(self) -> None:
        """Stop sending, and return once no send is under way: a slot's hosts are sent in one
        loop with awaits inside, so a host sent after the caller read `seq` would count as a
        final state never delivered (the benchmark's one-in-three 500-host "loss" was this: a
        slot of 12 hosts sent after the report of final seqs was printed)."""
        self.running = False
        self._between_slots.clear()
        await self._between_slots.wait()

    async def _send(self, host: int) -> None:
        self.seq[host] += 1
        seq = self.seq[host]
        self.sent_at[host][seq] = time.time()
        text = json.dumps(_snapshot(host, seq))
        for ws in list(self._streams[host]):
            try:
                await self._send_to(ws, text)
            except ConnectionResetError:
                self._streams[host].discard(ws)
                self._heartbeats.pop(ws, None)


class RemoteLoadGenerator:
    """A LoadGenerator in a child process (`main`), driven through signals and its stdout:
    it prints its ports, sends on SIGUSR1, pauses on SIGUSR2 and then prints what it sent
    since the last report (seq per host, send times) and its request and heartbeat counts so
    far, and exits on SIGTERM."""

    def __init__(self, hosts: int, rate: float):
        self.hosts = hosts
        self.rate = rate
        self.proc: asyncio.subprocess.Process | None = None
        self.ports: list[int] = []
        self.seq: list[int] = [0] * hosts
        self.sent_at: list[dict[int, float]] = [{} for _ in range(hosts)]
        self.status_requests = 0
        self.heartbeats_sent = 0

    async def start(self, env: dict | None = None) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, "--hosts", str(self.hosts), "--rate", str(self.rate),
            stdout=asyncio.subprocess.PIPE, env=env, limit=REPORT_LIMIT)
        self.ports = json.loads(await self._read_line())

    def go(self) -> None:
        self._started().send_signal(signal.SIGUSR1)

    async def pause(self) -> None:
        """Stop sending; `seq` is then each host's final seq, `sent_at` every send so far."""
        self._started().send_signal(signal.SIGUSR2)
        report = json.loads(await self._read_line())
        self.seq = report["seq"]
        self.status_requests = report["status_requests"]
        self.heartbeats_sent = report["heartbeats_sent"]
        for host, sent in zip(self.sent_at, report["sent_at"]):
            host.update((int(seq), at) for seq, at in sent.items())

    async def close(self) -> None:
        self._started().send_signal(signal.SIGTERM)
        await self._started().wait()

    def _started(self) -> asyncio.subprocess.Process:
        assert self.proc is not None, "the load generator has not been started"
        return self.proc

    async def _read_line(self) -> bytes:
        stdout = self._started().stdout
        assert stdout is not None, "start() opens the child's stdout as a pipe"
        return await stdout.readline()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


async def _serve(hosts: int, rate: float) -> None:
    loadgen = LoadGenerator(hosts, rate)
    loadgen.running = False
    await loadgen.start()
    print(json.dumps(loadgen.ports), flush=True)
    finished = asyncio.Event()
    loop = asyncio.get_running_loop()
    reports: set[asyncio.Task] = set()

    async def report() -> None:
        await loadgen.pause()
        print(json.dumps({"seq": loadgen.seq, "sent_at": loadgen.sent_at,
                          "status_requests": loadgen.status_requests,
                          "heartbeats_sent": loadgen.heartbeats_sent}), flush=True)
        for sent in loadgen.sent_at:  # each report carries the sends since the last one
            sent.clear()

    def pause() -> None:
        task = loop.create_task(report())
        reports.add(task)
        task.add_done_callback(reports.discard)

    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(loadgen, "running", True))
    loop.add_signal_handler(signal.SIGUSR2, pause)
    loop.add_signal_handler(signal.SIGTERM, finished.set)
    await finished.wait()
    await loadgen.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.hosts, args.rate))


ROW = re.compile(r'id="host-(\d+)-row"[^>]*data-seq="(\d+)"')
ROW_ID = re.compile(r'id="host-(\d+)-row"')
FULL_STATE = 'id="fleet-rows"'


class ViewerLog:
    """What one fleet viewer saw: the seq each host's row last showed, rows that went back in
    seq (the page would show an older state), and when each seq first arrived (matched with the
    send times afterwards, so the load generator may live in another process)."""

    def __init__(self):
        self.shown: dict[int, int] = {}
        self.arrivals: list[tuple[int, int, float]] = []  # (machine id, seq, when)
        self.out_of_order = 0
        self.messages = 0
        self.bytes = 0
        self.full_states = 0  # whole fleet tables: the first one, and each resync after a miss
        self.page: set[int] = set()  # the machines whose rows its page shows (last full state)

    def record(self, html: str, now: float) -> None:
        self.messages += 1
        self.bytes += len(html)
        if FULL_STATE in html:
            self.full_states += 1
            self.page = {int(machine_id) for machine_id in ROW_ID.findall(html)}
        for machine_id, seq in ROW.findall(html):
            machine_id, seq = int(machine_id), int(seq)
            previous = self.shown.get(machine_id)
            self.shown[machine_id] = seq
            if previous is not None and seq < previous:
                self.out_of_order += 1
            elif previous is None or seq > previous:
                self.arrivals.append((machine_id, seq, now))

    def latencies(self, sent_at: Callable[[int, int], float | None]) -> list[float]:
        """Seconds from send to first arrival of every seq whose send time is known."""
        measured = []
        for machine_id, seq, when in self.arrivals:
            sent = sent_at(machine_id, seq)
            if sent is not None:
                measured.append(when - sent)
        return measured


if __name__ == "__main__":
    main()
