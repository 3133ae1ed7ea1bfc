"""`manage.py bench_fanout`: simulated engines → fleet controller(s) → daphne → viewers.

Viewers watch pages of the fleet table: viewer i the page (i mod `--pages`) + 1, by default
spread over every page, so every host's row is watched (the controller's worst case). Measures,
for every seq that reaches a viewer of its page, the time from the snapshot leaving the load
generator to the first fleet row carrying that seq arriving at the viewer's websocket (an upper
bound on "leaving the consumer": it includes the viewer's own read); the CPU of every process
while the load runs; rows that went back in seq; and how many hosts' final states never reached
every viewer (must be 0). Seqs coalesced away inside one tick are not pushed by design and have
no latency.

The load runs in `--rounds` rounds on the same processes: each sends for `--duration` seconds,
pauses the simulated engines between two sends, waits SETTLE_SECONDS and counts, per round, the
viewer × host final states that did not arrive: shown older than the final seq (or never), and
shown newer (the benchmark's own accounting, which must also be 0). Viewers resync (get the
whole table again) when their consumer finds it missed a fragment; those are counted too.

The simulated engines run in child processes (`loadgen`), so they do not share a core's event
loop with the viewers. With `--controllers N` (scale-out: DATABASE_URL and REDIS_URL must be
set) N controllers share the hosts through their leases; `--kill` then kills one with SIGKILL a
third of the way into the load and measures how long until the survivors write every host again.
"""

import asyncio
import contextlib
import json
import math
import os
import shutil
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
from django.db.models import Count
from django.utils import timezone

from devtools.browser_probe import BrowserProbe
from devtools.loadgen import RemoteLoadGenerator, ViewerLog
from vastmgr.controller.management.commands.run_fleet import uses_leases, uses_shared_layer
from vastmgr.fleet.models import Machine, MachineLease, MachineStatus
from vastmgr.front.fleet_table import FleetTableForm

SETTLE_SECONDS = 5.0
# The viewers' first states and the controller's first whole pages go out before the load: the
# benchmark measures the steady state after them.
WARM_UP_SECONDS = 2.0
CONNECT_TIMEOUT = 60.0
# daphne starts beside a controller connecting to every engine: on a shared 2-core machine at
# load 15 that took more than a minute.
DAPHNE_START_TIMEOUT = 180.0
HOSTS_PER_LOADGEN = 250
LOADGEN_PREFIX = "loadgen-"  # the benchmark's hosts, removed at its end (or by the next run)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def children_cpu_seconds(procs) -> float:
    return sum(cpu_seconds(p.pid) for p in procs)


