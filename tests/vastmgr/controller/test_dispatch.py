"""Dispatch end to end: the Django view queues a proof, the controller sends it to a real
engine (tiny profile), and the result lands in the row, re-verified by the dashboard."""

import asyncio
import signal

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from tests.vastmgr import live_engine
from tests.vastmgr.live_engine import running_controller, wait_until
from vastmgr.fleet.models import Event, Machine, MachineStatus
from vastmgr.proofs import jobs
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db(transaction=True)
engine, param_cache = live_engine.engine, live_engine.param_cache


def logged_in_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user("op", password="pw-for-tests-1"))
    return client


@database_sync_to_async
def post_form(client: Client, **fields):
    return client.post("/proofs/new/", {"count": 1, "profile": "tiny", "priority": "", **fields})


@database_sync_to_async
def job_row(job_id=None) -> ProofJob:
    return ProofJob.objects.get(pk=job_id) if job_id else ProofJob.objects.get()


async def final(job_id, timeout=90):
    async def done():
        job = await job_row(job_id)
        return job if job.is_final else None
    return await wait_until(done, timeout=timeout, every=0.25)


@database_sync_to_async
def local_machine(port: int) -> Machine:
    """The local engine's machine, running as `run_engine` registers it."""
    return Machine.objects.create(name="local", provider="local", host="127.0.0.1",
                                  engine_port=port, state=Machine.State.RUNNING)


def shown_live(machine):
    """What the pages see: the controller has written the host's live status."""
    return database_sync_to_async(
        lambda: MachineStatus.objects.filter(machine=machine, connected=True,
                                          machine__last_seen__isnull=False).exists())


async def test_test_proof_from_the_view_ends_done_and_verified(engine):
    machine = await local_machine(engine.port)
    client = await database_sync_to_async(logged_in_client)()
    async with running_controller():
        await wait_until(shown_live(machine))
        response = await post_form(client, machine=machine.pk, kind="winning-post", seed=42)
        assert response.status_code == 302
        job = await job_row()
        assert response["Location"] == f"/proofs/{job.pk}/"
        job = await final(job.pk)
    assert job.status == ProofJob.Status.DONE, job.error
    assert job.verified is True and job.engine_verified is True
    assert len(bytes(job.proof)) == 192 and job.vk and job.public_inputs
    assert job.machine_id == machine.pk and job.engine_job_id == str(job.pk)
    assert job.timings["total_ms"] > 0
    assert [p["state"] for p in job.progress["partitions"]] == ["done"]
    # Exactly one proof on the engine: nothing counted twice.
    assert engine.status()["counters"]["total_completed"] == 1
    page = await database_sync_to_async(client.get)(f"/proofs/{job.pk}/")
    assert b"verified" in page.content and b"proof.bin" in page.content
    download = await database_sync_to_async(client.get)(f"/proofs/{job.pk}/proof.bin")
    assert download.content == bytes(job.proof)


async def test_engine_killed_mid_job_requeues_and_finishes_after_it_is_back(engine):
    machine = await local_machine(engine.port)
    async with running_controller(grace=1.0) as controller:
        await wait_until(lambda: machine.pk in controller.hosts
                         and controller.hosts[machine.pk].live.connected)
        job = await database_sync_to_async(ProofJob.objects.create)(
            kind="porep-c2", profile="tiny", seed=5, priority="normal")
        await wait_until(lambda: any(p.get("request_id") == str(job.pk) and p["status"] == "running"
                                     for p in engine.status()["pipelines"]), timeout=60)
        engine.kill()
        requeued = await wait_until(database_sync_to_async(
            lambda: Event.objects.filter(message__contains=f"{job.pk} re-queued").exists()),
            timeout=30)
        assert requeued
        assert (await job_row(job.pk)).status == ProofJob.Status.QUEUED
        engine.start()
        job = await final(job.pk, timeout=180)
    assert job.status == ProofJob.Status.DONE, job.error
    assert job.verified is True and len(bytes(job.proof)) == 10 * 192
    assert engine.status()["counters"]["total_completed"] == 1


