"""Pages say only what the engine said, or label its age: the engine's job phases (parameters
generated or loaded, synthesis, waiting for a device, cancelling) in words and in data
attributes, a finished job's partitions as the engine settled them, running clocks handed to
the browser with the snapshot's age, stale hosts labelled on every page, binary units, plural
words, labelled sums, and an Event for every failed proof."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine, MachineStatus
from vastmgr.front import readmodel
from vastmgr.front.proof_panel import render_proof
from vastmgr.front.templatetags.units import binary_size
from vastmgr.proofs import jobs
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db

LONG_NAME = "gpu-host-" + "x" * 91  # 100 characters


def partitions(*states):
    """Partitions in `states`; one on a device has been there 50 ms (since 100 ms in)."""
    return [{"index": i, "state": s, "gpu_start_ms": 100.0 if s == "gpu" else None,
             "gpu_ms": 50.0 if s == "gpu" else None} for i, s in enumerate(states)]


def pipeline(job_id, status, parts, phase=None, **extra):
    return {"job_id": job_id, "request_id": None, "kind": "snap-update", "proof_kind": "snap-update",
            "profile": "small", "circuit_id": "snap-update.small", "priority": "normal",
            "status": status, "partitions_done": parts.count("done"), "total_partitions": len(parts),
            "partitions": partitions(*parts), "phase": phase, **extra}


SNAPSHOT = {
    "seq": 9, "uptime_secs": 60.0,
    "memory": {"total_bytes": 23_128_576_000, "used_bytes": 1_655_216},
    "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "p",
                     "current_partition": 2, "busy_secs": 3.42, "busy_total_secs": 7.43},
                    {"worker_id": 1, "gpu_ordinal": 0, "state": "idle", "current_job": None,
                     "current_partition": None, "busy_secs": None, "busy_total_secs": 4.0}],
    "buffers": {"synth_in_flight": 2, "pending_handles": 0, "provers_in_flight": 1,
                "aux_in_flight": 0},
    "counters": {"queue_depth": 0, "total_completed": 0},
    "pipelines": [
        pipeline("g", "running", ["pending"] * 16, "generating_parameters", phase_secs=8.0,
                 params_progress=0.42),
        pipeline("s", "running", ["synthesizing", "synthesizing", "pending"], "running",
                 phase_secs=1.0),
        pipeline("p", "running", ["done", "done", "gpu"], "running", phase_secs=5.0),
        pipeline("c", "cancelled", ["cancelled", "gpu"], "cancelling", phase_secs=0.5),
    ],
    "allocations": {"srs": [{"circuit_id": "snap-update.small", "bytes": 0, "state": "generating",
                             "in_use": 1, "last_used_secs_ago": 0.2, "evictable": False,
                             "state_secs": 8.0, "progress": 0.42}]},
}


def host(name="gpu-1", connected=True, seen_ago=1.0, snapshot_age=1.0):
    now = timezone.now()
    m = Machine.objects.create(name=name, provider="ssh", host="127.0.0.1",
                               last_seen=now - timedelta(seconds=seen_ago))
    MachineStatus.objects.create(machine=m, connected=connected, interval=1, seq=9,
                              snapshot=SNAPSHOT,
                              snapshot_at=now - timedelta(seconds=snapshot_age))
    return m


def job_block(panel: str, machine: Machine, job_id: str) -> tuple[str, str]:
    """The pipeline's element (its opening tag, and its text without tags)."""
    block = panel.split(f'id="host-{machine.pk}-job-{job_id}"')[1].split("</div>")[0]
    return block.split(">", 1)[0], re.sub(r"<[^>]*>", "", block.split(">", 1)[1])


def test_binary_values_are_shown_in_binary_units():
    assert binary_size(23_128_576_000) == "21.5 GiB"
    assert binary_size(1_655_216) == "1.6 MiB"
    assert binary_size(512) == "512 B"
    assert binary_size(None) == ""


def test_the_host_panel_says_which_phase_each_job_is_in(admin_client):
    machine = host()
    panel = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    tag, text = job_block(panel, machine, "g")
    assert 'data-phase="generating_parameters"' in tag
    assert 'data-engine-phase="generating_parameters"' in tag
    assert "generating parameters" in text and "snap-update.small" in text and "42%" in text
    assert "waiting for a device" not in text
    # the elapsed time runs on in the browser from the snapshot's value and age
    assert re.search(r'data-tick-base="8.000" data-tick-age="1\.\d+"', panel)
    tag, text = job_block(panel, machine, "s")
    assert 'data-phase="synthesizing"' in tag and "waiting for a device" not in text
    tag, text = job_block(panel, machine, "c")
    assert 'data-phase="cancelling"' in tag and "cancelling" in text
    assert 'data-partition="1" data-phase="gpu"' in panel.split(f"host-{machine.pk}-job-c")[1]
    # workers: state, job and busy times for the oracle; the busy clock ticks
    worker = panel.split('data-worker="0"')[1].split(">", 1)[0]
    assert 'data-worker-state="proving"' in worker and 'data-job="p"' in worker
    assert 'data-busy-ms="3420"' in worker and 'data-busy-total-ms="7430"' in worker
    assert 'data-tick-base="3.420"' in panel and 'data-tick-base="7.430"' in panel
    # the SRS list says generating, for how long and how far
    srs = panel.split('data-circuit="snap-update.small"')[1].split("</tr>")[0]
    assert 'data-srs-state="generating"' in srs and "42%" in srs
    # binary units; the host is live, so nothing is labelled stale
    assert "1.6 MiB used of 21.5 GiB" in panel
    assert 'data-host-stale="false"' in panel and "stale-flag" not in panel


