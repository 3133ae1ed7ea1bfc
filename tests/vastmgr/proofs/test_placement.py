"""The dispatch policy (`proofs.placement.place`) the controller and the simulated day share:
an engine gets what it can start soon, urgent jobs never wait behind a backlog, the rest stay
queued in the dashboard for the next host."""

from vastmgr.proofs.placement import LOOK_AHEAD, Engine, Waiting, place


def backlog(n: int, priority: str = "normal", start: int = 0) -> list[Waiting]:
    return [Waiting(f"{priority}-{i}", priority) for i in range(start, start + n)]


def placed_on(placements) -> dict:
    shares: dict = {}
    for p in placements:
        shares.setdefault(p.engine, []).append(p.job)
    return shares


def test_an_engine_gets_only_what_it_can_start_soon():
    placements = place(backlog(40), [Engine("a", workers=2, holding=0)])
    assert [p.job for p in placements] == [f"normal-{i}" for i in range(2 + LOOK_AHEAD)]


def test_a_full_engine_gets_nothing_and_a_new_one_takes_its_share_at_once():
    full = Engine("old", workers=2, holding=2 + LOOK_AHEAD)
    assert place(backlog(40), [full]) == []
    shares = placed_on(place(backlog(40), [full, Engine("new", workers=4, holding=0)]))
    assert list(shares) == ["new"] and len(shares["new"]) == 4 + LOOK_AHEAD


def test_work_spreads_over_the_engines_with_room_oldest_first():
    shares = placed_on(place(backlog(5), [Engine("a", 2, 0), Engine("b", 2, 1)]))
    assert sorted(shares["a"] + shares["b"]) == [f"normal-{i}" for i in range(5)]
    assert len(shares["a"]) == 3 and len(shares["b"]) == 2


def test_urgent_jobs_go_at_once_even_to_full_engines_and_before_the_backlog():
    waiting = backlog(2, "critical") + backlog(3, "high") + backlog(50)
    placements = place(waiting, [Engine("a", 2, 3), Engine("b", 2, 5)])
    assert [p.job for p in placements] == [w.key for w in waiting[:5]]
    assert placed_on(placements)["a"][:2] == ["critical-0", "critical-1"]  # the most room


def test_a_job_pinned_to_a_full_engine_waits_without_holding_up_the_others():
    waiting = [Waiting("pinned", "normal", pinned_to="a"), *backlog(2)]
    placements = place(waiting, [Engine("a", 1, 2), Engine("b", 1, 0)])
    assert [(p.job, p.engine) for p in placements] == [("normal-0", "b"), ("normal-1", "b")]


def test_no_engine_no_placement():
    assert place(backlog(3, "critical"), []) == []
