"""Run the engine and its API: ``EngineDaemon`` (start/stop) and ``serve`` (until a signal).

First SIGTERM/SIGINT: stop accepting, finish running jobs, exit. A second one exits fast.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from concurrent.futures import Executor

from aiohttp import web

from cuzk_engine.config import EngineConfig
from cuzk_engine.daemon.app import build_app
from cuzk_engine.engine.orchestrator import Engine
from cuzk_engine.engine.pool import kill_stale_pools, mark_as_owner
from cuzk_engine.engine.stages import Stages

log = logging.getLogger("cuzk_engine.daemon")


class EngineDaemon:
    def __init__(self, config: EngineConfig, *, stages: Stages | None = None,
                 synth_executor: Executor | None = None):
        config.check_daemon_security()
        self.config = config
        self.engine = Engine(config, stages=stages, synth_executor=synth_executor)
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    async def start(self) -> str:
        """Start the engine and listen; returns the base URL (the real port if 0 was asked)."""
        await self.engine.start()
        self._runner = web.AppRunner(build_app(self.engine), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.daemon.host, self.config.daemon.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        log.info("engine listening on %s", self.url)
        return self.url

    async def stop(self, *, fast: bool = False) -> None:
        """Drain (or, fast, cancel) the engine, then close the API."""
        await self.engine.stop(fast=fast)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve(config: EngineConfig, *, ready: Callable[[str], None] | None = None,
                stages: Stages | None = None) -> None:
    """Serve until SIGTERM/SIGINT; the first drains, a second exits fast."""
    kill_stale_pools()
    mark_as_owner()
    daemon = EngineDaemon(config, stages=stages)
    url = await daemon.start()
    if ready is not None:
        ready(url)
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        sig = await signals.get()
        log.warning("%s: draining (send again to exit at once)", signal.Signals(sig).name)
        drain = asyncio.create_task(daemon.stop())
        second = asyncio.create_task(signals.get())
        done, _ = await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
        if second in done:
            log.warning("second signal: cancelling running work")
            await daemon.stop(fast=True)
            drain.cancel()
        else:
            second.cancel()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
