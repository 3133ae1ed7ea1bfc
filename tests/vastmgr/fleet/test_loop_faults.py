"""Every background loop survives an exception in one tick: it is logged, recorded as an Event
(once per minute for the same error), and the loop goes on."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.vastmgr.live_engine import running_controller, wait_until
from vastmgr.autopilot.management.commands.remote_automation import Command as AutomationCommand
from vastmgr.controller.dispatch import Dispatcher
from vastmgr.controller.watcher import MachineLive, MachineWatcher
from vastmgr.fleet.models import Event
from vastmgr.fleet.transport import EngineEndpoint
from vastmgr.remote.lifecycle import Automation

pytestmark = pytest.mark.django_db(transaction=True)


def fault_events(where: str) -> int:
    return Event.objects.filter(kind="fault", message__startswith=where).count()


def failing_first(monkeypatch, cls, name: str, times: int = 1) -> list[int]:
    """Make cls.name raise for its first `times` calls; returns the call counter."""
    calls = [0]
    original = getattr(cls, name)

    async def flaky(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] <= times:
            raise RuntimeError("injected failure")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, flaky)
    return calls


async def test_the_controller_loop_survives_a_failing_tick(monkeypatch):
    calls = failing_first(monkeypatch, Dispatcher, "dispatch", times=3)
    async with running_controller():
        await wait_until(lambda: calls[0] >= 5, timeout=30)
    # Three identical failures within a minute: logged each time, one Event.
    assert await database_sync_to_async(fault_events)("fleet controller tick") == 1


async def test_the_automation_loop_survives_a_failing_tick(monkeypatch):
    calls = failing_first(monkeypatch, Automation, "tick")
    task = asyncio.create_task(AutomationCommand().loop(interval=0.05, once=False))
    try:
        await wait_until(lambda: calls[0] >= 3, timeout=30)
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert await database_sync_to_async(fault_events)("remote automation tick") == 1


class BrokenThenGoodTransport:
    """connect() raises an unexpected error once, then answers with an unreachable endpoint."""

    def __init__(self):
        self.connects = 0

    async def connect(self) -> EngineEndpoint:
        self.connects += 1
        if self.connects == 1:
            raise ValueError("injected bug in the transport")
        return EngineEndpoint("http://127.0.0.1:1", None)

    async def close(self) -> None:
        pass


async def test_a_watcher_survives_an_unexpected_error_and_says_why_the_host_is_down():
    import aiohttp

    live = MachineLive(machine_id=999_999)
    transport = BrokenThenGoodTransport()
    async with aiohttp.ClientSession() as session:
        watcher = MachineWatcher(live, transport, session, clock=lambda: 0.0, interval=0.05)
        task = asyncio.create_task(watcher.run())
        try:
            await wait_until(lambda: transport.connects >= 2, timeout=10)
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert live.connected is False
    assert await database_sync_to_async(fault_events)("engine watcher") == 1
