"""Lifecycle automation with a controlled clock: timeouts, the bad-host flow, idle destroy,
offline and failed-job alerts through a webhook."""

from datetime import timedelta

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import Automation
from vastmgr.remote.models import BadMachine, MachinePerf
from vastmgr.remote.vast import OfferFilter, RentRequest, VastClient

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)

PATH = ["provisioning", "params_ready", "benchmarked", "running"]


class Clock:
    def __init__(self):
        self.start = timezone.now()
        self.offset = timedelta()

    def __call__(self):
        return self.start + self.offset

    def advance(self, **delta):
        self.offset += timedelta(**delta)


def walk(machine, until):
    for state in PATH[:PATH.index(until) + 1]:
        machine.transition(state)


class Received(list):
    url = ""


@pytest.fixture
async def webhook():
    received = Received()

    async def hook(request):
        received.append(await request.json())
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    received.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
    yield received
    await runner.cleanup()


def settings(**overrides):
    return RemoteSettings(**{"min_bench_rate": 50.0, **overrides})


async def test_a_rented_machine_stuck_in_registered_is_destroyed_at_its_timeout(
        fake_vast, no_sleep):
    client = VastClient(API_KEY, fake_vast.url, sleep=no_sleep)
    machine = await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer()))
    clock = Clock()
    automation = Automation(settings(), now=clock, vast_client=client)

    clock.advance(minutes=29)
    await automation.tick()
    assert (await Machine.objects.aget(pk=machine.pk)).state == Machine.State.REGISTERED

    clock.advance(minutes=2)
    await automation.tick()
    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED
    assert machine.kill_reason.startswith("timed out in registered after 31 min")
    assert machine.vast_instance_id not in fake_vast.instances


async def test_timeouts_follow_the_state_and_spare_an_operators_ssh_host():
    ssh = await Machine.objects.acreate(name="ssh-1", host="127.0.0.1")
    busy = await Machine.objects.acreate(name="ssh-2", host="127.0.0.2")
    await sync_to_async(walk)(busy, "provisioning")
    clock = Clock()
    automation = Automation(settings(state_timeouts_min={"registered": 30, "provisioning": 90}),
                            now=clock)

    clock.advance(minutes=91)
    await automation.tick()

    assert (await Machine.objects.aget(pk=ssh.pk)).state == Machine.State.REGISTERED
    busy = await Machine.objects.aget(pk=busy.pk)
    assert busy.state == Machine.State.KILLED and "provisioning" in busy.kill_reason


async def test_a_slow_benchmark_destroys_the_host_and_flags_it_in_offers(
        fake_vast, no_sleep, webhook):
    client = VastClient(API_KEY, fake_vast.url, sleep=no_sleep)
    offer = fake_vast.add_offer(machine_id=31, gpu_name="RTX 3090")
    machine = await vast.rent(client, RentRequest.from_offer(offer))
    await sync_to_async(walk)(machine, "params_ready")
    automation = Automation(settings(alert_webhook_url=webhook.url), vast_client=client)

    assert await automation.benchmark_done(machine.pk, 12.5) is False

    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED and machine.bench_rate == 12.5
    assert "below the minimum 50" in machine.kill_reason
    assert machine.vast_instance_id not in fake_vast.instances
    bad = await BadMachine.objects.aget(provider_machine_id=31)
    assert "12.5" in bad.reason
    assert [h["kind"] for h in webhook] == ["bad_benchmark"]
    # The same host offered again is flagged, and renting it is refused.
    again = fake_vast.add_offer(machine_id=31, gpu_name="RTX 3090")
    offers = await sync_to_async(vast.annotate_offers)(
        await client.search_offers(OfferFilter()))
    assert next(o for o in offers if o["id"] == again["id"])["bad_host"]


async def test_a_good_benchmark_passes_the_gate_and_feeds_the_estimate(fake_vast, no_sleep):
    client = VastClient(API_KEY, fake_vast.url, sleep=no_sleep)
    machine = await vast.rent(client, RentRequest.from_offer(
        fake_vast.add_offer(machine_id=32, gpu_name="RTX 4090", num_gpus=1)))
    await sync_to_async(walk)(machine, "params_ready")

    assert await Automation(settings(), vast_client=client).benchmark_done(machine.pk, 80.0)

    assert (await Machine.objects.aget(pk=machine.pk)).state == Machine.State.BENCHMARKED
    perf = await MachinePerf.objects.aget(provider_machine_id=32)
    assert perf.proofs_per_hour == 80.0


async def test_an_idle_machine_is_destroyed_only_after_n_quiet_minutes():
    machine = await Machine.objects.acreate(name="ssh-idle", host="127.0.0.3")
    await sync_to_async(walk)(machine, "running")
    job = await ProofJob.objects.acreate(machine=machine, kind="winning-post", seed=1,
                                         status=ProofJob.Status.RUNNING)
    clock = Clock()
    automation = Automation(settings(auto_destroy_idle_min=10), now=clock)

    clock.advance(minutes=30)
    await automation.tick()
    assert (await Machine.objects.aget(pk=machine.pk)).state == Machine.State.RUNNING

    await ProofJob.objects.filter(pk=job.pk).aupdate(status=ProofJob.Status.DONE,
                                                     finished_at=clock())
    clock.advance(minutes=9)
    await automation.tick()
    assert (await Machine.objects.aget(pk=machine.pk)).state == Machine.State.RUNNING
    clock.advance(minutes=2)
    await automation.tick()
    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED and "idle for 10 min" in machine.kill_reason


async def test_offline_and_failed_job_alerts_reach_the_webhook_once(webhook):
    machine = await Machine.objects.acreate(name="ssh-off", host="127.0.0.4")
    await sync_to_async(walk)(machine, "running")
    clock = Clock()
    await sync_to_async(machine.mark_seen)(clock())
    automation = Automation(settings(alert_webhook_url=webhook.url, offline_alert_min=5),
                            now=clock)

    clock.advance(minutes=4)
    await automation.tick()
    assert webhook == []
    clock.advance(minutes=2)
    await ProofJob.objects.acreate(machine=machine, kind="porep-c2", seed=2,
                                   status=ProofJob.Status.FAILED, finished_at=clock(),
                                   error="verification failed")
    await automation.tick()
    clock.advance(minutes=5)
    await automation.tick()

    assert sorted(h["kind"] for h in webhook) == ["host_offline", "job_failed"]
    offline = next(h for h in webhook if h["kind"] == "host_offline")
    assert offline["machine_id"] == machine.pk and "offline for 6 min" in offline["message"]
    assert await Event.objects.filter(kind="alert").acount() == 2

    # Seen again, then silent again: a new spell, a new alert.
    await sync_to_async(machine.mark_seen)(clock())
    await automation.tick()
    clock.advance(minutes=6)
    await automation.tick()
    assert [h["kind"] for h in webhook].count("host_offline") == 2


async def test_a_failing_webhook_is_an_error_event_not_a_crash(webhook):
    machine = await Machine.objects.acreate(name="ssh-hook", host="127.0.0.5")
    await sync_to_async(walk)(machine, "running")
    clock = Clock()
    automation = Automation(settings(alert_webhook_url=webhook.url + "-missing",
                                     offline_alert_min=1), now=clock)
    clock.advance(minutes=2)
    await automation.tick()
    failure = await Event.objects.filter(kind="alert", level="error").aget()
    assert "webhook failed (404)" in failure.message and "hook-missing" not in failure.message