async def test_an_outbid_machine_takes_no_new_work_while_its_engine_still_answers(engine):
    """Vast said outbid (a webhook is quicker than the engine's link noticing it is gone):
    the jobs just re-queued from it must not go back to it."""
    from vastmgr.remote.models import RemoteMachine

    machine = await local_machine(engine.port)
    remote = await database_sync_to_async(RemoteMachine.objects.create)(
        machine=machine, vast_status="outbid")
    async with running_controller() as controller:
        await wait_until(lambda: machine.pk in controller.hosts
                         and controller.hosts[machine.pk].live.connected)
        job = await database_sync_to_async(ProofJob.objects.create)(
            kind="winning-post", profile="tiny", seed=7, priority="normal")
        await controller.dispatcher.dispatch()
        assert (await job_row(job.pk)).status == ProofJob.Status.QUEUED
        remote.vast_status = "running"  # its bid raised: it runs again
        await database_sync_to_async(remote.save)(update_fields=["vast_status"])
        job = await final(job.pk)
    assert (job.status, job.machine_id) == (ProofJob.Status.DONE, machine.pk)


async def test_a_pinned_job_waits_out_an_outage_longer_than_the_grace(engine):
    """An engine that stops answering (frozen, as behind a partition) past the grace keeps the
    job pinned to it: not re-queued (it could only wait for the same machine, shown queued
    while the engine still holds it); its result is collected once the engine answers again."""
    machine = await local_machine(engine.port)
    async with running_controller(grace=1.0) as controller:
        await wait_until(lambda: machine.pk in controller.hosts
                         and controller.hosts[machine.pk].live.connected)
        job = await database_sync_to_async(ProofJob.objects.create)(
            kind="porep-c2", profile="tiny", seed=6, priority="normal", machine=machine,
            pinned=True)
        await wait_until(lambda: any(p.get("request_id") == str(job.pk) and p["status"] == "running"
                                     for p in engine.status()["pipelines"]), timeout=60)
        engine.proc.send_signal(signal.SIGSTOP)
        try:
            live = controller.hosts[machine.pk].live
            await wait_until(lambda: live.down_since is not None
                             and controller.clock() - live.down_since > 3 * controller.grace,
                             timeout=60)
            assert (await job_row(job.pk)).status in ProofJob.IN_FLIGHT
        finally:
            engine.proc.send_signal(signal.SIGCONT)
        job = await final(job.pk, timeout=180)
    assert job.status == ProofJob.Status.DONE and job.verified is True, job.error
    assert not await database_sync_to_async(
        Event.objects.filter(message__contains="re-queued").exists)()
    assert engine.status()["counters"]["total_completed"] == 1


async def test_engine_stopped_gracefully_loses_nothing(engine):
    """SIGTERM drains the engine: the running job finishes and its result is collected; the
    queued ones it cancels go back to the queue (with an Event) and finish on the next engine."""
    machine = await local_machine(engine.port)
    async with running_controller() as controller:
        await wait_until(lambda: machine.pk in controller.hosts
                         and controller.hosts[machine.pk].live.connected)
        proof_jobs = [await database_sync_to_async(ProofJob.objects.create)(
            kind="porep-c2", profile="tiny", seed=seed, priority="normal") for seed in (21, 22, 23)]
        ids = {str(job.pk) for job in proof_jobs}

        def on_engine():
            pipelines = [p for p in engine.status()["pipelines"] if p.get("request_id") in ids]
            return (len(pipelines) == 3 and any(p["status"] == "running" for p in pipelines)
                    and any(p["status"] == "queued" for p in pipelines))

        await wait_until(on_engine, timeout=60)
        engine.proc.terminate()
        assert await asyncio.to_thread(engine.proc.wait, 60) == 0
        # The engine lingered until every outcome was fetched; the controller records them.
        rows = await wait_until(settled_rows(proof_jobs), timeout=10)
        assert {row.status for row in rows} <= {ProofJob.Status.DONE, ProofJob.Status.QUEUED}
        assert any(row.status == ProofJob.Status.DONE for row in rows), \
            "the job that finished during the drain was not collected"
        requeued = [row for row in rows if row.status == ProofJob.Status.QUEUED]
        assert requeued
        for row in requeued:  # each told once: a second Event would reach every channel too
            assert await database_sync_to_async(Event.objects.filter(
                message__contains=f"{row.pk} re-queued", level=Event.Level.WARNING).count)() == 1
        engine.start()
        rows = [await final(job.pk, timeout=180) for job in proof_jobs]
    assert all(row.status == ProofJob.Status.DONE and row.verified for row in rows)
    lost = await database_sync_to_async(
        Event.objects.filter(message__contains="no longer knows").count)()
    assert lost == 0, "a result was lost and the job proved twice"


