"""The planner's rules and hard limits, one by one, on hand-made snapshots (no Django)."""

from dataclasses import replace

import pytest

from devtools.autopilot_day import WORK, rates_from
from vastmgr.autopilot.planner import (
    Action,
    Host,
    KindWork,
    Limits,
    MachinePhase,
    Offer,
    PlannerInput,
    estimate_offer,
    plan,
)

LIMITS = Limits(max_dollars_per_hour=10.0, max_hosts=10, max_rents_per_hour=10,
                min_hosts={}, cooldown_s=300.0, pipeline_margin_s=600.0, idle_release_s=300.0,
                scale_to_zero=True)
PIPELINE_S = 600.0


def offer(offer_id: int, price: float, porep_per_h: float, *, machine: int | None = None,
          measured: bool = True) -> Offer:
    return Offer(offer_id, machine if machine is not None else offer_id + 1000, "RTX 4090", 1,
                 price, rates_from(porep_per_h), measured)


def host(machine_id: int, *, phase=MachinePhase.PROVING, price=0.3, rate=100.0, in_flight=0,
         age_s=3600.0, idle_s=0.0, managed=True) -> Host:
    return Host(machine_id, f"host-{machine_id}", phase, price, rates_from(rate), in_flight,
                age_s, idle_s, managed)


def porep(unfinished: int, oldest_s: float = 0.0, budget_s: float = 5400.0) -> KindWork:
    return KindWork("porep-c2", unfinished, oldest_s, budget_s)


def snapshot(work=(), hosts=(), offers=(), limits=LIMITS, **more) -> PlannerInput:
    return PlannerInput(more.pop("now_s", 10_000.0), tuple(work), tuple(hosts), tuple(offers),
                    limits, more.pop("pipeline_s", PIPELINE_S), **more)


def actions(result, action: Action) -> list:
    return [d for d in result.decisions if d.action == action]


MARKET = [offer(1, 0.30, 100), offer(2, 0.20, 100), offer(3, 1.00, 150), offer(4, 0.50, 100)]


def test_a_backlog_beyond_its_budget_rents_the_cheapest_per_proof_first_with_reasons():
    result = plan(snapshot([porep(400)], [host(1)], MARKET))
    rents = actions(result, Action.RENT)
    assert rents, result.decisions
    assert rents[0].offer_id == 2  # $0.002/proof beats $0.003 and $0.0067
    assert [d.offer_id for d in rents][:2] == [2, 1]
    assert "porep-c2: backlog 400" in rents[0].reasons[0]
    assert "est. $0.0020/proof (bench history" in rents[0].reasons[-1]
    assert rents[0].numbers["price_per_hour"] == 0.20
    # Enough was rented: with the new hosts nothing falls short.
    assert result.forecasts[0].kind == "porep-c2"


def test_no_backlog_within_budget_keeps_the_fleet():
    result = plan(snapshot([porep(10)], [host(1)], MARKET))
    assert [d.action for d in result.decisions] == [Action.KEEP]
    assert "porep-c2: 10 unfinished" in result.decisions[0].reasons[0]


def test_the_dollars_per_hour_cap_is_never_passed():
    limits = Limits(max_dollars_per_hour=1.0, max_hosts=10, max_rents_per_hour=10)
    result = plan(snapshot([porep(3000)], [host(1, price=0.3)], MARKET, limits))
    assert result.spend_after_per_hour <= 1.0
    # 0.3 + 0.2 + 0.3 fits; the next, 0.5 or 1.0, would not
    assert {d.offer_id for d in actions(result, Action.RENT)} == {1, 2}
    refused = actions(result, Action.KEEP)[-1]
    assert refused.summary.startswith("cannot rent more: no offer fits under the cap $1.00/h")


def test_max_hosts_is_never_passed():
    limits = Limits(max_dollars_per_hour=100.0, max_hosts=3, max_rents_per_hour=10)
    result = plan(snapshot([porep(3000)], [host(1)], MARKET, limits))
    assert len(actions(result, Action.RENT)) == 2
    assert result.hosts_after == 3
    assert "max 3 hosts reached" in actions(result, Action.KEEP)[-1].summary


def test_max_rents_per_hour_counts_the_rents_of_the_last_hour():
    limits = Limits(max_dollars_per_hour=100.0, max_hosts=10, max_rents_per_hour=3)
    result = plan(snapshot([porep(3000)], [host(1)], MARKET, limits, rents_last_hour=2))
    assert len(actions(result, Action.RENT)) == 1
    assert "max 3 rents per hour reached" in actions(result, Action.KEEP)[-1].summary


