"""The synthesis process pool, tied to the engine's life.

A killed engine used to leave its pool behind for good: the workers block on their task pipe
(each holds a copy of its write end, so it never closes), and the forkserver and resource tracker
live as long as any worker does. Two guards:

- each worker watches the engine process (a pidfd, else polling) and exits the moment it is gone,
  however it died;
- the daemon marks its pool's processes with its identity in the environment and, at start-up,
  kills every marked process whose engine no longer runs (a pool that outlived a crash).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

log = logging.getLogger("cuzk_engine.engine")

OWNER_ENV = "CUZK_ENGINE_POOL_OWNER"  # "<engine pid>:<engine start time>" in the pool's environ
POLL_SECONDS = 0.5
PROC = Path("/proc")


def synthesis_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                               initializer=watch_engine, initargs=(os.getpid(),))


def watch_engine(engine_pid: int) -> None:
    """Runs in each worker as it starts: exit as soon as the engine process is gone."""
    try:
        pidfd = os.pidfd_open(engine_pid)
    except ProcessLookupError:
        os._exit(0)
    except (OSError, AttributeError):  # no pidfd here: poll
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the process has exited
        else:
            while _alive(engine_pid):
                time.sleep(POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="watch-engine", daemon=True).start()


def mark_as_owner() -> None:
    """Processes the pool starts from now on carry this engine's identity."""
    os.environ[OWNER_ENV] = f"{os.getpid()}:{_start_time(os.getpid())}"


def kill_stale_pools() -> int:
    """SIGKILL every marked process whose engine is gone; returns how many. Linux only (no
    /proc elsewhere: nothing to do)."""
    killed = 0
    if not PROC.is_dir():
        return 0
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        owner = _owner_of(entry)
        if owner is None or _identity_alive(owner):
            continue
        try:
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    if killed:
        log.warning("killed %d process(es) left over from a previous engine's synthesis pool",
                    killed)
    return killed


def _owner_of(entry: Path) -> str | None:
    try:
        environ = (entry / "environ").read_bytes()
    except OSError:  # gone meanwhile, or not ours
        return None
    prefix = f"{OWNER_ENV}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def _identity_alive(owner: str) -> bool:
    pid, _, started = owner.partition(":")
    if not pid.isdigit():
        return False
    return _alive(int(pid)) and _start_time(int(pid)) == started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot: with the pid, an identity that a
    reused pid cannot fake."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]
