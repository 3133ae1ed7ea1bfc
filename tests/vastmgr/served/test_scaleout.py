"""Scale-out mode against real servers: PostgreSQL as the database and Redis as the channel
layer, every part a separate process that reads DATABASE_URL and REDIS_URL at start-up, like a
deployment: two daphne processes, the fleet controller, and a tiny-profile engine registered by
`manage.py run_engine`. `.ci/run` starts both servers and exports TEST_DATABASE_URL and
TEST_REDIS_URL; without them these tests are skipped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest
from yarl import URL

from devtools.loadgen import LoadGenerator
from tests.conftest import REPO, eventually, free_port, wait_for_http
from tests.vastmgr import live_engine
from vastmgr.fleet.leases import RENEWALS_PER_PERIOD
from vastmgr.front.consumers import CLOSE_FORBIDDEN

param_cache = live_engine.param_cache

DATABASE_URL = os.environ.get("TEST_DATABASE_URL")
REDIS_URL = os.environ.get("TEST_REDIS_URL")
START_TIMEOUT = 120
PROOF_TIMEOUT = 180
USER, PASSWORD = "ops", "pw-for-scaleout-1"
# Variables of the surrounding shell that would override what each test process is given.
INHERITED_CONFIG = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                    "VASTMGR_HTTPS", "VASTMGR_ADMIN_USER", "VASTMGR_ADMIN_PASSWORD",
                    "VASTMGR_DATA_DIR", "CUZK_CONFIG", "CUZK_LISTEN"}

pytestmark = [
    pytest.mark.scaleout,
    pytest.mark.skipif(not (DATABASE_URL and REDIS_URL),
                       reason="TEST_DATABASE_URL and TEST_REDIS_URL are unset (.ci/run starts "
                              "PostgreSQL and Redis and exports them)"),
]


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.contextmanager
def fresh_database():
    """A new, empty database on the test server, dropped afterwards."""
    import psycopg

    name = f"{urlsplit(DATABASE_URL).path.strip('/') or 'vastmgr'}_scaleout_{secrets.token_hex(4)}"
    admin = with_database(DATABASE_URL, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(DATABASE_URL, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def database_url():
    with fresh_database() as url:
        yield url


def query(database_url: str, sql: str, *params):
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, params).fetchall()


@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Stack:
    dashboards: list[str]
    machine_id: int
    machine_name: str
    database_url: str
    processes: list[Process]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.output()[-3000:]}" for p in self.processes)


def deployment_env(database_url: str, workdir: Path, **extra) -> dict:
    """The environment every process of one deployment reads at start-up."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_CONFIG}
    env.update(DATABASE_URL=database_url, REDIS_URL=REDIS_URL, PYTHONPATH=str(REPO),
               DJANGO_SETTINGS_MODULE="vastmgr.settings", VASTMGR_DATA_DIR=str(workdir / "data"),
               # Every process must sign and read the same sessions, as on a real deployment.
               SECRET_KEY=secrets.token_urlsafe(40), DJANGO_SUPERUSER_PASSWORD=PASSWORD, **extra)
    return env


def run_manage(env: dict, *argv: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"manage.py {argv[0]} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def start_process(name: str, argv: list[str], env: dict, workdir: Path, cwd: Path = REPO,
                  **popen) -> Process:
    """`argv` started in `cwd` (the checkout), its output in `workdir`; `popen` adds
    subprocess.Popen's arguments (`user`, `group`: a service user)."""
    log = workdir / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                **popen)
    return Process(name, proc, log)


def any_exited(processes: list[Process]) -> Callable[[], str | None]:
    def check() -> str | None:
        for p in processes:
            if p.proc.poll() is not None:
                return f"{p.name} exited with {p.proc.returncode}:\n{p.output()}"
        return None
    return check


@pytest.fixture(scope="module")
def stack(database_url, param_cache, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("scaleout")
    env = deployment_env(database_url, workdir, CUZK_PARAM_CACHE=str(param_cache))
    manage = [sys.executable, "manage.py"]
    for argv in (["migrate", "--noinput", "-v", "0"],
                 ["createsuperuser", "--noinput", "--username", USER,
                  "--email", "ops@example.com"]):
        run_manage(env, *argv)

    machine_name = f"scaleout-{secrets.token_hex(3)}"
    ports = [free_port(), free_port()]
    engine_port = free_port()
    commands = [
        ("engine", manage + ["run_engine", "--listen", f"127.0.0.1:{engine_port}",
                             "--name", machine_name]),
        ("controller", manage + ["run_fleet", "--tick", "0.2", "--interval", "0.5"]),
    ] + [(f"daphne-{port}", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "vastmgr.asgi:application"]) for port in ports]
    processes = []
    try:
        for name, argv in commands:
            processes.append(start_process(name, argv, env, workdir))
        wait_for_http(f"http://127.0.0.1:{engine_port}/status", START_TIMEOUT,
                      any_exited(processes))
        for port in ports:
            wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", START_TIMEOUT,
                          any_exited(processes))
        [(machine_id,)] = query(database_url, "SELECT id FROM fleet_machine WHERE name = %s",
                                machine_name)
        yield Stack([f"http://127.0.0.1:{port}" for port in ports], machine_id, machine_name,
                    database_url, processes)
    finally:
        for p in processes:
            p.stop()
    controller = processes[1].output()
    assert "fragments go to the shared channel layer" in controller, controller


