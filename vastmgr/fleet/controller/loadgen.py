"""A load-generator status server for benchmarks: N simulated engines, one TCP port each,
serving GET /status and the status stream with a new snapshot `rate` times per second.

It proves nothing; it only emits engine-shaped snapshots with increasing `seq`, and records
when each seq left, so a benchmark can measure how long it takes to reach a browser.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable

from aiohttp import web


def _snapshot(host: int, seq: int) -> dict:
    busy = seq % 3
    return {
        "seq": seq, "version": "loadgen", "uptime_secs": seq, "accepting": True,
        "memory": {"total_bytes": 64 << 30, "used_bytes": (seq % 64) << 30,
                   "available_bytes": (64 - seq % 64) << 30},
        "synthesis": {"max_concurrent": 4, "active": busy},
        "pipelines": [{"job_id": f"lg-{host}-{seq // 20}", "request_id": None,
                       "proof_kind": "porep-c2", "kind": "porep-c2", "profile": "tiny",
                       "priority": "normal", "status": "running", "error": None,
                       "total_partitions": 10, "partitions_done": seq % 10,
                       "partitions": [{"index": i, "state": "done" if i < seq % 10 else "gpu",
                                       "synth_ms": 10.0, "gpu_ms": 5.0, "finalize_ms": 1.0}
                                      for i in range(10)]}],
        "gpu_workers": [{"worker_id": w, "gpu_ordinal": 0,
                         "state": "proving" if w < busy else "idle", "current_job": None,
                         "current_partition": None, "busy_secs": None, "busy_total_secs": 0.0}
                        for w in range(2)],
        "devices": [{"ordinal": 0, "name": "loadgen", "backend": "none", "workers": [0, 1]}],
        "allocations": {"srs": [], "pce": []},
        "counters": {"total_completed": seq // 20, "total_failed": 0, "queue_depth": busy},
        "buffers": {"synth_in_flight": busy, "pending_handles": 0},
    }


class LoadGenerator:
    def __init__(self, hosts: int, rate: float):
        self.hosts = hosts
        self.rate = rate
        self.seq = [0] * hosts
        self.sent_at: list[dict[int, float]] = [{} for _ in range(hosts)]
        self.ports: list[int] = []
        self.running = True
        self.closing = False
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        for host in range(self.hosts):
            app = web.Application()
            app.router.add_get("/status", self._status(host))
            app.router.add_get("/v1/status/stream", self._stream(host))
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.ports.append(runner.addresses[0][1])
            self._runners.append(runner)

    async def stop(self) -> None:
        self.closing = True
        for runner in self._runners:
            await runner.cleanup()

    def _status(self, host: int):
        async def handler(request):
            return web.json_response(_snapshot(host, self.seq[host]))
        return handler

    def _stream(self, host: int):
        async def handler(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            period = 1.0 / self.rate
            # Stagger hosts so the fleet's snapshots spread over the period, as real ones do.
            await asyncio.sleep(period * host / self.hosts)
            await ws.send_str(json.dumps(_snapshot(host, self.seq[host])))
            while not ws.closed and not self.closing:
                await asyncio.sleep(period)
                if self.running:  # quiet (but connected) before and after the measured run
                    self.seq[host] += 1
                    self.sent_at[host][self.seq[host]] = time.time()
                    try:
                        await ws.send_str(json.dumps(_snapshot(host, self.seq[host])))
                    except ConnectionResetError:
                        break
            return ws
        return handler


ROW = re.compile(r'id="host-(\d+)-row"[^>]*data-seq="(\d+)"')


class ViewerLog:
    """What one fleet viewer saw: the seq each host's row last showed, rows that went back in
    seq (the page would show an older state), and the latency of each seq's first arrival."""

    def __init__(self, sent_at: Callable[[int, int], float | None]):
        self.sent_at = sent_at  # (machine id, seq) -> when the load generator sent it
        self.shown: dict[int, int] = {}
        self.latencies: list[float] = []
        self.out_of_order = 0
        self.messages = 0
        self.bytes = 0

    def record(self, html: str, now: float) -> None:
        self.messages += 1
        self.bytes += len(html)
        for machine_id, seq in ROW.findall(html):
            machine_id, seq = int(machine_id), int(seq)
            previous = self.shown.get(machine_id)
            self.shown[machine_id] = seq
            if previous is not None and seq < previous:
                self.out_of_order += 1
            elif previous is None or seq > previous:
                sent = self.sent_at(machine_id, seq)
                if sent is not None:
                    self.latencies.append(now - sent)
