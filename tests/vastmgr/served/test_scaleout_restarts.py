"""Redis and PostgreSQL restarted under the scale-out mode. The servers are this module's own
(a redis-server and a PostgreSQL cluster on free loopback ports, not the shared ones of
.ci/run), so they can be stopped and started again; daphne, the fleet controller and an engine
run against them as a deployment does. Through each restart: a page that was open shows the
fleet as it is again (it reconnects, as static/vastmgr/app.js does, when its socket closes),
the controller keeps its machine (same lease owner, its status written again), and every proof
started before, during or after ends done and verified, once."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import eventually, free_port, wait_for_http
from tests.vastmgr import live_engine
from tests.vastmgr.served.test_scaleout import (
    Process,
    any_exited,
    deployment_env,
    fleet_rows,
    http_session,
    log_in,
    query,
    run_manage,
    socket,
    start_process,
    start_proof,
)
from vastmgr.front.viewers import LEASE as VIEWER_LEASE
from vastmgr.front.viewers import RENEW_EVERY

param_cache = live_engine.param_cache

PG_BIN = max(glob.glob("/usr/lib/postgresql/*/bin"), default="", key=lambda p: float(
    p.split("/")[-2]))
REDIS_SERVER = shutil.which("redis-server")
LEASE = 3.0
# From a server being back to the page showing a proof done after it: the controller's next
# tick, the page's reconnect (its backoff starts at 1 s), the proof itself on a loaded machine.
RECOVERY_TIMEOUT = 120

pytestmark = [
    pytest.mark.slow, pytest.mark.scaleout, pytest.mark.timeout(600),
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed"),
    pytest.mark.skipif(not PG_BIN, reason="PostgreSQL's server is not installed (Debian: "
                                          "apt-get install postgresql)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run PostgreSQL as postgres"),
]


class Redis:
    """A redis-server of our own, as .ci/run starts the shared one (no persistence: a restart
    loses every group and queued message, which is what a restart may do)."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(REDIS_SERVER), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        eventually(lambda: subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                                          capture_output=True, text=True, check=False
                                          ).stdout.strip() == "PONG", 20, "redis-server answers")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)


