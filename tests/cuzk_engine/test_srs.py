"""SrsManager with the real tiny parameters: on-demand loads under the budget, preload, evict,
LRU eviction of idle entries after a minimum idle time, and in-use entries never evicted."""

import asyncio

import pytest

from cuzk_engine.engine.memory import MemoryBudget
from cuzk_engine.engine.srs import SrsManager
from cuzk_engine.engine.stages import real_stages
from cuzk_engine.engine.status import DeviceInfo, StatusTracker
from cuzk_engine.errors import BudgetExceeded, InvalidRequest, SrsInUse

WP, WIN, SNAP, POREP = "window-post.tiny", "winning-post.tiny", "snap-update.tiny", "porep-c2.tiny"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def manager(cache, total=64 * 1024**2, min_idle=300.0):
    clock = Clock()
    b = MemoryBudget(total)
    b.recheck_interval = 30.0
    tracker = StatusTracker([DeviceInfo(0, "cpu", "cpu", "test")], 1, memory=b.usage)
    srs = SrsManager(cache, b, tracker, real_stages(), min_idle=min_idle, clock=clock)
    b.evictor = srs.evict_idle
    return srs, b, tracker, clock


def shown(tracker):
    return {a.circuit_id: (a.state, a.in_use, a.evictable, a.bytes)
            for a in tracker.snapshot().allocations["srs"]}


async def test_loads_on_demand_once_and_reserves_the_real_size(tiny_cache):
    srs, b, tracker, _ = manager(tiny_cache)
    assert srs.loaded() == [] and b.used == 0
    # two jobs ask at the same time: one load, both get the same parameters
    (p1, ms1, now1), (p2, ms2, now2) = await asyncio.gather(srs.acquire(POREP),
                                                            srs.acquire(POREP))
    assert p1 is p2 and sorted([now1, now2]) == [False, True] and max(ms1, ms2) > 0
    assert b.used == p1.nbytes == srs.resident_bytes(POREP)
    assert shown(tracker) == {POREP: ("loaded", 2, False, p1.nbytes)}
    srs.release(POREP)
    srs.release(POREP)
    assert shown(tracker) == {POREP: ("loaded", 0, True, p1.nbytes)}
    with pytest.raises(RuntimeError, match="without a matching acquire"):
        srs.release(POREP)
    assert b.used == p1.nbytes  # released references keep the parameters resident


async def test_parameters_larger_than_the_budget_fail_and_leave_nothing_behind(tiny_cache):
    srs, b, tracker, _ = manager(tiny_cache, total=512 * 1024)
    with pytest.raises(BudgetExceeded, match="parameters porep-c2.tiny needs"):
        await srs.acquire(POREP)
    assert srs.loaded() == [] and b.used == 0 and shown(tracker) == {}


async def test_preload_then_evict(tiny_cache):
    srs, b, tracker, _ = manager(tiny_cache)
    already, ms = await srs.preload(SNAP)
    assert not already and ms > 0
    assert await srs.preload(SNAP) == (True, 0.0)
    assert srs.loaded() == [SNAP] and shown(tracker)[SNAP][:3] == ("loaded", 0, True)
    freed = srs.evict(SNAP)
    assert freed > 0 and b.used == 0 and srs.loaded() == [] and shown(tracker) == {}
    assert srs.evict(SNAP) == 0
    with pytest.raises(InvalidRequest, match="unknown circuit id"):
        srs.evict("porep-c2.gigantic")


async def test_an_entry_in_use_is_never_evicted(tiny_cache):
    srs, b, _, clock = manager(tiny_cache, min_idle=0.0)
    params, _, _ = await srs.acquire(WIN)
    with pytest.raises(SrsInUse, match="in use by 1 job"):
        srs.evict(WIN)
    clock.t += 10_000
    assert srs.evict_idle(10**12) == 0
    srs.evict_all_idle()
    assert srs.loaded() == [WIN] and b.used == params.nbytes
    srs.release(WIN)
    assert srs.evict_idle(1) == params.nbytes and srs.loaded() == []


async def test_idle_entries_are_evicted_least_recently_used_first_after_the_minimum_idle(
        tiny_cache):
    srs, b, _, clock = manager(tiny_cache, min_idle=300.0)
    for cid in (WP, WIN, SNAP):
        await srs.preload(cid)
        clock.t += 100.0
    # now: WP idle 300 s, WIN 200 s, SNAP 100 s
    wp_bytes = srs.resident_bytes(WP)
    used = b.used
    assert srs.evict_idle(1) == wp_bytes
    assert sorted(srs.loaded()) == [SNAP, WIN] and b.used == used - wp_bytes
    assert srs.evict_idle(10**12) == 0  # nothing else has been idle long enough
    clock.t += 100.0
    await srs.acquire(WIN)  # used again: only SNAP can go
    srs.release(WIN)
    clock.t += 200.0
    assert srs.evict_idle(10**12) > 0
    assert srs.loaded() == [WIN]


async def test_the_budget_evicts_idle_parameters_before_a_load_waits(tiny_cache):
    probe, _, _, _ = manager(tiny_cache)
    await probe.preload(POREP)
    size = probe.resident_bytes(POREP)
    # room for one set of parameters and a half: a second load needs the first one gone
    srs, b, tracker, clock = manager(tiny_cache, total=size * 3 // 2 + 4096, min_idle=60.0)
    await srs.preload(POREP)
    clock.t += 61.0
    await asyncio.wait_for(srs.preload(SNAP), 5)
    assert srs.loaded() == [SNAP] and list(shown(tracker)) == [SNAP]
    assert b.used == srs.resident_bytes(SNAP)