def settled_rows(proof_jobs):
    @database_sync_to_async
    def rows():
        found = [ProofJob.objects.get(pk=job.pk) for job in proof_jobs]
        return None if any(row.status in ProofJob.IN_FLIGHT for row in found) else found
    return rows


async def test_a_controller_restart_never_submits_twice(engine):
    """The previous controller submitted and died before writing `dispatched`: the new one
    adopts or resubmits with the same request id, and the engine runs the proof once."""
    machine = await local_machine(engine.port)
    job = await database_sync_to_async(ProofJob.objects.create)(
        kind="winning-post", profile="tiny", seed=9, priority="critical")
    engine.submit(request_id=str(job.pk), kind="winning-post", profile="tiny", seed=9)
    async with running_controller():
        job = await final(job.pk)
    assert job.status == ProofJob.Status.DONE and job.verified
    assert job.machine_id == machine.pk
    counters = engine.status()["counters"]
    assert counters["total_completed"] == 1 and counters["queue_depth"] == 0


async def test_a_claim_whose_submit_never_arrived_is_sent_by_the_next_controller(engine):
    """The previous controller claimed the job and died before its submit reached the engine
    (the job is dispatched, with no engine id): the next one sends it under the same request
    id, and nothing is re-queued or reported lost, for nothing was."""
    machine = await local_machine(engine.port)
    job = await database_sync_to_async(ProofJob.objects.create)(
        kind="winning-post", profile="tiny", seed=11, priority="normal")
    assert await database_sync_to_async(jobs.claim)(job.pk, machine.pk) is not None
    async with running_controller():
        job = await final(job.pk)
    assert job.status == ProofJob.Status.DONE and job.verified, job.error
    assert job.machine_id == machine.pk and job.engine_job_id == str(job.pk)
    assert engine.status()["counters"]["total_completed"] == 1
    said = await database_sync_to_async(lambda: list(Event.objects.filter(
        message__contains=str(job.pk)).values_list("message", flat=True)))()
    assert not [m for m in said if "re-queued" in m or "no longer knows" in m], said


async def test_rejected_and_impossible_jobs_fail_with_the_reason(engine):
    machine = await local_machine(engine.port)
    gone = await database_sync_to_async(Machine.objects.create)(name="old", provider="local",
                                                                enabled=False)
    rejected = await database_sync_to_async(ProofJob.objects.create)(
        kind="winning-post", profile="galactic", seed=1, machine=machine)
    pinned = await database_sync_to_async(ProofJob.objects.create)(
        kind="winning-post", profile="tiny", seed=1, machine=gone)
    async with running_controller():
        rejected = await final(rejected.pk, timeout=30)
        pinned = await final(pinned.pk, timeout=30)
    assert rejected.status == ProofJob.Status.FAILED
    assert "rejected" in rejected.error and "galactic" in rejected.error
    assert pinned.status == ProofJob.Status.FAILED and "disabled" in pinned.error