async def log_in(http: aiohttp.ClientSession, base: str) -> str:
    """Log in through the real form; returns the session cookie header."""
    async with http.get(f"{base}/accounts/login/") as response:
        assert response.status == 200
    csrf = http.cookie_jar.filter_cookies(URL(base))["csrftoken"].value
    async with http.post(f"{base}/accounts/login/", allow_redirects=False, data={
            "username": USER, "password": PASSWORD, "csrfmiddlewaretoken": csrf}) as response:
        assert response.status == 302 and response.headers["Location"] == "/"
    return f"sessionid={http.cookie_jar.filter_cookies(URL(base))['sessionid'].value}"


async def socket(http: aiohttp.ClientSession, base: str, path: str, cookie: str | None,
                 origin: str | None = None) -> aiohttp.ClientWebSocketResponse:
    headers = {"Origin": origin or base}
    if cookie:
        headers["Cookie"] = cookie
    return await http.ws_connect(base.replace("http://", "ws://") + path, headers=headers)


async def receive_until(ws, predicate, timeout: float) -> list[str]:
    """Every text message until one satisfies `predicate` (all of them are returned)."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching message within {timeout}s; got {len(seen)}")
        message = await ws.receive(timeout=left)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"socket ended: {message.type.name} {message.data}")
        seen.append(message.data)
        if predicate(message.data):
            return seen


async def start_proof(http: aiohttp.ClientSession, base: str, machine_id: int, seed: int) -> str:
    async with http.get(f"{base}/proofs/new/") as response:
        assert response.status == 200
    csrf = http.cookie_jar.filter_cookies(URL(base))["csrftoken"].value
    async with http.post(f"{base}/proofs/new/", allow_redirects=False, data={
            "machine": machine_id, "kind": "winning-post", "profile": "tiny", "seed": seed,
            "count": 1, "priority": "", "csrfmiddlewaretoken": csrf}) as response:
        assert response.status == 302, await response.text()
        location = response.headers["Location"]
    match = re.fullmatch(r"/proofs/([0-9a-f-]{36})/", location)
    assert match, location
    return match.group(1)


def verified(html: str) -> bool:
    return 'title="Re-verified by the dashboard">verified<' in html


def fleet_rows(messages: list[str], machine_id: int) -> dict[str, str]:
    """The host's fleet-row fragments in these messages, by the engine seq each shows."""
    rows = {}
    pattern = re.compile(rf'<tr id="host-{machine_id}-row"[^>]*data-seq="(\d+)".*?</tr>', re.DOTALL)
    for message in messages:
        for match in pattern.finditer(message):
            rows[match.group(1)] = match.group(0)
    return rows


def http_session() -> aiohttp.ClientSession:
    # unsafe: keep cookies for an IP-address host (127.0.0.1)
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_sockets_on_both_daphnes_refuse_strangers_and_send_state_from_postgres(stack):
    for base in stack.dashboards:
        async with http_session() as http:
            anonymous = await socket(http, base, "/ws/fleet/", None)
            closing = await anonymous.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == CLOSE_FORBIDDEN
            cookie = await log_in(http, base)
            with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
                await socket(http, base, "/ws/fleet/", cookie, origin="http://evil.example")
            assert foreign.value.status == 403
            ws = await socket(http, base, "/ws/fleet/", cookie)
            state = (await receive_until(ws, lambda m: 'id="fleet-rows"' in m, 10))[-1]
            assert f'id="host-{stack.machine_id}-row"' in state and stack.machine_name in state
            assert 'id="fleet-totals"' in state
            await ws.close()


