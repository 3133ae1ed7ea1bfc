"""Cancel and retry from the dashboard: who may, what each status allows, and that a cancel of
a running proof really stops it on a real engine (DELETE /v1/proofs/{id} from the controller)."""

import re

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from tests.vastmgr import live_engine
from tests.vastmgr.live_engine import running_controller, wait_until
from vastmgr.fleet.models import Event, Machine
from vastmgr.front.proof_panel import render_proof
from vastmgr.proofs.models import ProofJob

engine, param_cache = live_engine.engine, live_engine.param_cache


def user_client(name: str, *, staff: bool = False) -> tuple[Client, object]:
    user = get_user_model().objects.create_user(name, password="pw-for-tests-1", is_staff=staff)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client, user


def post(client: Client, url: str, **data):
    """A form post as the browser sends it: with the CSRF cookie and token."""
    client.get("/proofs/")  # sets the csrftoken cookie
    return client.post(url, {"csrfmiddlewaretoken": client.cookies["csrftoken"].value, **data})


@pytest.mark.django_db
def test_a_queued_proof_is_cancelled_at_once_by_its_owner():
    client, owner = user_client("owner")
    job = ProofJob.objects.create(kind="winning-post", seed=1, requested_by=owner)
    response = post(client, f"/proofs/{job.pk}/cancel/", next="/proofs/?kind=winning-post")
    assert response.status_code == 302 and response["Location"] == "/proofs/?kind=winning-post"
    other = ProofJob.objects.create(kind="winning-post", seed=2, requested_by=owner)
    for elsewhere in ("//evil.example/", "/\\evil.example/", "https://evil.example/"):
        response = post(client, f"/proofs/{other.pk}/cancel/", next=elsewhere)
        assert response["Location"] == f"/proofs/{other.pk}/", elsewhere  # never off-site
    job.refresh_from_db()
    assert job.status == ProofJob.Status.CANCELLED and job.finished_at is not None
    assert "before it reached an engine" in job.error
    assert Event.objects.filter(message__contains=f"{job.pk}: cancel requested by owner").exists()


