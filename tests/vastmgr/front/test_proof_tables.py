"""Proofs and Events tables: sorting, search, filters and pagination come from validated query
parameters; a bad parameter is a clear 400 with the page around it, never a 500."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.front.proof_forms import ProofListForm
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def machines():
    return (Machine.objects.create(name="alpha", provider="local"),
            Machine.objects.create(name="b" * 100, provider="ssh", host="127.0.0.2"))


def make_job(machine=None, *, seed=1, kind="winning-post", status="done", took=None, age=0):
    now = timezone.now() - timedelta(seconds=age)
    fields = {}
    if took is not None:
        fields = {"started_at": now - timedelta(seconds=took), "finished_at": now}
    return ProofJob.objects.create(machine=machine, kind=kind, seed=seed, status=status,
                                   submitted_at=now - timedelta(seconds=(took or 0) + 1), **fields)


def rows(html: str) -> list[str]:
    return [part.split('"', 1)[0] for part in html.split('<tr id="job-')[1:]]


def test_every_proof_is_reachable_page_by_page_with_no_silent_cut_at_200(admin_client):
    jobs = [make_job(seed=i, age=i) for i in range(260)]
    seen = []
    page = 1
    while True:
        response = admin_client.get("/proofs/", {"page": page})
        assert response.status_code == 200
        html = response.content.decode()
        seen += rows(html)
        if 'rel="next"' not in html:
            break
        page += 1
    assert page == 6 and "260 rows" in html
    assert seen == [str(j.pk) for j in jobs]  # newest first, no row twice, none missing


def test_sorting_by_duration_and_by_seed_both_ways(admin_client):
    slow, fast, queued = make_job(seed=5, took=30), make_job(seed=7, took=2), make_job(
        seed=6, status="queued")
    by_duration = rows(admin_client.get("/proofs/?sort=duration").content.decode())
    assert by_duration == [str(fast.pk), str(slow.pk), str(queued.pk)]  # not started: last
    assert rows(admin_client.get("/proofs/?sort=-duration").content.decode())[:2] == [
        str(slow.pk), str(fast.pk)]
    assert rows(admin_client.get("/proofs/?sort=-seed").content.decode()) == [
        str(fast.pk), str(queued.pk), str(slow.pk)]
    html = admin_client.get("/proofs/?sort=seed&kind=winning-post").content.decode()
    # the current column links to the other direction and keeps the filters
    assert 'href="?kind=winning-post&amp;sort=-seed"' in html and 'aria-sort="ascending"' in html


def test_search_finds_a_job_by_id_prefix_seed_or_machine_name(admin_client, machines):
    alpha, long_name = machines
    one, two, three = make_job(alpha, seed=123456), make_job(long_name, seed=99), make_job(seed=5)
    assert rows(admin_client.get("/proofs/", {"q": str(three.pk)[:8]}).content.decode()) == [
        str(three.pk)]
    assert rows(admin_client.get("/proofs/", {"q": "123456"}).content.decode()) == [str(one.pk)]
    html = admin_client.get("/proofs/", {"q": "bbbb"}).content.decode()
    assert rows(html) == [str(two.pk)]
    assert f'class="truncate" title="{"b" * 100}"' in html  # cut on screen, whole in the tooltip
    assert rows(admin_client.get("/proofs/", {"machine": alpha.pk}).content.decode()) == [
        str(one.pk)]


@pytest.mark.parametrize("query", [
    {"page": "0"}, {"page": "x"}, {"page": "9" * 30}, {"sort": "id; drop table"},
    {"status": "nope"}, {"kind": "<script>"}, {"machine": "abc"}, {"machine": "99999"},
    {"q": "x" * 101},
])
def test_bad_list_parameters_get_a_400_page_with_the_reason(admin_client, query):
    make_job()
    response = admin_client.get("/proofs/", query)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'class="form-errors"' in html and "Fix the filters above." in html
    assert '<nav>' in html  # the page keeps its navigation


def test_a_page_past_the_end_shows_the_last_page(admin_client):
    make_job()
    response = admin_client.get("/proofs/?page=50")
    assert response.status_code == 200 and len(rows(response.content.decode())) == 1


def test_list_shows_duration_progress_and_per_kind_percentiles(admin_client):
    for took in (1, 2, 3, 4, 100):
        make_job(took=took)
    running = make_job(status="running", took=0)
    running.finished_at = None
    running.progress = {"partitions": [{"index": i, "state": "done" if i < 4 else "gpu"}
                                       for i in range(16)]}
    running.save()
    html = admin_client.get("/proofs/").content.decode()
    assert "100.0 s" in html and "25% <small" in html
    summary = html.split('class="percentiles"')[1].split("</table>")[0]
    # nearest rank: p50 of 1,2,3,4,100 is 3 s, p95 is the 100 s outlier
    assert "<td>winning-post</td><td>tiny</td><td>5</td><td>3.0 s</td><td>100.0 s</td>" in summary


def test_proof_list_form_only_sorts_by_declared_columns():
    form = ProofListForm({"sort": "-duration"})
    assert form.is_valid()
    assert "duration_sort" in str(form.ordering()[0])
    assert not ProofListForm({"sort": "requested_by__password"}).is_valid()


def test_events_filter_by_machine_level_and_kind_and_highlight_errors(admin_client, machines):
    alpha, other = machines
    Event.record("lifecycle", "alpha started", machine=alpha)
    Event.record("proof", "proof failed: boom", machine=alpha, level=Event.Level.ERROR)
    Event.record("vast", "rented", machine=other, level=Event.Level.WARNING)
    html = admin_client.get("/events/", {"machine": alpha.pk, "level": "error"}).content.decode()
    assert "proof failed: boom" in html and "alpha started" not in html and "rented" not in html
    assert '<tr class="level-error">' in html
    html = admin_client.get("/events/", {"kind": "vast"}).content.decode()
    assert "rented" in html and "boom" not in html
    assert '<option value="lifecycle">' in html  # kinds offered are the ones recorded
    html = admin_client.get("/events/", {"q": "BOOM", "sort": "time"}).content.decode()
    assert "boom" in html and "rented" not in html


def test_events_paginate_and_refuse_bad_parameters(admin_client):
    for i in range(130):
        Event.record("lifecycle", f"event number {i}")
    html = admin_client.get("/events/").content.decode()
    assert "page 1 of 2 (130 rows)" in html and "event number 129" in html
    html = admin_client.get("/events/?page=2").content.decode()
    assert "event number 0<" in html and "event number 129" not in html
    for query in ({"level": "fatal"}, {"kind": "unknown"}, {"page": "-1"}, {"sort": "message"},
                  {"machine": "1 or 1=1"}):
        response = admin_client.get("/events/", query)
        assert response.status_code == 400, query
        assert "form-errors" in response.content.decode()


def test_error_pages_keep_the_navigation(client, admin_client):
    html = admin_client.get("/proofs/00000000-0000-0000-0000-000000000000/").content.decode()
    assert "Page not found" in html and 'href="/proofs/"' in html and "<nav>" in html
    user = get_user_model().objects.create_user("someone", password="pw-for-tests-1")
    client.force_login(user)
    job = make_job(status="failed")
    response = client.post(f"/proofs/{job.pk}/retry/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "Not allowed" in html and "Only staff or the person who started" in html
    assert "<nav>" in html