async def test_a_proof_from_the_view_is_dispatched_through_postgres_and_pushed_via_redis(stack):
    first, second = stack.dashboards
    async with http_session() as http:
        cookie = await log_in(http, first)
        job_id = await start_proof(http, first, stack.machine_id, seed=11)
        # Watched on the other daphne: the controller's pushes reach it only through Redis.
        ws = await socket(http, second, f"/ws/proofs/{job_id}/", cookie)
        try:
            await receive_until(ws, verified, PROOF_TIMEOUT)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from None
        await ws.close()
        async with http.get(f"{first}/proofs/{job_id}/proof.bin") as response:
            downloaded = await response.read()
    [(status, is_verified, engine_verified, proof, machine_id, request)] = query(
        stack.database_url, "SELECT status, verified, engine_verified, proof, machine_id, "
        "engine_job_id FROM proofs_proofjob WHERE id = %s", job_id)
    assert (status, is_verified, engine_verified) == ("done", True, True)
    assert len(proof) == 192 and bytes(proof) == downloaded
    assert machine_id == stack.machine_id and request == job_id


async def test_two_daphnes_on_one_redis_both_deliver_the_same_fleet_update(stack):
    async with http_session() as http:
        cookies = [await log_in(http, base) for base in stack.dashboards]
        sockets = [await socket(http, base, "/ws/fleet/", cookie)
                   for base, cookie in zip(stack.dashboards, cookies)]
        for ws in sockets:
            await receive_until(ws, lambda m: 'id="fleet-rows"' in m, 10)
        [(done_before,)] = query(stack.database_url, "SELECT count(*) FROM proofs_proofjob "
                                 "WHERE machine_id = %s AND status = 'done'", stack.machine_id)
        await start_proof(http, stack.dashboards[0], stack.machine_id, seed=12)
        counted = f'<span class="ok">{done_before + 1}</span>'

        async def rows_until_counted(ws) -> dict[str, str]:
            # Until the row counts the new proof in its "24 h done" column.
            messages = await receive_until(
                ws, lambda m: any(counted in row
                                  for row in fleet_rows([m], stack.machine_id).values()),
                PROOF_TIMEOUT)
            return fleet_rows(messages, stack.machine_id)

        received = await asyncio.gather(*(rows_until_counted(ws) for ws in sockets))
        for ws in sockets:
            await ws.close()
    common = set(received[0]) & set(received[1])
    assert common, f"no engine seq reached both browsers: {sorted(received[0])} vs " \
                   f"{sorted(received[1])}"
    for seq in common:
        assert received[0][seq] == received[1][seq], f"seq {seq} differs between the daphnes"


# ---- several controllers sharing one fleet through leases ------------------------------------

SHARED_HOSTS, JOBS = 20, 50
LEASE = 3.0  # seconds; short so the takeover test is quick
# A lapsed lease is claimed at the survivor's next renewal (4 a period); connecting and the first
# snapshot take the rest.
TAKEOVER_BOUND = LEASE + LEASE / RENEWALS_PER_PERIOD + 3.0


@dataclass
class SharedFleet:
    database_url: str
    env: dict
    loadgen: LoadGenerator
    machines: dict[int, int]  # machine id -> load generator host index
    controllers: list[Process]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.output()[-3000:]}" for p in self.controllers)

    def owners(self) -> dict[str, set[int]]:
        """Unexpired leases by owner."""
        owned: dict[str, set[int]] = {}
        for owner, machine_id in query(self.database_url, "SELECT owner, machine_id FROM "
                                       "fleet_machinelease WHERE owner <> '' AND expires > now()"):
            owned.setdefault(owner, set()).add(machine_id)
        return owned

    def owner_of(self, process: Process) -> str:
        return next(o for o in self.owners() if o.endswith(f"-{process.proc.pid}"))

    def streams(self) -> dict[int, int]:
        """Status streams open to each host's engine: one per controller watching it."""
        return {m: self.loadgen.streams(host) for m, host in self.machines.items()}

    def connected_since(self, when: str) -> set[int]:
        return {m for (m,) in query(self.database_url, "SELECT machine_id FROM fleet_machinestatus "
                                    "WHERE connected AND updated > %s::timestamptz", when)}


@pytest.fixture(scope="module")
def proof_record(param_cache) -> dict:
    """A finished proof record from a real engine (tiny profile). The simulated engines answer
    every job with it, so the controllers' own re-verification of each result really runs."""
    engine = live_engine.LiveEngine(param_cache).start()
    try:
        job = engine.submit(kind="winning-post", profile="tiny", seed=7)
        with urllib.request.urlopen(f"{engine.url}/v1/proofs/{job['job_id']}?wait=120",
                                    timeout=180) as response:
            record = json.load(response)
    finally:
        engine.stop()
    assert record["status"] == "done" and record["verified"], record
    return record


