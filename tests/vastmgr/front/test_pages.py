"""Server-rendered pages share their fragments with the socket; forms report errors inline."""

from datetime import timedelta

import pytest
from django.utils import timezone

from vastmgr.fleet.models import Machine, MachineAction, MachineStatus
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def machine():
    m = Machine.objects.create(name="gpu-1", provider="local", host="127.0.0.1",
                               price_per_hour="0.5000", bench_rate=100, last_seen=timezone.now())
    MachineStatus.objects.create(machine=m, connected=True, interval=1,
                              idle_waiting_since=timezone.now() - timedelta(seconds=10), snapshot={
        "seq": 1, "memory": {"total_bytes": 100, "used_bytes": 90},
        "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "idle"}],
        "buffers": {"pending_handles": 2},
        "counters": {"queue_depth": 4, "total_completed": 1},
        "allocations": {"srs": [{"circuit_id": "winning-post.tiny", "bytes": 2048,
                                 "state": "loaded", "in_use": 0, "last_used_secs_ago": 3,
                                 "evictable": True}]},
    })
    return m


def test_fleet_page_and_its_polling_fragment_render_the_same_row(admin_client, machine):
    page = admin_client.get("/").content.decode()
    fragment = admin_client.get("/fragments/fleet/").content.decode()
    for html in (page, fragment):
        assert f'id="host-{machine.pk}-row"' in html and 'id="fleet-totals"' in html
        # no proof measured yet: the benchmark's 0.5 $/h / 100/h is only offered as an estimate
        assert "badge-live" in html and "Benchmark estimate $0.0050" in html
        assert "idle GPU with work waiting" in html
    assert 'ws-connect="/ws/fleet/"' in page and 'data-poll-url="/fragments/fleet/"' in page


def test_host_page_shows_the_engine_panel_and_srs_evict(admin_client, machine):
    html = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert f'id="host-{machine.pk}-panel"' in html and "winning-post.tiny" in html
    assert "fill-bad" in html  # 90% of the memory budget
    assert admin_client.get("/machines/999/").status_code == 404


def test_a_test_proof_is_offered_only_on_a_running_host(admin_client, machine):
    assert machine.state == Machine.State.REGISTERED
    html = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert "Run test proof here" not in html
    assert "disabled" in html and "machine gpu-1 is registered: it proves once it is running" in html
    machine.transition(Machine.State.RUNNING)
    html = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert f'href="/proofs/new/?machine={machine.pk}">Run test proof here' in html


def test_srs_actions_are_queued_for_the_controller_and_bad_ids_are_refused(admin_client, machine):
    response = admin_client.post(f"/machines/{machine.pk}/srs/",
                                 {"action": "preload", "circuit_id": "porep-c2.tiny"})
    assert response.status_code == 302
    action = MachineAction.objects.get()
    assert (action.action, action.circuit_id, action.done_at) == ("preload", "porep-c2.tiny", None)
    response = admin_client.post(f"/machines/{machine.pk}/srs/",
                                 {"action": "evict", "circuit_id": "../etc"})
    assert response.status_code == 400 and b"Unknown circuit id" in response.content


def test_form_errors_render_inline_and_create_nothing(admin_client):
    response = admin_client.post("/proofs/new/", {"machine": 999, "kind": "winning-post",
                                                  "profile": "tiny", "seed": -1, "count": 0})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="error-machine"' in html and "does not exist" in html
    assert 'id="error-seed"' in html and 'id="error-count"' in html
    assert not ProofJob.objects.exists()


def test_auto_with_no_engine_online_fails_the_jobs_with_the_reason(admin_client):
    response = admin_client.post("/proofs/new/", {"kind": "porep-c2", "profile": "tiny",
                                                  "seed": 10, "count": 3, "priority": ""})
    assert response.status_code == 302
    jobs = ProofJob.objects.order_by("seed")
    assert [j.seed for j in jobs] == [10, 11, 12]
    assert all(j.status == "failed" and "no engine is online" in j.error for j in jobs)
    assert all(j.priority == "normal" for j in jobs)  # porep-c2's default


def test_proof_list_filters_and_detail_downloads(admin_client, machine):
    done = ProofJob.objects.create(kind="winning-post", seed=1, machine=machine, status="done",
                                   proof=b"\x01" * 192, vk={"alpha_g1": "00"},
                                   public_inputs=[["1"]], verified=True)
    ProofJob.objects.create(kind="porep-c2", seed=2)
    html = admin_client.get("/proofs/?kind=winning-post").content.decode()
    assert f"job-{done.pk}" in html and "porep-c2</td>" not in html
    detail = admin_client.get(f"/proofs/{done.pk}/").content.decode()
    assert "01" * 192 in detail and "badge-live" in detail
    assert admin_client.get(f"/proofs/{done.pk}/vk.json").json() == {"alpha_g1": "00"}
    queued = ProofJob.objects.get(kind="porep-c2")
    assert admin_client.get(f"/proofs/{queued.pk}/proof.bin").status_code == 404