class Postgres:
    """A PostgreSQL cluster of our own, owned by the postgres user as .ci/run makes one."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.root = root

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/vastmgr"

    def pg_ctl(self, *args: str) -> None:
        self._as_postgres(f"{PG_BIN}/pg_ctl", "-s", "-D", f"{self.root}/data", *args)

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True,
                       capture_output=True)

    def create(self) -> None:
        shutil.chown(self.root, "postgres")
        self._as_postgres(f"{PG_BIN}/initdb", "-D", f"{self.root}/data", "-U", "postgres",
                          "--auth=trust", "--no-sync")
        self.start()
        self._as_postgres(f"{PG_BIN}/createdb", "-h", "127.0.0.1", "-p", str(self.port),
                          "-U", "postgres", "vastmgr")

    def start(self) -> None:
        self.pg_ctl("-l", f"{self.root}/log", "-o", f"-p {self.port} -k {self.root} "
                    "-c listen_addresses=127.0.0.1 -c fsync=off", "-w", "start")

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "-w", "stop")


@dataclass
class Deployment:
    base: str
    machine_id: int
    machine_name: str
    database_url: str
    redis: Redis
    postgres: Postgres
    processes: list[Process]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.output()[-3000:]}" for p in self.processes)

    def lease_owner(self) -> str | None:
        rows = query(self.database_url, "SELECT owner FROM fleet_machinelease WHERE "
                     "machine_id = %s AND expires > now()", self.machine_id)
        return rows[0][0] if rows else None

    def done(self) -> int:
        return query(self.database_url, "SELECT count(*) FROM proofs_proofjob WHERE status = "
                     "'done' AND verified AND machine_id = %s", self.machine_id)[0][0]


@pytest.fixture(scope="module")
def deployment(param_cache) -> Iterator[Deployment]:
    root = Path(tempfile.mkdtemp(prefix="vastmgr-restarts-"))
    root.chmod(0o755)  # the postgres user reaches its cluster below it
    redis, postgres = Redis(root), Postgres(root / "pg")
    postgres.root.mkdir()
    processes: list[Process] = []
    try:
        redis.start()
        postgres.create()
        env = {**deployment_env(postgres.url, root, CUZK_PARAM_CACHE=str(param_cache)),
               "REDIS_URL": redis.url}
        run_manage(env, "migrate", "--noinput", "-v", "0")
        run_manage(env, "createsuperuser", "--noinput", "--username", "ops",
                   "--email", "ops@example.com")
        name, port, engine_port = "restarts", free_port(), free_port()
        manage = [sys.executable, "manage.py"]
        for process, argv in (
                ("engine", manage + ["run_engine", "--listen", f"127.0.0.1:{engine_port}",
                                     "--name", name]),
                ("controller", manage + ["run_fleet", "--tick", "0.2", "--interval", "0.5",
                                         "--lease", str(LEASE)]),
                ("daphne", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "vastmgr.asgi:application"])):
            processes.append(start_process(process, argv, env, root))
        wait_for_http(f"http://127.0.0.1:{engine_port}/status", 120, any_exited(processes))
        wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", 120, any_exited(processes))
        [(machine_id,)] = query(postgres.url, "SELECT id FROM fleet_machine WHERE name = %s",
                                name)
        yield Deployment(f"http://127.0.0.1:{port}", machine_id, name, postgres.url, redis,
                         postgres, processes)
    finally:
        for p in processes:
            p.stop()
        redis.stop()
        with contextlib.suppress(subprocess.CalledProcessError):
            postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


class Page:
    """The fleet page as a browser keeps it: its socket, opened again whenever it closes
    (static/vastmgr/app.js), and the last fleet row it shows for the machine."""

    def __init__(self, http: aiohttp.ClientSession, deployment: Deployment, cookie: str):
        self.http, self.deployment, self.cookie = http, deployment, cookie
        self.row = ""
        self.reconnects = 0
        self.recovered_s = math.nan  # server back -> a proof started then shown done

    async def keep_open(self) -> None:
        while True:
            try:
                ws = await socket(self.http, self.deployment.base, "/ws/fleet/", self.cookie)
            except (aiohttp.ClientError, OSError):
                await asyncio.sleep(1)  # the page's first backoff
                continue
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    rows = fleet_rows([message.data], self.deployment.machine_id)
                    if rows:
                        self.row = rows[max(rows, key=int)]
            self.reconnects += 1
            await asyncio.sleep(1)

    async def shows_done(self, count: int, timeout: float) -> None:
        counted = f'<span class="ok">{count}</span>'
        deadline = time.monotonic() + timeout
        while counted not in self.row:
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed {count} done: {self.row}\n"
                                     f"{self.deployment.logs()}")
            await asyncio.sleep(0.2)


async def restart_during_proofs(deployment: Deployment, stop, start,
                                outlast: float = 0) -> Page:
    """A proof done before the restart, one started just before it (in flight through it),
    one after (and, with `outlast`, one more that many seconds after the restart): the page
    that stayed open must show all of them done, and the controller must have kept the
    machine throughout."""
    owner = eventually(deployment.lease_owner, 30, "the controller holds the machine",
                       deployment.logs)
    async with http_session() as http:
        cookie = await log_in(http, deployment.base)
        page = Page(http, deployment, cookie)
        keeper = asyncio.create_task(page.keep_open())
        try:
            before = deployment.done()
            await start_proof(http, deployment.base, deployment.machine_id, seed=before + 1)
            await page.shows_done(before + 1, RECOVERY_TIMEOUT)
            await start_proof(http, deployment.base, deployment.machine_id, seed=before + 2)
            await asyncio.to_thread(stop)
            await asyncio.to_thread(start)
            back = time.monotonic()
            await start_proof(http, deployment.base, deployment.machine_id, seed=before + 3)
            await page.shows_done(before + 3, RECOVERY_TIMEOUT)
            page.recovered_s = time.monotonic() - back
            if outlast:
                # Until whatever the page announced before the restart has lapsed: from then
                # on the controller renders for it only if it heard it since.
                await asyncio.sleep(max(0.0, back + outlast - time.monotonic()))
                await start_proof(http, deployment.base, deployment.machine_id,
                                  seed=before + 4)
                await page.shows_done(before + 4, RECOVERY_TIMEOUT)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
    assert deployment.lease_owner() == owner, "the controller lost its machine"
    assert not any_exited(deployment.processes)(), deployment.logs()
    jobs = query(deployment.database_url, "SELECT status, verified, engine_job_id = id::text "
                 "FROM proofs_proofjob")
    assert jobs and all(job == ("done", True, True) for job in jobs), jobs
    return page


async def test_a_redis_restart_loses_no_page_no_machine_and_no_proof(deployment):
    # The page's announcements from before the restart lapse after the viewers' lease: a
    # controller that no longer hears the pages (its group forgotten by Redis) stops rendering.
    page = await restart_during_proofs(deployment, deployment.redis.stop, deployment.redis.start,
                                       outlast=VIEWER_LEASE + RENEW_EVERY)
    # The figure for docs/reliability.md (shown with -s).
    print(f"Redis restart: {page.recovered_s:.1f} s until the page showed a proof started "
          f"after it done; the page's socket reopened {page.reconnects} time(s)")


async def test_a_postgres_restart_loses_no_page_no_machine_and_no_proof(deployment):
    page = await restart_during_proofs(deployment, deployment.postgres.stop,
                                       deployment.postgres.start)
    print(f"PostgreSQL restart: {page.recovered_s:.1f} s until the page showed a proof started "
          f"after it done; the page's socket reopened {page.reconnects} time(s)")