def test_the_fleet_row_counts_jobs_not_yet_on_a_device_and_is_machine_readable(admin_client):
    machine = host(name=LONG_NAME)
    page = admin_client.get("/").content.decode()
    row = page.split(f'id="host-{machine.pk}-row"')[1].split("</tr>")[0]
    # g (parameters) and s (synthesizing) have nothing on a device; p proves; c is over
    assert 'data-waiting-jobs="2"' in row and 'data-workers-busy="1"' in row
    assert f'class="truncate" title="{LONG_NAME}"' in row
    assert "21.5 GiB" in row
    totals = page.split('id="fleet-totals"')[1]
    assert "<b>1</b> machine:" in totals


def test_a_stale_host_says_so_with_its_age_on_every_page(admin_client):
    machine = host(connected=False, seen_ago=120.0, snapshot_age=120.0)
    row = admin_client.get("/").content.decode().split(f'id="host-{machine.pk}-row"')[1]
    assert 'data-host-stale="true"' in row.split(">", 1)[0]
    assert re.search(r'data \<span class="tick age" data-tick-base="0.000" data-tick-age="12\d\.\d+"',
                     row.split("</tr>")[0])
    panel = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert 'data-host-stale="true"' in panel and "stale: data" in panel
    job = ProofJob.objects.create(kind="snap-update", profile="small", seed=1, machine=machine,
                                  status=ProofJob.Status.RUNNING,
                                  progress={**SNAPSHOT["pipelines"][2],
                                            "as_of": timezone.now().timestamp() - 120})
    html = render_proof(job)
    assert 'data-host-stale="true"' in html
    assert "this page shows the job as last seen" in html
    assert "running phases as of the snapshot" in html


def test_a_finished_job_shows_the_partitions_the_engine_settled_not_its_last_snapshot():
    machine = host()
    job = ProofJob.objects.create(kind="snap-update", profile="small", seed=1)
    job.move_to(ProofJob.Status.DISPATCHED, machine_id=machine.pk, engine_job_id="c")
    job.take_progress(jobs.JobProgress.from_json(SNAPSHOT["pipelines"][2]))  # in flight
    # the engine answered before its device let go: the job follows the pipeline until then
    record = {"status": "cancelled", "cancelled_by": "request", "error": "cancelled by request",
              "verified": None, "settled": False,
              "partition_states": partitions("cancelled", "cancelled", "gpu"),
              "timings": {"gpu_ms": 10.0, "total_ms": 20.0}}
    jobs.record_result(job.pk, machine.pk, record, None)
    job.refresh_from_db()
    assert (job.status, job.shown_status) == ("cancelled", "cancelling")
    html = render_proof(job)
    assert 'data-settled="false"' in html and "until the engine reports them settled" in html
    settled = pipeline("c", "cancelled", ["cancelled"] * 3, "cancelled")
    settled["request_id"] = str(job.pk)
    assert jobs.record_progress(machine.pk, [settled]) == [job]
    job.refresh_from_db()
    assert job.shown_status == "cancelled" and job.engine_progress.settled
    html = render_proof(job)
    assert 'data-settled="true"' in html and 'data-phase="gpu"' not in html
    assert "final, as the engine settled them" in html
    # settled: later snapshots of it are not followed any more
    assert jobs.record_progress(machine.pk, [settled]) == []
    # engine timings say which are sums over partitions
    assert "on a device, summed over partitions" in html


def test_the_engines_result_carries_the_final_partition_states():
    machine = host()
    job = ProofJob.objects.create(kind="snap-update", profile="small", seed=1)
    job.move_to(ProofJob.Status.DISPATCHED, machine_id=machine.pk, engine_job_id="x")
    stale = jobs.JobProgress.from_json(SNAPSHOT["pipelines"][2])
    record = {"status": "cancelled", "cancelled_by": "request", "error": "cancelled",
              "settled": True, "partition_states": partitions("done", "done", "cancelled")}
    progress = jobs.final_progress(record, None)
    assert progress is not None and progress.settled and progress != stale
    assert [p.state for p in progress.partitions] == ["done", "done", "cancelled"]


def test_every_failed_proof_is_an_event():
    job = ProofJob.objects.create(kind="winning-post", profile="tiny", seed=1)
    job.fail("no live machine can prove it")
    event = Event.objects.get(message__contains=f"proof {job.pk} failed")
    assert event.level == Event.Level.ERROR and "no live machine" in event.message


def test_fragments_mark_stale_only_hosts_with_data():
    machine = Machine.objects.create(name="new", provider="ssh", host="127.0.0.2")
    (view,) = readmodel.load_machines(timezone.now().timestamp(), [machine.pk])
    assert view.stale is False  # nothing shown, so nothing stale


def test_a_proof_waiting_for_its_parameters_says_so_with_a_running_clock():
    machine = host()
    job = ProofJob.objects.create(kind="snap-update", profile="small", seed=1, machine=machine,
                                  status=ProofJob.Status.RUNNING,
                                  progress={**SNAPSHOT["pipelines"][0],
                                            "as_of": timezone.now().timestamp() - 2})
    html = render_proof(job)
    status = html.split(f'id="proof-{job.pk}-status"')[1].split("</small>")[0]
    assert 'data-phase="generating_parameters"' in status
    assert ">generating parameters</span>" in status and "42% of the setup" in status
    assert re.search(r'data-tick-base="8.000" data-tick-age="2\.\d+"', status)
