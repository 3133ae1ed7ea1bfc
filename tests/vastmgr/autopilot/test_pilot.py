"""The autopilot in the product: database state, the strict Vast fake, an injected clock.
Dry run proposes and a person approves; acting alone carries out; the off switch; the lease;
lost create answers; hosts that never come up; work in flight; caps checked when carried out."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.utils import timezone

from vastmgr.autopilot.models import Autopilot, ManagedMachine, Proposal
from vastmgr.autopilot.pilot import LEASE_S, Pilot, approve
from vastmgr.autopilot.planner import Action, Decision
from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.models import BadMachine, MachinePerf

from .conftest import Clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def market(fake_vast):
    """Three offers; the 4090s have bench history (MachinePerf), the 3090 none."""
    MachinePerf.record(provider_machine_id=1, gpu_name="RTX 4090", gpu_count=1, rate=140.0)
    return [fake_vast.add_offer(gpu_name="RTX 4090", dph_base=0.30, storage_cost=0.1),
            fake_vast.add_offer(gpu_name="RTX 4090", dph_base=0.45, storage_cost=0.1),
            fake_vast.add_offer(gpu_name="RTX 3090", dph_base=0.15, storage_cost=0.1)]


@pytest.fixture
def floor_of_one():
    pilot = Autopilot.current()
    pilot.min_hosts = {"winning-post": 1}
    pilot.save()
    return pilot


@pytest.fixture
def admin():
    return get_user_model().objects.create_user("ops", is_staff=True)


def creates(fake_vast) -> int:
    return sum(1 for method, path, *_ in fake_vast.requests
               if method == "PUT" and path.startswith("/api/v0/asks/"))


def autopilot_events() -> list[Event]:
    return list(Event.objects.filter(kind="autopilot").order_by("id"))


async def test_dry_run_is_the_default_and_proposes_with_reasons_without_renting(
        client, fake_vast, market, floor_of_one):
    assert (await sync_to_async(Autopilot.current)()).mode == Autopilot.Mode.DRY_RUN
    plan = await Pilot(client).tick()
    assert plan is not None and [d.action for d in plan.changes] == [Action.RENT]
    proposals = await sync_to_async(list)(Proposal.objects.all())
    assert [p.status for p in proposals] == [Proposal.Status.PROPOSED]
    assert proposals[0].decision["offer_id"] == market[0]["id"]  # measured and cheapest
    events = await sync_to_async(autopilot_events)()
    assert len(events) == 1 and "autopilot proposes: rent 1× RTX 4090" in events[0].message
    assert "below the minimum of 1 host(s)" in events[0].message
    assert events[0].data["decision"]["numbers"]["price_per_hour"] > 0
    assert creates(fake_vast) == 0 and not fake_vast.instances
    # The same plan again proposes nothing new.
    await Pilot(client).tick()
    assert await Proposal.objects.acount() == 1
    assert len(await sync_to_async(autopilot_events)()) == 1


async def test_one_click_approval_rents_through_the_label_rule(
        client, fake_vast, market, floor_of_one, admin):
    await Pilot(client).tick()
    proposal = await Proposal.objects.aget()
    done = await approve(proposal.pk, admin, client)
    assert done is not None and done.status == Proposal.Status.DONE, done.outcome
    [instance] = fake_vast.instances.values()
    assert instance["label"].startswith("vastmgr-")
    managed = await ManagedMachine.objects.select_related("machine").aget()
    assert managed.machine.vast_instance_id == instance["id"]
    assert managed.offer_id == market[0]["id"]
    last = (await sync_to_async(autopilot_events)())[-1]
    assert "autopilot did: rent 1× RTX 4090" in last.message and "approved by ops" in last.message
    # A second click on the same proposal does nothing.
    assert await approve(proposal.pk, admin, client) is None
    assert creates(fake_vast) == 1


async def test_a_lost_create_answer_is_adopted_by_label_never_retried(
        client, fake_vast, market, floor_of_one, admin):
    await Pilot(client).tick()
    fake_vast.lose_next_create("504")
    done = await approve((await Proposal.objects.aget()).pk, admin, client)
    assert done is not None and done.status == Proposal.Status.DONE, done.outcome
    assert creates(fake_vast) == 1 and len(fake_vast.instances) == 1
    assert await ManagedMachine.objects.acount() == 1


async def test_acting_alone_rents_and_every_action_is_an_explained_event(
        client, fake_vast, market, floor_of_one):
    await sync_to_async(floor_of_one.set_mode)(Autopilot.Mode.ACT)
    await Pilot(client).tick()
    assert len(fake_vast.instances) == 1
    acted = [e for e in await sync_to_async(autopilot_events)() if "did:" in e.message]
    assert len(acted) == 1 and "acting alone" in acted[0].message
    assert acted[0].data["decision"]["reasons"] and acted[0].data["ok"]
    # The cool-down (in the database, so a restarted process keeps it) holds the next rent.
    pilot = await sync_to_async(Autopilot.current)()
    assert pilot.last_change_at is not None


async def test_the_off_switch_stops_planning_and_withdraws_proposals(
        client, fake_vast, market, floor_of_one, admin):
    await Pilot(client).tick()
    await sync_to_async(floor_of_one.set_mode)(Autopilot.Mode.OFF, admin)
    assert await Proposal.objects.filter(status=Proposal.Status.PROPOSED).acount() == 0
    assert await Pilot(client).tick() is None
    assert await Proposal.objects.filter(status=Proposal.Status.PROPOSED).acount() == 0
    proposal = await Proposal.objects.aget()
    assert await approve(proposal.pk, admin, client) is None
    assert not fake_vast.instances
    switched = (await sync_to_async(autopilot_events)())[-1]
    assert "switched from Dry run" in switched.message and switched.data["by"] == "ops"


async def test_only_the_lease_holder_plans_and_a_lapsed_lease_passes_on(
        client, market, floor_of_one):
    clock = Clock()
    first, second = Pilot(client, owner="a", now=clock), Pilot(client, owner="b", now=clock)
    assert await first.tick() is not None
    assert await second.tick() is None
    clock.at += timedelta(seconds=LEASE_S + 1)
    assert await second.tick() is not None
    assert await first.tick() is None


def _managed(fake_vast, *, state=Machine.State.RUNNING, rented_ago=timedelta(hours=2)):
    instance_id = fake_vast.add_instance(label="vastmgr-test")
    machine = Machine.objects.create(name=f"vast-{instance_id}", provider=Machine.Provider.VAST,
                                     vast_instance_id=instance_id, vast_machine_id=777,
                                     price_per_hour=0.4, gpu_name="RTX 4090", gpu_count=1)
    for step in ("provisioning", "params_ready", "benchmarked", "running"):
        if machine.state == state:
            break
        machine.transition(step)
    ManagedMachine.objects.create(machine=machine, offer_id=1,
                               rented_at=timezone.now() - rented_ago)
    return machine, instance_id


async def test_a_host_with_work_in_flight_is_drained_not_destroyed(client, fake_vast):
    machine, instance_id = await sync_to_async(_managed)(fake_vast)
    await ProofJob.objects.acreate(kind="porep-c2", seed=1, machine=machine,
                                   status=ProofJob.Status.RUNNING)
    destroy = Decision(Action.DESTROY, f"destroy {machine.name}: idle and not needed",
                       ("idle",), {}, machine_id=machine.pk)
    ok, outcome = await Pilot(client).carry_out(destroy, by=None)
    assert ok and "drained instead" in outcome
    assert instance_id in fake_vast.instances
    assert (await ManagedMachine.objects.aget(machine=machine)).draining
    await ProofJob.objects.filter(machine=machine).aupdate(status=ProofJob.Status.DONE)
    ok, outcome = await Pilot(client).carry_out(destroy, by=None)
    assert ok and outcome == "destroyed" and instance_id not in fake_vast.instances
    assert (await Machine.objects.aget(pk=machine.pk)).state == Machine.State.KILLED


async def test_a_host_that_never_comes_up_is_destroyed_and_its_machine_marked_bad(
        client, fake_vast):
    _, instance_id = await sync_to_async(_managed)(
        fake_vast, state=Machine.State.REGISTERED, rented_ago=timedelta(hours=2))
    await sync_to_async(lambda: Autopilot.current().set_mode(Autopilot.Mode.ACT))()
    await Pilot(client).tick()
    assert instance_id not in fake_vast.instances
    assert await BadMachine.objects.filter(provider_machine_id=777).aexists()
    explained = [e for e in await sync_to_async(autopilot_events)() if "did:" in e.message]
    assert "not proving after 120 min" in explained[0].message
    assert "measured pipeline 15.0 min + margin 10 min" in explained[0].message


async def test_caps_are_checked_again_when_a_proposal_is_approved(
        client, fake_vast, market, floor_of_one, admin):
    await Pilot(client).tick()
    floor_of_one.max_dollars_per_hour = 0.1
    await sync_to_async(floor_of_one.save)()
    done = await approve((await Proposal.objects.aget()).pk, admin, client)
    assert done is not None and done.status == Proposal.Status.FAILED
    assert "would pass the cap $0.10/h" in done.outcome
    assert creates(fake_vast) == 0


async def test_the_cool_down_survives_a_restart_of_the_process(
        client, fake_vast, market, floor_of_one):
    await sync_to_async(floor_of_one.set_mode)(Autopilot.Mode.ACT)
    clock = Clock()
    await Pilot(client, owner="before", now=clock).tick()
    assert len(fake_vast.instances) == 1
    await Autopilot.objects.filter(pk=1).aupdate(min_hosts={"winning-post": 3})
    await sync_to_async(Autopilot.release)("before")
    clock.at += timedelta(minutes=1)
    restarted = Pilot(client, owner="after", now=clock)  # a new process: nothing in memory
    plan = await restarted.tick()
    assert plan is not None and not plan.changes
    assert "cool-down: last change 60 s ago < 300 s" in plan.decisions[-1].reasons[-1]
    clock.at += timedelta(minutes=5)
    assert [d.action for d in (await restarted.tick()).changes] == [Action.RENT] * 2
