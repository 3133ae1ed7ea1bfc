"""`manage.py bench_fanout`: simulated engines → fleet controller → daphne → viewers.

Measures, for every seq that reaches a viewer, the time from the snapshot leaving the load
generator to the first fleet row carrying that seq arriving at the viewer's websocket (an upper
bound on "leaving the consumer": it includes the viewer's own read); the CPU of every process
while the load runs; rows that went back in seq; and how many hosts' final states never reached
every viewer (must be 0). Seqs coalesced away inside one tick are not pushed by design and have
no latency.
"""

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from vastmgr.fleet.controller.loadgen import LoadGenerator, ViewerLog
from vastmgr.fleet.controller.watching import BLIND_SLACK, RENEW_EVERY
from vastmgr.fleet.models import Machine

SETTLE_SECONDS = 5.0
# A controller that just started renders every page until the viewers have re-announced what
# they watch; the benchmark measures the steady state after that.
WARM_UP_SECONDS = RENEW_EVERY + BLIND_SLACK
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


class Command(BaseCommand):
    help = "Fan-out benchmark: p50/p99 engine→browser latency, CPU per process, states lost."

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=100)
        parser.add_argument("--viewers", type=int, default=20)
        parser.add_argument("--rate", type=float, default=2.0, help="snapshots/s per host")
        parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")

    def handle(self, *args, hosts, viewers, rate, duration, **options):
        if min(hosts, viewers) < 1 or rate <= 0 or duration <= 0:
            raise CommandError("--hosts and --viewers must be >= 1; --rate and --duration > 0")
        call_command("migrate", interactive=False, verbosity=0)  # a fresh data dir works too
        asyncio.run(self.bench(hosts, viewers, rate, duration))

    async def bench(self, hosts, viewers, rate, duration):
        loadgen = LoadGenerator(hosts, rate)
        loadgen.running = False  # quiet until everyone is connected
        await loadgen.start()
        machines = await asyncio.to_thread(self.register, loadgen.ports)
        ids = [m.pk for m in machines]
        cookie = await asyncio.to_thread(self.session_cookie)
        port = free_port()
        python, manage = sys.executable, str(Path(__file__).resolve().parents[4] / "manage.py")
        daphne = await asyncio.to_thread(
            subprocess.Popen, [python, "-m", "daphne", "-p", str(port), "vastmgr.asgi:application"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        controller = await asyncio.to_thread(
            subprocess.Popen, [python, manage, "run_fleet", "--dashboard-url",
                               f"http://127.0.0.1:{port}"], stdout=subprocess.DEVNULL)
        index = {machine_id: i for i, machine_id in enumerate(ids)}

        def sent_at(machine_id, seq):
            return loadgen.sent_at[index[machine_id]].get(seq) if machine_id in index else None

        logs = [ViewerLog(sent_at) for _ in range(viewers)]
        processes = (("daphne", daphne), ("controller", controller))
        try:
            async with aiohttp.ClientSession() as session:
                sockets = await self.connect_viewers(session, port, cookie, viewers)
                readers = [asyncio.create_task(self.read(ws, log)) for ws, log in zip(sockets, logs)]
                await self.wait_connected(loadgen, ids)
                await asyncio.sleep(WARM_UP_SECONDS)
                cpu_start = {name: cpu_seconds(p.pid) for name, p in processes}
                own_start, wall_start = time.process_time(), time.monotonic()
                loadgen.running = True
                await asyncio.sleep(duration)
                loadgen.running = False
                wall = time.monotonic() - wall_start
                cpu = {name: (cpu_seconds(p.pid) - cpu_start[name]) / wall for name, p in processes}
                cpu["loadgen+viewers"] = (time.process_time() - own_start) / wall
                await asyncio.sleep(SETTLE_SECONDS)
                for task in readers:
                    task.cancel()
                for ws in sockets:
                    await ws.close()
        finally:
            for proc in (controller, daphne):
                proc.terminate()
                proc.wait(15)
            await loadgen.stop()
            await asyncio.to_thread(lambda: Machine.objects.filter(pk__in=ids).delete())
        lost = sum(1 for log in logs for machine_id, i in index.items()
                   if log.shown.get(machine_id) != loadgen.seq[i])
        self.report(hosts, viewers, rate, logs, cpu, lost, loadgen)

    def register(self, ports):
        return [Machine.objects.create(name=f"loadgen-{i}-{port}", provider="local",
                                       host="127.0.0.1", engine_port=port)
                for i, port in enumerate(ports)]

    def session_cookie(self):
        user, _ = get_user_model().objects.get_or_create(username="bench-fanout")
        session = SessionStore()
        session["_auth_user_id"] = str(user.pk)
        session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        session["_auth_user_hash"] = user.get_session_auth_hash()
        session.create()
        return session.session_key

    async def connect_viewers(self, session, port, cookie, viewers):
        deadline = time.monotonic() + 60
        while True:
            try:
                return [await session.ws_connect(
                    f"ws://127.0.0.1:{port}/ws/fleet/",
                    headers={"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={cookie}"})
                    for _ in range(viewers)]
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise CommandError("daphne did not accept websockets within 60 s") from None
                await asyncio.sleep(0.3)

    async def wait_connected(self, loadgen, ids):
        from vastmgr.fleet.models import HostStatus

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = await asyncio.to_thread(
                lambda: HostStatus.objects.filter(machine_id__in=ids, connected=True).count())
            if live == len(ids):
                return
            await asyncio.sleep(0.5)
        raise CommandError("the controller did not connect to every simulated engine in 60 s")

    async def read(self, ws, log):
        async for message in ws:
            log.record(message.data, time.time())

    def report(self, hosts, viewers, rate, logs, cpu, lost, loadgen):
        latencies = sorted(x for log in logs for x in log.latencies)
        result = {
            "hosts": hosts, "viewers": viewers, "rate": rate,
            "snapshots_sent": sum(loadgen.seq), "row_deliveries_measured": len(latencies),
            "messages_received": sum(log.messages for log in logs),
            "megabytes_received": round(sum(log.bytes for log in logs) / 1e6, 1),
            "latency_ms": {
                "p50": round(statistics.median(latencies) * 1000),
                "p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000),
                "max": round(latencies[-1] * 1000),
            } if latencies else None,
            "cpu_share_of_one_core": {name: round(share, 3) for name, share in cpu.items()},
            "rows_back_in_seq": sum(log.out_of_order for log in logs),
            "final_states_lost": lost,
        }
        self.stdout.write(json.dumps(result, indent=1))
        self.stdout.write(f"hosts={hosts} viewers={viewers} rate={rate}/s: "
                          f"{result['snapshots_sent']} snapshots sent, "
                          f"{len(latencies)} row deliveries measured")
        self.stdout.write(f"viewers received {result['messages_received']} messages, "
                          f"{result['megabytes_received']} MB in all")
        if latencies:
            ms = result["latency_ms"]
            self.stdout.write(f"latency engine→browser: p50 {ms['p50']} ms, p99 {ms['p99']} ms, "
                              f"max {ms['max']} ms")
        for name, share in cpu.items():
            self.stdout.write(f"cpu {name}: {share * 100:.0f}% of one core")
        self.stdout.write(f"rows that went back in seq: {result['rows_back_in_seq']}")
        self.stdout.write(f"final states lost: {lost}")