def test_a_bad_host_is_never_rented():
    result = plan(snapshot([porep(400)], [host(1)], MARKET, bad_machines=frozenset({1002})))
    rented = {d.offer_id for d in actions(result, Action.RENT)}
    assert rented and 2 not in rented


def test_cool_down_after_a_change_holds_rents_and_releases():
    busy = plan(snapshot([porep(400)], [host(1)], MARKET, last_change_s=9_900.0))
    assert not actions(busy, Action.RENT)
    assert "cool-down: last change 100 s ago < 300 s" in busy.decisions[-1].reasons[-1]
    idle = [host(1, idle_s=4000), host(2, idle_s=4000)]
    assert not actions(plan(snapshot([], idle, MARKET, last_change_s=9_900.0)),
                       Action.DESTROY)
    assert actions(plan(snapshot([], idle, MARKET, last_change_s=9_000.0)), Action.DESTROY)


def test_min_hosts_per_kind_keeps_a_warm_floor():
    limits = Limits(max_dollars_per_hour=10.0, max_hosts=10, max_rents_per_hour=10,
                    min_hosts={"winning-post": 1, "window-post": 2})
    rented = plan(snapshot([], [], MARKET, limits))
    assert len(actions(rented, Action.RENT)) == 2
    assert "below the minimum of 2 host(s)" in actions(rented, Action.RENT)[0].reasons[0]
    idle = [host(1, idle_s=9999), host(2, idle_s=9999), host(3, idle_s=9999)]
    released = plan(snapshot([], idle, MARKET, limits))
    assert len(actions(released, Action.DESTROY)) == 1
    assert released.hosts_after == 2


def test_scale_to_zero_only_when_allowed():
    idle = [host(1, idle_s=9999)]
    assert plan(snapshot([], idle, MARKET)).hosts_after == 0
    kept = plan(snapshot([], idle, MARKET, Limits(10.0, 10, 10, scale_to_zero=False)))
    assert kept.hosts_after == 1 and not actions(kept, Action.DESTROY)


def test_a_host_with_work_in_flight_is_drained_never_destroyed():
    hosts = [host(1, in_flight=1, price=0.9), host(2, in_flight=1, price=0.2)]
    result = plan(snapshot([porep(2)], hosts, MARKET))
    assert not actions(result, Action.DESTROY)
    drained = actions(result, Action.DRAIN)
    assert [d.machine_id for d in drained] == [1]  # the dearer per proof
    # While its work is in flight it stays draining; once done, it is destroyed.
    draining = host(1, phase=MachinePhase.DRAINING, in_flight=1)
    assert not actions(plan(snapshot([porep(2)], [draining, hosts[1]], MARKET)),
                       Action.DESTROY)
    done = host(1, phase=MachinePhase.DRAINING, in_flight=0)
    destroyed = actions(plan(snapshot([porep(1)], [done, hosts[1]], MARKET)), Action.DESTROY)
    assert [d.machine_id for d in destroyed] == [1] and not destroyed[0].scaling


def test_an_idle_host_is_kept_at_least_one_pipeline_time():
    young = [host(1, idle_s=500)]
    assert not actions(plan(snapshot([], young, MARKET, pipeline_s=900.0)), Action.DESTROY)
    assert actions(plan(snapshot([], young, MARKET, pipeline_s=400.0)), Action.DESTROY)


def test_a_host_not_proving_after_its_pipeline_and_margin_is_destroyed_and_marked_bad():
    starting = host(1, phase=MachinePhase.STARTING, age_s=PIPELINE_S + 599)
    assert not actions(plan(snapshot([], [starting], MARKET)), Action.DESTROY)
    stuck = host(1, phase=MachinePhase.STARTING, age_s=PIPELINE_S + 601)
    destroyed = actions(plan(snapshot([], [stuck], MARKET)), Action.DESTROY)
    assert len(destroyed) == 1 and destroyed[0].mark_bad
    assert "measured pipeline 10.0 min + margin 10 min" in destroyed[0].reasons[0]
    # An operator's own host is never touched.
    theirs = host(1, phase=MachinePhase.STARTING, age_s=99_999, managed=False)
    assert not actions(plan(snapshot([], [theirs], MARKET)), Action.DESTROY)


