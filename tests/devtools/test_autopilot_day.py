"""The simulated day (the same planner the product runs, on a virtual clock): the autopilot,
with interruptible capacity outbid at 0.3 per hour, misses no deadline, loses and doubles no
proof, spends less than the autopilot on demand only, a fixed fleet sized for the peak and a
queue-threshold scaler, stays within every cap, and explains every action."""

import pytest

from devtools import autopilot_day as sim
from vastmgr.autopilot.planner import Action

URGENT = ("winning-post", "window-post")


# One seed here (each day goes through the Vast fake over HTTP, about a minute on this
# machine); `manage.py bench_autopilot` runs seeds 1-8.
RATE = 0.3  # outbids per interruptible instance and hour: the bench's highest


@pytest.fixture(scope="module")
def day():
    return sim.compare(7, preemption_rates=(RATE,))


def by_policy(day) -> dict:
    return {result.name.split(" of ")[0]: result for _, result in day["_runs"]}


def test_preempted_jobs_are_requeued_and_proved_once_with_no_deadline_missed(day):
    autopilot = by_policy(day)["autopilot"]
    assert autopilot.interruptible_rents > 0 and autopilot.preemptions > 0, \
        "the day met no preemption: the test proves nothing"
    assert autopilot.requeued > 0
    assert autopilot.duplicates == 0 and autopilot.proofs == day["jobs"]
    assert autopilot.met == autopilot.total, autopilot.to_json()


def test_interruptible_capacity_costs_less_than_on_demand_only(day):
    results = by_policy(day)
    assert results["autopilot"].dollars < results["autopilot on-demand only"].dollars


def test_no_post_deadline_is_missed(day):
    autopilot = by_policy(day)["autopilot"]
    for kind in URGENT:
        assert autopilot.met[kind] == autopilot.total[kind], (kind, autopilot.to_json())
    assert autopilot.proofs == day["jobs"]  # every proof of the day was done


def test_it_spends_less_than_both_baselines_and_no_less_than_the_bound(day):
    results = by_policy(day)
    autopilot = results["autopilot"].dollars
    assert autopilot < results["fixed fleet"].dollars
    assert autopilot < results["queue threshold"].dollars
    assert autopilot >= day["lower_bound_dollars"]


def test_it_never_exceeds_its_caps(day):
    autopilot = by_policy(day)["autopilot"]
    limits = sim.BID_LIMITS
    assert autopilot.peak_dollars_per_hour <= limits.max_dollars_per_hour
    assert autopilot.peak_hosts <= limits.max_hosts
    assert autopilot.max_rents_in_an_hour <= limits.max_rents_per_hour


def test_every_action_is_explained_with_reasons_and_numbers(day):
    actions = [d for _, d in by_policy(day)["autopilot"].decisions if d.action != Action.KEEP]
    assert actions
    for decision in actions:
        assert decision.summary and decision.reasons and decision.numbers, decision


def test_faults_of_the_market_were_met_and_handled(day):
    """Through the product's Vast client and the strict fake over HTTP: hosts that never boot
    (their instance stays loading) are destroyed after the pipeline plus margin and marked bad;
    hosts that bench below the minimum are destroyed, marked bad and never rented again; every
    rent is a create and every host that ended before the day did is a destroy of its
    instance."""
    [(run, result)] = [(run, result) for run, result in day["_runs"]
                       if result.name == "autopilot"]
    calls = [(c.method, c.path) for c in result.vast_calls]
    assert all(c.status == 200 for c in result.vast_calls), "a call to the fake failed"
    creates = [path for method, path in calls if path.startswith("/api/v0/asks/")]
    destroys = {path for method, path in calls if method == "DELETE"}
    assert len(creates) == len(run.hosts)
    assert destroys == {f"/api/v0/instances/{h.instance_id}/" for h in run.hosts.values()
                        if h.ended_at is not None and h.ended_at < run.now}
    assert not run.market.instances.keys() - {h.instance_id for h in run.hosts.values()
                                              if h.ended_at == run.now}
    assert ("POST", "/api/v0/bundles/") in calls and ("GET", "/api/v1/instances/") in calls
    never = [h for h in run.hosts.values() if h.machine.never_boots]
    slow = [h for h in run.hosts.values() if h.machine.true_rate < sim.MIN_BENCH_RATE]
    assert never or slow, "the day met no faulty host: the test proves nothing"
    for host in never:
        assert not host.booted and host.ready_at is None
        assert host.ended_at is not None and host.machine.offer.provider_machine_id in run.bad
    for host in slow:
        assert host.machine.offer.provider_machine_id in run.bad
    rented = [h.machine.offer.provider_machine_id for h in run.hosts.values()]
    for bad in run.bad:
        assert rented.count(bad) == 1, "a bad host was rented again"
