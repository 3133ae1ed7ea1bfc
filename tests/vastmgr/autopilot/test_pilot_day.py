"""A burst through the product's own loop, acting alone: the pilot on the database and the
strict Vast fake, with a virtual clock. It rents within its caps for a porep-c2 backlog, the
hosts come up and do the work, and once they have been idle it releases every one (scale to
zero). Every action it took is an Event with its reasons and numbers."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async

from vastmgr.autopilot.models import Autopilot, ManagedMachine
from vastmgr.autopilot.pilot import Pilot
from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.models import MachinePerf

from .conftest import Clock

pytestmark = pytest.mark.django_db(transaction=True)

BURST = 300


def _setup(fake_vast, now):
    MachinePerf.record(provider_machine_id=1, gpu_name="RTX 4090", gpu_count=1, rate=140.0)
    for price in (0.30, 0.33, 0.36, 0.40, 0.45):
        fake_vast.add_offer(gpu_name="RTX 4090", dph_base=price, storage_cost=0.1)
    fake_vast.add_offer(gpu_name="H100 SXM", dph_base=2.10, storage_cost=0.1)
    pilot = Autopilot.current()
    pilot.mode, pilot.max_dollars_per_hour, pilot.max_hosts = Autopilot.Mode.ACT, 1.2, 4
    pilot.save()
    ProofJob.objects.bulk_create([ProofJob(kind="porep-c2", seed=i, submitted_at=now)
                                  for i in range(BURST)])


def _hosts_come_up_and_prove(now):
    machines = list(Machine.objects.filter(autopilot__isnull=False))
    for machine in machines:
        for state in ("provisioning", "params_ready", "benchmarked", "running"):
            machine.transition(state)
    for i, job in enumerate(ProofJob.objects.all()):
        job.machine = machines[i % len(machines)]
        job.status, job.started_at, job.finished_at = ProofJob.Status.DONE, now, now
        job.save()


async def test_a_burst_rents_within_the_caps_and_every_host_is_released_after(
        client, fake_vast):
    clock = Clock()
    await sync_to_async(_setup)(fake_vast, clock.at)
    pilot = Pilot(client, now=clock)

    plan = await pilot.tick()
    rented = len(fake_vast.instances)
    assert rented >= 2, plan.to_json()
    assert plan.spend_after_per_hour <= 1.2 and plan.hosts_after <= 4
    assert all(i["gpu_name"] == "RTX 4090" for i in fake_vast.instances.values())
    assert await ManagedMachine.objects.acount() == rented

    clock.at += timedelta(minutes=8)
    await sync_to_async(_hosts_come_up_and_prove)(clock.at)
    clock.at += timedelta(minutes=20)
    plan = await pilot.tick()
    assert not fake_vast.instances, plan.to_json()  # scale to zero
    assert await Machine.objects.filter(autopilot__isnull=False).exclude(
        state=Machine.State.KILLED).acount() == 0

    acted = await sync_to_async(list)(Event.objects.filter(kind="autopilot",
                                                           message__contains=" did: "))
    assert len(acted) == 2 * rented  # each rent and each destroy
    for event in acted:
        decision = event.data["decision"]
        assert event.data["ok"] and decision["reasons"] and decision["numbers"], event.message
        assert "acting alone" in event.message