@pytest.fixture(scope="module")
def shared_fleet(proof_record, tmp_path_factory):
    """Two controllers (separate processes, leases of LEASE seconds) over one PostgreSQL and
    Redis, and 20 simulated engines (in a thread of this process, so the test can count what
    reaches them)."""
    workdir = tmp_path_factory.mktemp("shared")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    # A snapshot every 0.5 s, the interval the controllers expect: every host stays live.
    loadgen = LoadGenerator(SHARED_HOSTS, rate=2.0, result=proof_record)
    asyncio.run_coroutine_threadsafe(loadgen.start(), loop).result(30)
    controllers = []
    try:
        with fresh_database() as database_url:
            env = deployment_env(database_url, workdir, SIM_PORTS=json.dumps(loadgen.ports))
            run_manage(env, "migrate", "--noinput", "-v", "0")
            run_manage(env, "shell", "-c", "import json, os\n"
                       "from vastmgr.fleet.models import Machine\n"
                       "for i, port in enumerate(json.loads(os.environ['SIM_PORTS'])):\n"
                       "    Machine.objects.create(name=f'sim-{i}', provider='local',"
                       " host='127.0.0.1', engine_port=port, state='running')\n")
            ports = {port: host for host, port in enumerate(loadgen.ports)}
            machines = {machine_id: ports[port] for machine_id, port in query(
                database_url, "SELECT id, engine_port FROM fleet_machine")}
            for n in (1, 2):
                controllers.append(start_process(
                    f"controller-{n}", [sys.executable, "manage.py", "run_fleet", "--tick", "0.2",
                                        "--interval", "0.5", "--lease", str(LEASE)], env, workdir))
            yield SharedFleet(database_url, env, loadgen, machines, controllers)
            for p in controllers:
                p.stop()
    finally:
        for p in controllers:
            p.stop()
        asyncio.run_coroutine_threadsafe(loadgen.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_two_controllers_share_the_hosts_without_overlap(shared_fleet):
    fleet = shared_fleet
    owners = eventually(lambda: (o := fleet.owners()) and len(o) == 2
                        and sorted(map(len, o.values())) == [10, 10] and o,
                        60, "two controllers holding 10 hosts each", fleet.logs)
    first, second = owners.values()
    assert not first & second and first | second == set(fleet.machines)
    assert {o.rsplit("-", 1)[1] for o in owners} == {str(p.proc.pid) for p in fleet.controllers}
    # Each engine is watched by exactly one controller, and every host is live in the database.
    eventually(lambda: set(fleet.streams().values()) == {1}, 30,
               "exactly one status stream per engine", fleet.logs)
    eventually(lambda: fleet.connected_since("-infinity") == set(fleet.machines), 30,
               "every host connected", fleet.logs)


def test_jobs_are_dispatched_across_both_controllers_each_submitted_exactly_once(shared_fleet):
    fleet = shared_fleet
    eventually(lambda: len(fleet.owners()) == 2, 60, "both controllers holding hosts", fleet.logs)
    owners = fleet.owners()
    run_manage(fleet.env, "shell", "-c",
               "from vastmgr.proofs.models import ProofJob\n"
               f"for seed in range({JOBS}):\n"
               "    ProofJob.objects.create(kind='winning-post', profile='tiny', seed=seed)\n")
    eventually(lambda: query(fleet.database_url, "SELECT count(*) FROM proofs_proofjob "
                             "WHERE status = 'done' AND verified")[0][0] == JOBS,
               120, f"all {JOBS} jobs done and re-verified", fleet.logs)
    jobs = dict(query(fleet.database_url, "SELECT id::text, machine_id FROM proofs_proofjob"))
    submitted: dict[str, list[int]] = {}
    for machine_id, host in fleet.machines.items():
        for request_id, count in fleet.loadgen.submissions[host].items():
            submitted.setdefault(request_id, []).extend([machine_id] * count)
    assert submitted.keys() == jobs.keys()
    duplicates = {job: where for job, where in submitted.items() if len(where) != 1}
    assert not duplicates, f"submitted more than once: {duplicates}"
    assert all(submitted[job] == [machine_id] for job, machine_id in jobs.items())
    used = set(jobs.values())
    assert all(used & hosts for hosts in owners.values()), \
        f"one controller dispatched everything: {owners} vs {used}"


def test_a_killed_controllers_hosts_are_watched_again_within_the_lease_period(shared_fleet):
    fleet = shared_fleet
    eventually(lambda: len(fleet.owners()) == 2, 60, "both controllers holding hosts", fleet.logs)
    victim, survivor = fleet.controllers
    orphaned = fleet.owners()[fleet.owner_of(victim)]
    [(killed_at,)] = query(fleet.database_url, "SELECT now()::text")
    started = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    successor = fleet.owner_of(survivor)
    eventually(lambda: fleet.owners() == {successor: set(fleet.machines)}
               and set(fleet.streams().values()) == {1}
               and orphaned <= fleet.connected_since(killed_at),
               TAKEOVER_BOUND, "every host leased to, watched by and written by the survivor",
               fleet.logs)
    took = time.monotonic() - started
    assert took <= TAKEOVER_BOUND, took