def test_a_draining_host_is_resumed_before_anything_is_rented():
    draining = host(1, phase=MachinePhase.DRAINING, in_flight=1)
    result = plan(snapshot([porep(150)], [draining], MARKET))
    assert result.decisions[0].action == Action.RESUME


def test_starting_hosts_count_so_a_backlog_is_not_rented_for_twice():
    first = plan(snapshot([porep(400)], [host(1)], MARKET))
    started = [host(-d.offer_id, phase=MachinePhase.STARTING, age_s=0, price=0.2)
               for d in actions(first, Action.RENT)]
    again = plan(snapshot([porep(400)], [host(1), *started], MARKET))
    assert not actions(again, Action.RENT)


def test_a_kind_no_rent_can_save_in_time_is_left_to_the_floor():
    winning = KindWork("winning-post", 1, 0.0, 30.0)
    assert not actions(plan(snapshot([winning], [], MARKET)), Action.RENT)


def test_offers_are_estimated_from_bench_history_else_the_gate_minimum():
    bare = Offer(7, 70, "RTX 4090", 2, 0.6, {}, False)
    known = estimate_offer(bare, [120.0, 140.0, 150.0], bench_kind="porep-c2",
                           min_bench_rate=50.0, work=WORK)
    assert known is not None and known.measured and known.rates["porep-c2"] == 280.0
    assert known.rates["window-post"] == 280.0 / WORK["window-post"]
    unknown = estimate_offer(bare, [], bench_kind="porep-c2", min_bench_rate=50.0, work=WORK)
    assert unknown is not None and not unknown.measured and unknown.rates["porep-c2"] == 50.0
    slow = estimate_offer(bare, [20.0], bench_kind="porep-c2", min_bench_rate=50.0, work=WORK)
    assert slow is None  # 2 × 20 < 50: the gate would destroy it


def test_a_measured_model_is_preferred_to_an_unknown_cheaper_one():
    market = [offer(1, 0.05, 60, measured=False), offer(2, 0.30, 100)]
    rents = actions(plan(snapshot([porep(400)], [host(9)], market)), Action.RENT)
    assert rents[0].offer_id == 2


def test_decisions_round_trip_through_json():
    result = plan(snapshot([porep(400)], [host(1)], MARKET))
    from vastmgr.autopilot.planner import Decision
    for decision in result.decisions:
        assert Decision.from_json(decision.to_json()) == decision


def test_an_idle_dear_floor_host_is_replaced_by_a_cheaper_one_before_it_goes():
    limits = Limits(10.0, 10, 10, min_hosts={"winning-post": 1})
    dear = host(1, price=0.9, idle_s=9999)
    swap = actions(plan(snapshot([], [dear], MARKET, limits)), Action.RENT)
    assert [d.offer_id for d in swap] == [2]  # the cheapest per hour, ≤ half of $0.9
    assert "released once the new host proves" in swap[0].reasons[-1]
    # While the replacement starts, the warm host stays; once it proves, the dear one goes.
    new = host(2, phase=MachinePhase.STARTING, age_s=60, price=0.2)
    assert not actions(plan(snapshot([], [dear, new], MARKET, limits)), Action.DESTROY)
    proving = host(2, price=0.2, idle_s=9999)
    gone = actions(plan(snapshot([], [dear, proving], MARKET, limits)), Action.DESTROY)
    assert [d.machine_id for d in gone] == [1]
    # Not worth it for a host that is not twice as dear.
    assert not actions(plan(snapshot([], [host(1, price=0.35, idle_s=9999)], MARKET, limits)),
                       Action.RENT)


# ---------------------------------------------------------------- interruptible capacity (36)

BIDS = replace(LIMITS, interruptible=True, max_bid_share=0.7)


def bid_offer(offer_id: int, bid: float, porep_per_h: float, on_demand: float) -> Offer:
    return replace(offer(offer_id, bid, porep_per_h), interruptible=True,
                   on_demand_price=on_demand, bid=bid)


def bid_host(machine_id: int, **more) -> Host:
    return replace(host(machine_id, **more), interruptible=True, bid=more.get("price", 0.3),
                   on_demand_price=0.6)