@pytest.mark.django_db
def test_a_running_proof_is_marked_for_the_controller_and_stays_running_until_the_engine_says():
    client, owner = user_client("owner")
    job = ProofJob.objects.create(kind="snap-update", seed=1, requested_by=owner,
                                  status=ProofJob.Status.RUNNING, started_at=timezone.now())
    response = post(client, f"/proofs/{job.pk}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"/proofs/{job.pk}/"
    job.refresh_from_db()
    assert job.status == ProofJob.Status.RUNNING and job.cancel_requested
    page = client.get(f"/proofs/{job.pk}/").content.decode()
    assert "cancelling…" in page and f'action="/proofs/{job.pk}/cancel/"' not in page
    assert "{#" not in page and "hx-headers (the form" not in page  # template comments stay hidden
    # a second click is refused politely, not a 500
    response = post(client, f"/proofs/{job.pk}/cancel/")
    assert response.status_code == 302
    assert "nothing to cancel" in client.get(f"/proofs/{job.pk}/").content.decode()


@pytest.mark.django_db
def test_only_staff_or_the_owner_may_act_and_only_by_post_with_csrf():
    _, owner = user_client("owner")
    stranger, _ = user_client("stranger")
    staff, _ = user_client("boss", staff=True)
    job = ProofJob.objects.create(kind="winning-post", seed=1, requested_by=owner)
    assert post(stranger, f"/proofs/{job.pk}/cancel/").status_code == 403
    assert stranger.get(f"/proofs/{job.pk}/cancel/").status_code == 405
    assert staff.post(f"/proofs/{job.pk}/cancel/").status_code == 403  # no CSRF token
    job.refresh_from_db()
    assert job.status == ProofJob.Status.QUEUED
    assert post(staff, f"/proofs/{job.pk}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.status == ProofJob.Status.CANCELLED
    # The list's rows are pushed to every viewer alike, as a proof's panel is: the buttons come
    # hidden, marked with the proof's owner, for proof_actions.js to show to staff or that
    # owner only (and every post is checked, as above).
    other = ProofJob.objects.create(kind="winning-post", seed=2, requested_by=owner)
    for client in (stranger, staff):
        assert re.search(rf'<span class="proof-actions" data-owner="{owner.pk}" hidden>\s*'
                         rf'<form method="post" action="/proofs/{other.pk}/cancel/"',
                         client.get("/proofs/").content.decode())


@pytest.mark.django_db
def test_retry_of_a_failed_proof_queues_a_new_one_and_links_back(monkeypatch):
    client, owner = user_client("owner")
    machine = Machine.objects.create(name="gpu-9", provider="local")
    failed = ProofJob.objects.create(kind="porep-c2", profile="tiny", seed=77, priority="high",
                                     requested_by=owner, machine=machine)
    failed.fail("engine exploded")
    monkeypatch.setattr("vastmgr.front.proof_views.unavailable_reason", lambda machine: None)
    response = post(client, f"/proofs/{failed.pk}/retry/")
    retry = ProofJob.objects.exclude(pk=failed.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/proofs/{retry.pk}/"
    assert (retry.kind, retry.profile, retry.seed, retry.priority) == ("porep-c2", "tiny", 77, "high")
    assert retry.status == ProofJob.Status.QUEUED and retry.machine is None
    assert retry.retry_of == failed and retry.requested_by == owner
    page = client.get(f"/proofs/{retry.pk}/").content.decode()
    assert f'href="/proofs/{failed.pk}/"' in page and "retry of" in page
    # a done proof cannot be retried, a queued one has nothing to retry
    for status in (ProofJob.Status.DONE, ProofJob.Status.QUEUED):
        job = ProofJob.objects.create(kind="winning-post", seed=1, requested_by=owner, status=status)
        post(client, f"/proofs/{job.pk}/retry/")
        assert not ProofJob.objects.filter(retry_of=job).exists()


@pytest.mark.django_db
def test_retry_with_no_engine_online_fails_the_new_job_with_the_reason():
    client, owner = user_client("owner")
    failed = ProofJob.objects.create(kind="winning-post", seed=3, requested_by=owner)
    failed.fail("boom")
    post(client, f"/proofs/{failed.pk}/retry/")
    retry = ProofJob.objects.get(retry_of=failed)
    assert retry.status == ProofJob.Status.FAILED and "no engine is online" in retry.error


@pytest.mark.django_db
def test_htmx_actions_answer_with_a_redirect_header():
    client, owner = user_client("owner")
    job = ProofJob.objects.create(kind="winning-post", seed=1, requested_by=owner)
    client.get("/proofs/")
    response = client.post(f"/proofs/{job.pk}/cancel/", HTTP_HX_REQUEST="true",
                           HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 204 and response["HX-Redirect"] == f"/proofs/{job.pk}/"


def pipeline_seen(done: int, params_s: float = 30.0, since_ready_s: float = 0.0) -> dict:
    """A porep-c2 pipeline as the engine reports it, seen now: its parameters took `params_s`
    after submission; after them the first partition needs 7.5 s through the pipeline (its
    latency), each next one 1.5 s more (the device's pace); `done` partitions are finished."""
    def end_s(index: int) -> float:
        return params_s + 7.5 + 1.5 * index
    partitions = [{"index": i, "state": "done", "finalize_start_ms": (end_s(i) - 0.5) * 1000,
                   "finalize_ms": 500.0} for i in range(done)]
    partitions += [{"index": i, "state": "synth_done"} for i in range(done, 10)]
    return {"status": "running", "phase": "running", "phase_secs": since_ready_s,
            "started_secs_ago": params_s + since_ready_s, "as_of": timezone.now().timestamp(),
            "partitions": partitions}


@pytest.mark.django_db
def test_the_eta_is_the_pace_between_partitions_or_recent_runs_never_the_first_ones_latency():
    job = ProofJob.objects.create(kind="porep-c2", seed=1, status=ProofJob.Status.RUNNING,
                                  started_at=timezone.now() - timezone.timedelta(seconds=40))
    # 1 of 10 done, 7.5 s after its parameters: nothing says how fast the rest will go (the
    # first partition carries the pipeline's latency), so no number.
    job.progress = pipeline_seen(done=1, since_ready_s=7.5)
    summary = job.progress_summary()
    assert summary["percent"] == 10 and summary["done"] == 1 and summary["total"] == 10
    assert summary["eta_seconds"] is None
    assert 'time left: <span class="eta">estimating…</span>' in render_proof(job)
    # 3 done, the third at 10.5 s: 1.5 s between partitions, 7 left
    job.progress = pipeline_seen(done=3, since_ready_s=10.5)
    assert job.progress_summary()["eta_seconds"] == 10  # 10.5 s
    # ...counted down from the last one finished: 1.5 s later, 1.5 s less
    job.progress = pipeline_seen(done=3, since_ready_s=12.0)
    assert job.progress_summary()["eta_seconds"] == 9
    html = render_proof(job)
    assert re.search(r'about <b class="eta"><span class="tick" data-tick-base="9\.000" '
                     r'data-tick-age="0.000" data-tick-rendered="[\d.]+" data-tick-digits="0" '
                     r'data-tick-down="1">9 s</span></b> left</span> <small class="muted">'
                     r"\(at the pace between its finished partitions", html), html

    # Earlier runs of the kind: how long they took once their parameters were in hand (their
    # wait in the queue and for parameters is not proving), from the third on.
    for took_s, waited_s in ((21.0, 80.0), (22.0, 0.5), (20.0, 1.0)):
        ProofJob.objects.create(
            kind="porep-c2", seed=2, status=ProofJob.Status.DONE, finished_at=timezone.now(),
            timings={"queue_ms": 100.0, "srs_load_ms": (waited_s - 0.1) * 1000,
                     "total_ms": (waited_s + took_s) * 1000})
        job.progress = pipeline_seen(done=0, since_ready_s=5.0)
        eta = job.progress_summary()["eta_seconds"]
    assert eta == 21 - 5  # the median of 20, 21, 22, less the 5 s since this one's parameters
    # At 1 of 10 the estimate goes on from there (issue 39: 13 s at 0/10, then 68 s at 1/10,
    # done 14 s later)
    job.progress = pipeline_seen(done=1, since_ready_s=8.0)
    assert job.progress_summary()["eta_seconds"] == 21 - 8
    # While the parameters are still generating, nothing is known of the proving yet.
    job.progress = {**pipeline_seen(done=0), "phase": "generating_parameters"}
    assert job.progress_summary()["eta_seconds"] is None


@pytest.mark.django_db(transaction=True)
async def test_cancelling_a_running_proof_stops_it_on_the_engine(engine):
    machine = await database_sync_to_async(Machine.objects.create)(
        name="local", provider="local", host="127.0.0.1", engine_port=engine.port)
    async with running_controller() as controller:
        await wait_until(lambda: machine.pk in controller.hosts
                         and controller.hosts[machine.pk].live.connected)
        # porep-c2 has 10 partitions: seconds of work, time enough to cancel it mid-way
        job = await database_sync_to_async(ProofJob.objects.create)(
            kind="porep-c2", profile="tiny", seed=11, priority="normal")
        await wait_until(lambda: any(p.get("request_id") == str(job.pk) and p["status"] == "running"
                                     for p in engine.status()["pipelines"]), timeout=60, every=0.02)
        running = await database_sync_to_async(ProofJob.objects.get)(pk=job.pk)
        await database_sync_to_async(running.request_cancel)(
            await database_sync_to_async(get_user_model().objects.create_user)("op"))

        async def final():
            row = await database_sync_to_async(ProofJob.objects.get)(pk=job.pk)
            return row if row.is_final else None
        job = await wait_until(final, timeout=60)
    assert job.status == ProofJob.Status.CANCELLED, (job.status, job.error)
    assert "cancel" in job.error
    pipeline = next(p for p in engine.status()["pipelines"] if p.get("request_id") == str(job.pk))
    assert pipeline["status"] == "cancelled"
    assert engine.status()["counters"]["total_completed"] == 0


@pytest.mark.django_db
def test_a_cancel_for_a_job_whose_machine_went_offline_ends_cancelled_not_requeued():
    from vastmgr.proofs import jobs

    machine = Machine.objects.create(name="gpu-2", provider="local")
    job = ProofJob.objects.create(kind="winning-post", seed=1, machine=machine,
                                  status=ProofJob.Status.RUNNING, cancel_requested=True)
    assert [j.pk for j in jobs.cancel_requests(jobs.in_flight_jobs())] == [job.pk]
    jobs.requeue(job.pk, machine.pk, "machine offline for more than 60 s")
    job.refresh_from_db()
    assert job.status == ProofJob.Status.CANCELLED and "machine offline" in job.error
    assert jobs.cancel_requests(jobs.in_flight_jobs()) == []


@pytest.mark.django_db
def test_a_job_cancelled_while_being_submitted_is_cancelled_on_the_engine_as_an_orphan():
    """The view cancels a queued job in the instant the controller submits it: the engine's
    pipeline then carries a finished job's id, and the controller cancels it there."""
    from vastmgr.proofs import jobs

    machine = Machine.objects.create(name="gpu-3", provider="local")
    job = ProofJob.objects.create(kind="winning-post", seed=1)
    job.request_cancel(get_user_model().objects.create_user("op"))
    assert jobs.claim(job.pk, machine.pk) is None  # too late: stays cancelled
    adopt, cancel = jobs.orphans(machine.pk, [{"request_id": str(job.pk), "job_id": "e-1",
                                               "status": "running"}])
    assert adopt == [] and cancel == ["e-1"]