class Command(BaseCommand):
    help = "Fan-out benchmark: p50/p99 engine→browser latency, CPU per process, states lost."

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=100)
        parser.add_argument("--viewers", type=int, default=20)
        parser.add_argument("--rate", type=float, default=2.0, help="snapshots/s per host")
        parser.add_argument("--duration", type=float, default=20.0,
                            help="seconds of load per round")
        parser.add_argument("--pages", type=int, default=0,
                            help="pages of the fleet table the viewers watch (default: all)")
        parser.add_argument("--rounds", type=int, default=3,
                            help="rounds of load; final states are counted after each")
        parser.add_argument("--controllers", type=int, default=1,
                            help="fleet controllers sharing the hosts (more than one needs "
                                 "DATABASE_URL and REDIS_URL)")
        parser.add_argument("--lease", type=float, default=10.0,
                            help="host lease period of every controller, seconds")
        parser.add_argument("--kill", action="store_true",
                            help="SIGKILL one controller a third into the load; report takeover")
        parser.add_argument("--profile", metavar="PATH",
                            help="record the (first) controller with py-spy (--gil) during the load "
                                 "and write a speedscope profile to PATH")
        parser.add_argument("--browser", action="store_true",
                            help="also open the fleet page and a host page in headless "
                                 "Chromium (CHROMIUM_PATH) and measure them in the first round")
        parser.add_argument("--browser-trace", action="store_true",
                            help="with --browser, record a DevTools timeline of the first "
                                 "round and break each page's long tasks down by what they "
                                 "spent their time on")
        parser.add_argument("--loadgen-processes", type=int, default=0,
                            help=f"processes simulating the engines (default: one per "
                                 f"{HOSTS_PER_LOADGEN} hosts)")

    def handle(self, *args, hosts, viewers, rate, duration, rounds, controllers, lease, kill,
               loadgen_processes, profile, pages, browser, browser_trace, **options):
        if min(hosts, viewers, controllers, rounds) < 1 or rate <= 0 or duration <= 0 \
                or lease <= 0:
            raise CommandError("--hosts, --viewers, --rounds and --controllers must be >= 1; "
                               "--rate, --duration and --lease > 0")
        scale_out = uses_leases() and uses_shared_layer()
        if controllers > 1 and not scale_out:
            raise CommandError("--controllers above 1 needs the scale-out mode: set DATABASE_URL "
                               "(PostgreSQL) and REDIS_URL")
        if kill and controllers < 2:
            raise CommandError("--kill needs --controllers 2 or more (someone must take over)")
        processes = loadgen_processes or math.ceil(hosts / HOSTS_PER_LOADGEN)
        call_command("migrate", interactive=False, verbosity=0)  # a fresh data dir works too
        pages = pages or math.ceil(hosts / FleetTableForm.PER_PAGE)
        asyncio.run(self.bench(hosts, viewers, rate, duration, rounds, controllers, lease, kill,
                               min(processes, hosts), profile, pages, browser, browser_trace))

    async def bench(self, hosts, viewers, rate, duration, rounds, controllers, lease, kill,
                    processes, profile, pages, browser, browser_trace):
        loadgens = [RemoteLoadGenerator(len(range(i, hosts, processes)), rate)
                    for i in range(processes)]
        await asyncio.gather(*(lg.start() for lg in loadgens))
        ports = [port for lg in loadgens for port in lg.ports]
        machines = await asyncio.to_thread(self.register, ports)
        ids = [m.pk for m in machines]
        # machine id -> (its load generator, the host's index there), in the order of `ports`
        where = dict(zip(ids, [(lg, host) for lg in loadgens for host in range(lg.hosts)]))
        cookie = await asyncio.to_thread(self.session_cookie)
        port = free_port()
        python, manage = sys.executable, str(Path(__file__).resolve().parents[3] / "manage.py")
        daphne = await asyncio.to_thread(
            subprocess.Popen, [python, "-m", "daphne", "-p", str(port), "vastmgr.asgi:application"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fleet = [await asyncio.to_thread(
            subprocess.Popen, [python, manage, "run_fleet", "--dashboard-url",
                               f"http://127.0.0.1:{port}", "--lease", str(lease)],
            stdout=subprocess.DEVNULL) for _ in range(controllers)]

        def sent_at(machine_id, seq):
            if machine_id not in where:
                return None
            loadgen, host = where[machine_id]
            return loadgen.sent_at[host].get(seq)

        logs = [ViewerLog() for _ in range(viewers)]
        named = [("daphne", daphne)] + [(f"controller-{i + 1}", p) for i, p in enumerate(fleet)]
        takeover = None
        lost: list[dict] = []
        probes: list[BrowserProbe] = []
        browsed: list[dict] = []
        try:
            async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as stack:
                sockets = await self.connect_viewers(session, port, cookie, viewers, pages)
                readers = [asyncio.create_task(self.read(ws, log)) for ws, log in zip(sockets, logs)]
                await self.wait_connected(ids, controllers)
                if browser:
                    # A development dependency: imported only when asked for.
                    from playwright.async_api import async_playwright
                    playwright = await stack.enter_async_context(async_playwright())
                    chromium = await playwright.chromium.launch(
                        executable_path=os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
                    origin = f"http://127.0.0.1:{port}"
                    # One trace at a time in a browser: the fleet page's.
                    probes = [BrowserProbe("fleet", browser_trace), BrowserProbe("host")]
                    for probe, path in zip(probes, ["/", f"/machines/{ids[0]}/"]):
                        await probe.open(chromium, origin + path,
                                         {"name": "sessionid", "value": cookie, "url": origin})
                await asyncio.sleep(WARM_UP_SECONDS)
                def cpu_clocks() -> dict[str, float]:
                    clocks = {name: cpu_seconds(p.pid) for name, p in named if p.poll() is None}
                    clocks["loadgen"] = children_cpu_seconds(lg.proc for lg in loadgens)
                    clocks["viewers"] = time.process_time()
                    return clocks

                used: dict[str, float] = {}
                loaded = 0.0  # seconds under load: settling between rounds is not counted
                for round_number in range(rounds):
                    first = round_number == 0
                    start, round_start = cpu_clocks(), time.monotonic()
                    for lg in loadgens:
                        lg.go()
                    if first:
                        for probe in probes:
                            await probe.start()
                    if profile and first:
                        profiler = await asyncio.create_subprocess_exec(
                            shutil.which("py-spy", path=Path(sys.executable).parent) or "py-spy",
                            "record", "--nonblocking", "--gil", "--pid", str(fleet[0].pid), "--duration",
                            str(round(duration / 3 if kill else duration)), "--format",
                            "speedscope", "--output", profile, stdout=subprocess.DEVNULL)
                    if kill and first:
                        await asyncio.sleep(duration / 3)
                        # The victim's CPU over the time it ran: it cannot be read afterwards.
                        victim_cpu = ((cpu_seconds(fleet[0].pid) - start["controller-1"])
                                      / (time.monotonic() - round_start))
                        takeover = await self.kill_one(fleet, ids)
                        await asyncio.sleep(max(round_start + duration - time.monotonic(), 0.0))
                    else:
                        await asyncio.sleep(duration)
                    end = cpu_clocks()
                    if first:
                        browsed = [await probe.stop() for probe in probes]
                    loaded += time.monotonic() - round_start
                    for name, clock in end.items():
                        used[name] = used.get(name, 0.0) + clock - start[name]
                    await asyncio.gather(*(lg.pause() for lg in loadgens))
                    if profile and first:
                        await profiler.wait()
                    await asyncio.sleep(SETTLE_SECONDS)
                    final = {machine_id: lg.seq[host] for machine_id, (lg, host) in where.items()}
                    lost.append(self.count_lost(logs, final))
                    self.stdout.write(f"round {round_number + 1}: {lost[-1]}")
                cpu = {name: seconds / loaded for name, seconds in used.items()}
                if kill:
                    cpu["controller-1"] = victim_cpu
                load_average = os.getloadavg()
                for task in readers:
                    task.cancel()
                for ws in sockets:
                    await ws.close()
        finally:
            for proc in (*fleet, daphne):
                if proc.poll() is None:
                    proc.terminate()
            stopping = time.monotonic()
            for proc in (*fleet, daphne):
                try:
                    proc.wait(max(stopping + 60 - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    self.stderr.write(f"pid {proc.pid} did not stop within 60 s: killed")
                    proc.kill()
                    proc.wait()
            self.stdout.write(f"controllers and daphne stopped in {time.monotonic() - stopping:.1f} s")
            for lg in loadgens:
                lg.kill()
            await asyncio.to_thread(lambda: Machine.objects.filter(pk__in=ids).delete())
        latencies = sorted(x for log in logs for x in log.latencies(sent_at))
        sent = sum(lg.seq[host] for lg, host in where.values())
        engines = {"status_requests": sum(lg.status_requests for lg in loadgens),
                   "heartbeats_sent": sum(lg.heartbeats_sent for lg in loadgens)}
        self.report(hosts, viewers, rate, controllers, pages, logs, latencies, cpu, lost, sent,
                    takeover, load_average, browsed, engines)

    @staticmethod
    def count_lost(logs, final: dict[int, int]) -> dict:
        """Viewer × host final states (the hosts on the viewer's page) not shown after a round:
        older (or never shown), and newer than the final seq (a benchmark accounting error)."""
        older = sum(1 for log in logs for machine_id, seq in final.items()
                    if machine_id in log.page and log.shown.get(machine_id, -1) < seq)
        newer = sum(1 for log in logs for machine_id, seq in final.items()
                    if machine_id in log.page and log.shown.get(machine_id, -1) > seq)
        return {"final_states": sum(len(log.page & final.keys()) for log in logs),
                "lost": older, "newer_than_final": newer,
                "viewer_resyncs": sum(log.full_states for log in logs) - len(logs)}

    def register(self, ports):
        # A run killed before its clean-up left its hosts behind: watched, they would be a
        # thousand dead engines reconnecting beside this run's.
        left = Machine.objects.filter(name__startswith=LOADGEN_PREFIX, provider="local")
        if (count := left.count()):
            self.stderr.write(f"removing {count} hosts an interrupted run left behind")
            left.delete()
        stamp = time.time_ns()
        return [Machine.objects.create(name=f"{LOADGEN_PREFIX}{stamp}-{i}", provider="local",
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

    async def connect_viewers(self, session, port, cookie, viewers, pages):
        deadline = time.monotonic() + DAPHNE_START_TIMEOUT
        while True:
            try:
                return [await session.ws_connect(
                    f"ws://127.0.0.1:{port}/ws/fleet/?page={viewer % pages + 1}",
                    headers={"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={cookie}"})
                    for viewer in range(viewers)]
            except aiohttp.ClientError as exc:
                if time.monotonic() > deadline:
                    raise CommandError(f"daphne did not accept websockets within "
                                       f"{DAPHNE_START_TIMEOUT:g} s: {exc!r}") from None
                await asyncio.sleep(0.3)

    async def wait_connected(self, ids, controllers):
        """Until every host is connected, and (scale-out) leased, every controller holding its
        share: the load starts on a fleet in its steady state."""
        started = time.monotonic()
        settled_at = timezone.now()
        live = 0
        while time.monotonic() < started + CONNECT_TIMEOUT:
            if controllers > 1:
                shares = await asyncio.to_thread(lambda: sorted(
                    MachineLease.objects.filter(machine_id__in=ids, expires__gt=timezone.now())
                    .exclude(owner="").values("owner").annotate(n=Count("pk"))
                    .values_list("n", flat=True)))
                if len(shares) != controllers or sum(shares) != len(ids):
                    settled_at = timezone.now()
                    await asyncio.sleep(0.5)
                    continue
            live = await asyncio.to_thread(MachineStatus.objects.filter(
                machine_id__in=ids, connected=True, updated__gt=settled_at).count)
            if live == len(ids):
                self.stdout.write(f"all {len(ids)} hosts connected after "
                                  f"{time.monotonic() - started:.1f} s")
                return
            await asyncio.sleep(0.5)
        raise CommandError(f"the controllers did not connect to every simulated engine in "
                           f"{CONNECT_TIMEOUT:g} s ({live} of {len(ids)})")

    async def kill_one(self, fleet, ids) -> dict:
        """SIGKILL the first controller; wait until a survivor has written each of its hosts."""
        victim = fleet[0]
        owners = await asyncio.to_thread(lambda: dict(
            MachineLease.objects.filter(machine_id__in=ids).values_list("machine_id", "owner")))
        orphaned = [machine_id for machine_id, owner in owners.items()
                    if owner.endswith(f"-{victim.pid}")]
        killed_at = timezone.now()
        started = time.monotonic()
        victim.kill()
        victim.wait()
        while True:
            written = await asyncio.to_thread(lambda: MachineStatus.objects.filter(
                machine_id__in=orphaned, connected=True, updated__gt=killed_at).count())
            if written == len(orphaned):
                break
            if time.monotonic() - started > 10 * CONNECT_TIMEOUT:
                raise CommandError(f"only {written} of {len(orphaned)} hosts of the killed "
                                   f"controller were taken over")
            await asyncio.sleep(0.1)
        return {"hosts_of_killed_controller": len(orphaned),
                "seconds_until_all_written_again": round(time.monotonic() - started, 2)}

    async def read(self, ws, log):
        async for message in ws:
            log.record(message.data, time.time())

    def report(self, hosts, viewers, rate, controllers, pages, logs, latencies, cpu, lost, sent,
               takeover, load_average, browsed, engines):
        controller_cpu = sum(share for name, share in cpu.items() if name.startswith("controller"))
        # Which case a figure measured: the controller renders the rows its viewers watch, so
        # one page watched by all (50 machines) costs far less than every machine on a screen.
        watched = len(set().union(*(log.page for log in logs)))
        result = {
            "hosts": hosts, "viewers": viewers, "rate": rate, "controllers": controllers,
            "pages_watched": min(pages, viewers), "machines_watched": watched,
            "megabytes_per_viewer": round(sum(log.bytes for log in logs) / len(logs) / 1e6, 2),
            "snapshots_sent": sent, "row_deliveries_measured": len(latencies),
            "engines_whole_run": engines,
            "messages_received": sum(log.messages for log in logs),
            "megabytes_received": round(sum(log.bytes for log in logs) / 1e6, 1),
            "latency_ms": {
                "p50": round(statistics.median(latencies) * 1000),
                "p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000),
                "max": round(latencies[-1] * 1000),
            } if latencies else None,
            "cpu_share_of_one_core": {name: round(share, 3) for name, share in cpu.items()},
            "controller_cpu_ms_per_host_second": round(controller_cpu / hosts * 1000, 2),
            "rows_back_in_seq": sum(log.out_of_order for log in logs),
            "rounds": lost,
            "final_states_lost": sum(r["lost"] + r["newer_than_final"] for r in lost),
            "load_average_1_5_15": [round(x, 2) for x in load_average],
            "takeover": takeover,
            "browser": browsed,
        }
        self.stdout.write(json.dumps(result, indent=1))
        self.stdout.write(f"hosts={hosts} viewers={viewers} rate={rate}/s "
                          f"controllers={controllers}: {sent} snapshots sent, "
                          f"{len(latencies)} row deliveries measured")
        self.stdout.write(f"case: the viewers watch {result['pages_watched']} pages, "
                          f"{watched} distinct machines of {hosts}")
        self.stdout.write(f"the engines, whole run (warm-up and settling too): "
                          f"{engines['status_requests']} GET /status answered, "
                          f"{engines['heartbeats_sent']} heartbeats sent")
        self.stdout.write(f"viewers received {result['messages_received']} messages, "
                          f"{result['megabytes_received']} MB in all")
        if latencies:
            ms = result["latency_ms"]
            self.stdout.write(f"latency engine→browser: p50 {ms['p50']} ms, p99 {ms['p99']} ms, "
                              f"max {ms['max']} ms")
        for name, share in cpu.items():
            self.stdout.write(f"cpu {name}: {share * 100:.0f}% of one core")
        self.stdout.write(f"controller cpu per host: "
                          f"{result['controller_cpu_ms_per_host_second']} ms per second")
        self.stdout.write(f"rows that went back in seq: {result['rows_back_in_seq']}")
        for number, r in enumerate(lost, 1):
            self.stdout.write(f"round {number}: {r['lost']} of {r['final_states']} final states "
                              f"lost, {r['newer_than_final']} newer than final, "
                              f"{r['viewer_resyncs']} viewer resyncs so far")
        self.stdout.write(f"final states lost: {result['final_states_lost']}")
        self.stdout.write("load average (1, 5, 15 min): "
                          + ", ".join(f"{x:.2f}" for x in load_average))
        for page in browsed:
            self.stdout.write(f"chromium, {page['page']} page: main thread busy "
                              f"{page['main_thread_busy_percent']} %, {page['long_tasks']} long "
                              f"tasks (longest {page['longest_task_ms']} ms), "
                              f"{page['kilobytes_per_second']} kB/s received")
            self.stdout.write(f"  slowest of its {page['messages']} pushed messages to handle: "
                              + ", ".join(f"{m['ms']} ms ({m['rows']} rows"
                                          + (", whole page" if m["whole"] else "") + ")"
                                          for m in page["slowest_messages"]))
            for task in page.get("long_task_parts", []):
                self.stdout.write(f"  long task {task['ms']} ms: " + ", ".join(
                    f"{name} {ms} ms" for name, ms in task["parts_ms"].items()))
        if takeover:
            self.stdout.write(f"takeover: {takeover['hosts_of_killed_controller']} hosts of the "
                              f"killed controller written again after "
                              f"{takeover['seconds_until_all_written_again']} s")