async def test_an_offline_engine_is_refused_before_any_job_exists():
    """A test proof pinned to a machine whose engine is offline could only fail, and the failure
    would be charged to the machine: the form refuses it with the reason, and no job is made."""
    machine = await local_machine(1)  # nothing listens there: never seen
    client = await database_sync_to_async(logged_in_client)()
    response = await database_sync_to_async(client.post)(
        "/proofs/new/", {"machine": machine.pk, "kind": "winning-post", "profile": "tiny",
                         "count": 1, "priority": ""}, follow=True)
    assert response.status_code == 400
    assert b"local cannot take a test proof now: the engine on local is offline" in \
        response.content
    assert not await ProofJob.objects.aexists()


@pytest.mark.parametrize(("cancelled_by", "outcome"), [
    ("request", ProofJob.Status.CANCELLED),  # someone cancelled it on the engine: final
    ("engine", ProofJob.Status.QUEUED),  # the engine's shutdown cancelled it: runs again
    (None, ProofJob.Status.QUEUED),  # an engine that does not say: never lose the job
])
def test_only_a_requested_cancel_ends_a_job(cancelled_by, outcome):
    machine = Machine.objects.create(name="local", provider="local", host="127.0.0.1",
                                     engine_port=1)
    job = ProofJob.objects.create(kind="winning-post", profile="tiny", seed=1)
    job.move_to(ProofJob.Status.DISPATCHED, machine_id=machine.pk, engine_job_id=str(job.pk))
    record = {"status": "cancelled", "error": "engine shutting down", "cancelled_by": cancelled_by}
    jobs.record_result(job.pk, machine.pk, record, None)
    job.refresh_from_db()
    assert job.status == outcome
    requeued = Event.objects.filter(message__contains=f"{job.pk} re-queued").first()
    if outcome == ProofJob.Status.QUEUED:
        assert requeued and "engine shutting down" in requeued.message
        assert job.engine_job_id == ""
    else:
        assert requeued is None


def test_a_requeued_proof_keeps_the_machine_its_user_chose_and_only_that_one():
    from vastmgr.proofs import jobs

    chosen = Machine.objects.create(name="chosen", host="h")
    pinned = ProofJob.objects.create(machine=chosen, pinned=True, kind="winning-post", seed=1)
    anywhere = ProofJob.objects.create(kind="winning-post", seed=2)
    for job in (pinned, anywhere):
        jobs.claim(job.pk, chosen.pk)
        jobs.mark_submitted(job.pk, chosen.pk, "engine-job")
        jobs.requeue(job.pk, chosen.pk, "machine offline for more than 30 s")
    pinned.refresh_from_db()
    anywhere.refresh_from_db()
    assert pinned.status == anywhere.status == ProofJob.Status.QUEUED
    assert pinned.machine_id == chosen.pk, "waits for the machine the user chose"
    assert anywhere.machine_id is None, "any machine may take it"
    said = Event.objects.filter(kind="proof", message__contains=str(pinned.pk)).get().message
    assert "it waits for chosen, the machine its user chose" in said


def test_a_job_that_ended_on_its_engine_is_not_cancelled_as_an_orphan():
    """A snapshot taken just before the result (the pipeline still running) must not make the
    controller cancel a job the engine has finished; one that now belongs to another engine,
    or that ended before reaching any, is cancelled there."""
    here = Machine.objects.create(name="here", host="h")
    there = Machine.objects.create(name="there", host="t")
    done_here, moved, cancelled_queued = (
        ProofJob.objects.create(kind="winning-post", seed=i) for i in range(3))
    for job, machine in ((done_here, here), (moved, there)):
        jobs.claim(job.pk, machine.pk)
        jobs.mark_submitted(job.pk, machine.pk, f"engine-{job.pk}")
    done_here.refresh_from_db()
    done_here.move_to(ProofJob.Status.RUNNING)
    done_here.move_to(ProofJob.Status.DONE)
    cancelled_queued.move_to(ProofJob.Status.CANCELLED)
    pipelines = [{"request_id": str(job.pk), "job_id": f"engine-{job.pk}", "status": "running"}
                 for job in (done_here, moved, cancelled_queued)]
    adopt, cancel = jobs.orphans(here.pk, pipelines)
    assert adopt == []
    assert cancel == [f"engine-{moved.pk}", f"engine-{cancelled_queued.pk}"]