def test_porep_with_slack_goes_to_a_bid_and_the_plan_says_why():
    market = [offer(1, 0.30, 100), bid_offer(1, 0.12, 100, on_demand=0.30)]
    result = plan(snapshot([porep(400)], [host(9)], market, limits=BIDS))
    rents = actions(result, Action.RENT)
    assert rents and rents[0].bid == 0.12, result.decisions
    assert "interruptible" in rents[0].summary
    assert any("slack for a preemption and a re-rent" in r for r in rents[0].reasons)
    assert rents[0].numbers["interruptible"] == 1
    # The same backlog with bids off rents on demand.
    on_demand = actions(plan(snapshot([porep(400)], [host(9)], market)), Action.RENT)
    assert on_demand and on_demand[0].bid is None


def test_post_is_never_served_by_a_bid():
    """A window-post backlog with only a bid host proving: the bid host does not count for
    it, so the planner rents on demand even though a bid is cheaper."""
    window = KindWork("window-post", 40, 300.0, 1500.0)
    market = [offer(1, 0.30, 100), bid_offer(2, 0.05, 100, on_demand=0.30)]
    result = plan(snapshot([window], [bid_host(7, rate=1000)], market, limits=BIDS,
                           pipeline_s=300.0))
    rents = actions(result, Action.RENT)
    assert rents and all(d.bid is None for d in rents), result.decisions
    assert any("capacity Vast cannot take away" in r for r in rents[0].reasons)


def test_porep_whose_slack_no_longer_covers_a_preemption_goes_on_demand():
    late = porep(200, oldest_s=5400 - 800)  # 13 min left, 11 min usable; a re-rent takes 12
    market = [offer(1, 0.30, 100), bid_offer(2, 0.05, 100, on_demand=0.30)]
    result = plan(snapshot([late], [], market, limits=BIDS))
    rents = actions(result, Action.RENT)
    assert rents and all(d.bid is None for d in rents), result.decisions


def test_a_bid_above_the_cap_is_not_placed():
    market = [offer(1, 0.30, 100), bid_offer(2, 0.25, 100, on_demand=0.30)]  # 0.25 > 0.7×0.30
    rents = actions(plan(snapshot([porep(400)], [host(9)], market, limits=BIDS)), Action.RENT)
    assert rents and all(d.offer_id == 1 and d.bid is None for d in rents)


def outbid(competitor: float, **more) -> Host:
    return replace(bid_host(5, price=0.2), phase=MachinePhase.OUTBID, competitor_bid=competitor,
                   outbid_s=more.pop("outbid_s", 60.0), **more)


def test_an_outbid_host_gets_a_higher_bid_within_the_cap():
    result = plan(snapshot([porep(50)], [host(9), outbid(0.3)], limits=BIDS))
    [raised] = actions(result, Action.BID)
    assert raised.machine_id == 5 and raised.bid == pytest.approx(0.33)  # 1.1× the competitor
    assert "within the cap of $0.420/h" in raised.reasons[1]


def test_an_outbid_host_beyond_the_cap_is_replaced_when_its_capacity_is_needed():
    result = plan(snapshot([porep(400)], [host(9), outbid(0.5)], [offer(1, 0.3, 100)],
                           limits=BIDS))
    [gone] = actions(result, Action.DESTROY)
    assert gone.machine_id == 5 and "rent elsewhere" in gone.summary
    assert "would exceed the cap" in gone.reasons[0]
    assert actions(result, Action.RENT)  # its capacity, from elsewhere


def test_an_outbid_host_beyond_the_cap_waits_while_nothing_is_missed_then_goes():
    waiting = plan(snapshot([porep(0)], [host(9), outbid(0.5)], limits=BIDS))
    assert not actions(waiting, Action.DESTROY)
    assert any(d.summary.startswith("wait for host-5") for d in waiting.decisions)
    later = plan(snapshot([porep(0)], [host(9), outbid(0.5, outbid_s=3600.0)], limits=BIDS))
    assert [d.machine_id for d in actions(later, Action.DESTROY)] == [5]


def test_the_floor_is_the_cheapest_trusted_host_when_bids_are_on():
    limits = replace(BIDS, min_hosts={"window-post": 1}, scale_to_zero=False)
    market = [offer(1, 0.40, 200), offer(2, 0.15, 60), bid_offer(3, 0.05, 200, on_demand=0.4)]
    [rent] = actions(plan(snapshot([], [], market, limits=limits)), Action.RENT)
    assert rent.offer_id == 2 and rent.bid is None
