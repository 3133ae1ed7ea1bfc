"""MemoryBudget and Reservation: context managers, partial release, permanent holds, the evictor
before any wait, and requests that can never fit failing at once."""

import asyncio
import threading

import pytest

from cuzk_engine.engine.memory import MemoryBudget, format_bytes
from cuzk_engine.errors import BudgetExceeded


def nothing_to_evict(b, asked):
    """``b``'s evictor frees nothing and records each shortfall it is asked for, and sets the
    returned event: a reservation that asked goes on to wait for a release without yielding in
    between, so once the event is seen, it waits."""
    asking = asyncio.Event()

    def evictor(short):
        asked.append(short)
        asking.set()
        return 0

    b.evictor = evictor
    return asking


def budget(total=1000, **kw):
    b = MemoryBudget(total, **kw)
    b.recheck_interval = 30.0  # a waiter must be woken by a release, not by the periodic recheck
    return b


async def test_reservation_is_a_context_manager_that_returns_its_bytes_even_on_error():
    b = budget()
    async with asyncio.timeout(1):
        with await b.reserve(600, "partition 0") as r:
            assert (b.used, r.remaining) == (600, 600)
        assert b.used == 0
        with pytest.raises(RuntimeError), await b.reserve(700, "partition 1"):
            raise RuntimeError("synthesis failed")
    assert b.used == 0 and b.usage() == (1000, 0)


async def test_partial_release_after_prove_start_keeps_only_the_pending_proof():
    b = budget()
    r = await b.reserve(900, "a/b/c and witness")
    r.shrink_to(100)  # prove_start consumed a/b/c; the pending proof stays
    assert (b.used, r.remaining) == (100, 100)
    r.shrink_to(500)  # shrinking never grows a reservation
    assert b.used == 100
    r.release(30)
    assert (b.used, r.remaining) == (70, 70)
    with pytest.raises(ValueError, match="release 71 of 70"):
        r.release(71)
    r.close()
    r.close()  # closing twice gives nothing back twice
    assert b.used == 0


async def test_permanent_reservation_holds_until_closed_and_a_release_from_a_thread_wakes_waiters():
    b = budget()
    params = await b.reserve(800, "parameters porep-c2.small")  # resident as long as loaded
    asking = nothing_to_evict(b, [])
    waiter = asyncio.create_task(b.reserve(400, "partition 3"))
    await asyncio.wait_for(asking.wait(), 2)
    assert not waiter.done() and b.used == 800
    # device and finalizer threads release; the waiter lives on the event loop
    threading.Thread(target=params.release, args=(300,)).start()
    r = await asyncio.wait_for(waiter, 2)
    assert (b.used, params.remaining, r.remaining) == (900, 500, 400)
    r.close()
    params.close()
    assert b.used == 0


async def test_evictor_runs_before_anyone_waits_and_gets_the_shortfall():
    b = budget()
    idle_params = await b.reserve(700, "idle parameters")
    asked = []

    def evictor(short):
        asked.append(short)
        idle_params.close()
        return 700

    b.evictor = evictor
    r = await asyncio.wait_for(b.reserve(500, "partition"), 0.5)
    assert asked == [200]
    assert (b.used, r.remaining) == (500, 500)


async def test_when_nothing_is_evictable_the_request_waits_for_a_release():
    b = budget()
    busy = await b.reserve(900, "in-use parameters")
    calls = []
    asking = nothing_to_evict(b, calls)
    waiter = asyncio.create_task(b.reserve(200, "partition"))
    await asyncio.wait_for(asking.wait(), 2)
    assert not waiter.done() and calls == [100]
    busy.close()
    assert (await asyncio.wait_for(waiter, 2)).remaining == 200


async def test_a_request_larger_than_the_whole_budget_fails_at_once_with_the_sizes():
    b = budget(total=3 * 1024**3)
    b.evictor = lambda short: pytest.fail("nothing to evict for a request that can never fit")
    with pytest.raises(BudgetExceeded) as e:
        await asyncio.wait_for(b.reserve(4 * 1024**3, "porep-c2.large partition 0"), 0.5)
    msg = str(e.value)
    assert "porep-c2.large partition 0 needs 4.00 GiB" in msg
    assert "whole memory budget is 3.00 GiB" in msg and "memory.total_budget" in msg
    with pytest.raises(BudgetExceeded):
        await b.reserve(3 * 1024**3 + 1, "x")
    assert b.used == 0


async def test_bad_sizes_are_errors():
    with pytest.raises(ValueError, match="negative"):
        await budget().reserve(-1, "d")
    with pytest.raises(ValueError, match="positive"):
        MemoryBudget(0)


def test_sizes_are_printed_in_binary_units():
    assert [format_bytes(n) for n in (512, 2048, 5 * 1024**2, 12 * 1024**3)] == [
        "512 B", "2.00 KiB", "5.00 MiB", "12.00 GiB"]
