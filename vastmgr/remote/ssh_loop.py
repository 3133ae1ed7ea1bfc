"""The dashboard process's one SSH event loop: long actions run off the request thread, and the
log view and actions share one pooled SSH connection per machine (asyncssh connections belong
to the loop that opened them, so they all live on this one).

Every coroutine starts here in a fresh, empty context. A request thread's context carries
asgiref's executor for that request (`AsyncToSync.executors.current`, set where Django's
middleware chain crosses from sync to async), and asgiref's `sync_to_async` prefers it over
any `ThreadSensitiveContext`: a task that inherited it would send its ORM calls to the
request's thread, which is blocked waiting for this very task (a deadlock until the timeout)
or, once the request has ended, gone ("CurrentThreadExecutor already quit or is broken").

Progress and results reach the page through Events, which the machine page polls.
"""

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import logging
import threading

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import connections

from vastmgr.fleet.models import Event
from vastmgr.remote.ssh import Backoff, LinkPool

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_in_flight: set[concurrent.futures.Future] = set()
# A page or an action waits for at most two connect attempts before it reports the host down.
pool = LinkPool(backoff=dataclasses.replace(Backoff.from_env(), attempts=2))


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="remote-ssh-loop",
                             daemon=True).start()
        return _loop


async def _own_db_thread(coroutine_factory):
    # The ORM's sync_to_async calls of this coroutine get their own thread (and so their own
    # database connection, closed at the end), not a thread some request holds.
    async with ThreadSensitiveContext():
        try:
            return await coroutine_factory()
        finally:
            await sync_to_async(connections.close_all)()


def _schedule(coroutine_factory) -> concurrent.futures.Future:
    """Start the coroutine on the SSH loop in an empty context (see the module's docstring):
    the loop's callback, and the task it creates, copy the context current at this call."""
    return contextvars.Context().run(asyncio.run_coroutine_threadsafe,
                                     _own_db_thread(coroutine_factory), _running_loop())


def run(coroutine_factory, timeout: float):
    """Run a coroutine on the SSH loop and wait for its result (from a request thread)."""
    future = _schedule(coroutine_factory)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer within {timeout:g} s") from None


def launch(label: str, coroutine_factory, machine=None) -> concurrent.futures.Future:
    """Start a long action on the SSH loop and return at once."""
    async def guarded():
        try:
            await coroutine_factory()
        except Exception as exc:  # the action's last resort: record, never lose the failure
            log.exception("%s failed", label)
            await sync_to_async(Event.record)("remote", f"{label} failed: {exc}",
                                              machine=machine, level=Event.Level.ERROR)

    future = _schedule(guarded)
    _in_flight.add(future)
    future.add_done_callback(_in_flight.discard)
    return future


def wait_idle(timeout: float) -> None:
    """Wait for every launched action to finish (tests, shutdown)."""
    concurrent.futures.wait(list(_in_flight), timeout)
