"""Fleet and host pages tell the truth: waiting work is counted as waiting, the idle-GPU flag
needs the condition to hold, every failure is counted, snapshot ages are made current, charts
come from counter differences over a stated window, costs are measured, notices are pushed."""

import re
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from vastmgr.controller.hosts import WatchedMachine
from vastmgr.controller.service import FleetController
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Machine, MachineSample, MachineStatus
from vastmgr.front import fragments, readmodel
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


def partitions(*states):
    return [{"index": i, "state": s} for i, s in enumerate(states)]


def pipeline(job_id, status, parts):
    return {"job_id": job_id, "request_id": None, "kind": "porep-c2", "profile": "tiny",
            "priority": "normal", "status": status, "partitions_done": parts.count("done"),
            "total_partitions": len(parts), "partitions": partitions(*parts)}


# One job proving, one admitted with 3 partitions synthesized and none on a device yet (the
# engine calls it "running"), one still queued; one worker of two idle.
SNAPSHOT = {
    "seq": 7, "uptime_secs": 50.0,
    "memory": {"total_bytes": 100, "used_bytes": 10},
    "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "current_job": "a",
                     "current_partition": 1, "busy_secs": 0.5, "busy_total_secs": 20.0},
                    {"worker_id": 1, "gpu_ordinal": 0, "state": "idle", "busy_total_secs": 5.0}],
    "buffers": {"synth_in_flight": 1, "pending_handles": 3, "provers_in_flight": 1,
                "aux_in_flight": 0},
    "counters": {"queue_depth": 1, "total_completed": 4},
    "pipelines": [pipeline("a", "running", ["done", "gpu"]),
                  pipeline("b", "running", ["synth_done"] * 3 + ["synthesizing", "pending"]),
                  pipeline("c", "queued", ["pending"] * 2)],
    "allocations": {"srs": [{"circuit_id": "porep-c2.tiny", "bytes": 2048, "state": "loaded",
                             "in_use": 0, "last_used_secs_ago": 3.0, "evictable": True}]},
}


@pytest.fixture
def machine():
    m = Machine.objects.create(name="gpu-1", provider="ssh", host="127.0.0.1",
                               price_per_hour=Decimal("0.5000"), last_seen=timezone.now())
    MachineStatus.objects.create(machine=m, connected=True, interval=1, snapshot=SNAPSHOT,
                              snapshot_at=timezone.now() - timedelta(seconds=100))
    return m


def row_of(html: str, machine: Machine) -> str:
    return html.split(f'id="host-{machine.pk}-row"')[1].split("</tr>")[0]


def test_jobs_admitted_but_not_on_a_device_are_waiting_and_counted(admin_client, machine):
    row = row_of(admin_client.get("/").content.decode(), machine)
    # b (admitted, synthesized, nothing on a device) and c (queued): 2 jobs, 3 partitions ready
    assert re.search(r'<b class="waiting-jobs">2</b> jobs · .*3 parts ready', row), row
    totals = admin_client.get("/fragments/fleet/").content.decode().split('id="fleet-totals"')[1]
    assert '<b class="total-waiting">2</b>' in totals and '<b class="total-parts">3</b>' in totals

    panel = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    b = panel.split(f'id="host-{machine.pk}-job-b"')[1].split("</div>")[0]
    shown = re.sub(r"<[^>]*>", "", b.split(">", 1)[1])
    assert "waiting for a device" in shown and "3/5 synthesized" in shown
    assert "running" not in shown and 'data-phase="waiting"' in b
    a = panel.split(f'id="host-{machine.pk}-job-a"')[1].split("</div>")[0]
    assert "status-running" in a and "1/2" in a


def test_a_running_proof_with_nothing_on_a_device_reads_waiting_on_the_proof_pages(
        admin_client, machine):
    waiting = ProofJob.objects.create(kind="porep-c2", profile="tiny", seed=1, machine=machine,
                                      status=ProofJob.Status.RUNNING,
                                      progress=SNAPSHOT["pipelines"][1])
    proving = ProofJob.objects.create(kind="porep-c2", profile="tiny", seed=2, machine=machine,
                                      status=ProofJob.Status.RUNNING,
                                      progress=SNAPSHOT["pipelines"][0])
    detail = admin_client.get(f"/proofs/{waiting.pk}/").content.decode()
    status = detail.split(f'id="proof-{waiting.pk}-status"')[1].split("</span>")[0]
    assert "waiting for a device" in status and "running" not in status.split(">", 1)[1]
    listing = admin_client.get("/proofs/").content.decode()
    assert listing.count("waiting for a device</span>") == 1
    shown = admin_client.get(f"/proofs/{proving.pk}/").content.decode()
    assert re.search(f'id="proof-{proving.pk}-status"[^>]*data-phase="running"[^>]*>running<', shown)


def test_counters_state_their_window_and_snapshot_ages_are_current(admin_client, machine):
    panel = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert "since engine start" in panel
    # The SRS entry was used 3 s before a snapshot taken 100 s ago: 103 s ago now. The page
    # hands the browser the engine's value and the snapshot's age, to keep counting from.
    srs = panel.split("porep-c2.tiny</code>")[1].split("</tr>")[0]
    base = float(re.search(r'data-tick-base="([0-9.]+)"', srs).group(1))
    snapshot_age = float(re.search(r'data-tick-age="([0-9.]+)"', srs).group(1))
    assert base == 3 and 103 <= base + snapshot_age < 106, srs
    assert "snapshot taken" in panel


def test_the_idle_gpu_flag_needs_the_condition_to_hold_on_the_controllers_clock(machine):
    clock = [1_000_000.0]
    controller = FleetController(clock=lambda: clock[0])
    controller.machines = {machine.pk: machine}
    live = MachineLive(machine.pk, snapshot=SNAPSHOT, seq=7, last_seen=clock[0],
                    snapshot_at=clock[0], connected=True)
    controller.hosts[machine.pk] = WatchedMachine(live)

    def flagged_after(seconds: float) -> bool:
        clock[0] = 1_000_000.0 + seconds
        live.last_seen = clock[0]
        status = controller._status_row(machine.pk, clock[0])
        (host,) = readmodel.machine_views([machine], {machine.pk: status}, clock[0])
        html = fragments.render_fleet_row(host) + fragments.render_fleet_totals([host], clock[0])
        return "idle GPU with work waiting" in html

    assert not flagged_after(0)
    assert not flagged_after(4.5)
    assert flagged_after(5.5)
    # The condition ends (every worker busy): the flag goes, and a new wait starts from zero.
    busy = {**SNAPSHOT, "gpu_workers": [{**w, "state": "proving"} for w in SNAPSHOT["gpu_workers"]]}
    live.snapshot = busy
    assert not flagged_after(6)
    live.snapshot = SNAPSHOT
    assert not flagged_after(7) and not flagged_after(11.5) and flagged_after(12.5)


def test_24h_totals_count_failures_whatever_stage_they_failed_at(admin_client, machine):
    now = timezone.now()
    ProofJob.objects.create(kind="porep-c2", seed=1, machine=machine, status="failed",
                            error="partition 3: boom", finished_at=now)
    ProofJob.objects.create(kind="porep-c2", seed=2, status="failed", finished_at=now,
                            error="no engine is online to take the job")
    ProofJob.objects.create(kind="porep-c2", seed=3, machine=machine, status="done",
                            finished_at=now)
    ProofJob.objects.create(kind="porep-c2", seed=4, machine=machine, status="failed",
                            finished_at=now - timedelta(hours=25), error="old")
    totals = admin_client.get("/").content.decode().split('id="fleet-totals"')[1]
    assert "1 done" in totals and '<span class="bad total-failed">2 failed</span>' in totals
    assert "1 before reaching a machine" in totals
    assert '<span class="ok">1</span> / <span class="bad">1</span>' in row_of(
        admin_client.get("/").content.decode(), machine)


def test_fleet_cost_running_price_spend_and_measured_cost_per_proof(admin_client, machine):
    ledger.bill(machine, "running", machine.price_per_hour, cause="rent",
                at=timezone.now() - timedelta(hours=2))
    stopped = Machine.objects.create(name="gpu-2", provider="vast", price_per_hour=Decimal("1.0"))
    ledger.bill(stopped, "running", stopped.price_per_hour, cause="rent",
                at=timezone.now() - timedelta(hours=30))
    ledger.stop_billing(stopped, timezone.now() - timedelta(hours=26))
    for seed in range(4):
        ProofJob.objects.create(kind="porep-c2", seed=seed, machine=machine, status="done",
                                finished_at=timezone.now())
    (host,) = readmodel.load_machines(time.time(), [machine.pk])
    assert host.running_dph == 0.5 and host.spent == pytest.approx(1.0, abs=0.001)
    assert host.cost_per_proof == pytest.approx(0.25, abs=0.001)  # $1.00 over 2 h / 4 proofs
    html = admin_client.get("/").content.decode()
    row = row_of(html, machine)
    assert "$0.500" in row and "$1.00" in row and "$0.2500" in row
    assert 'class="money"' in row and 'data-per-hour="0.500000"' in row
    other = row_of(html, stopped)
    assert "(not billing)" in other and "$4.00" in other  # 4 h billed, nothing in 24 h
    totals = html.split('id="fleet-totals"')[1]
    assert "running <b>$0.500/h</b>" in totals and "$5.00" in totals and "$0.2500/proof" in totals


def sample(machine, seconds_ago, completed, busy_seconds, workers=2):
    MachineSample.objects.create(machine=machine, time=timezone.now() - timedelta(seconds=seconds_ago),
                              busy_fraction=1.0, proofs_completed=completed,
                              busy_seconds=busy_seconds, workers=workers)


def test_charts_rate_and_busy_come_from_counter_differences_over_the_window(machine):
    # 10 minutes of samples every 10 s: one proof finished, and one of two workers busy for
    # the last 5 minutes. The busy_fraction of every sample says 100%, which must not be used.
    for i in range(61):
        ago = 600 - 10 * i
        sample(machine, ago, completed=3 if ago > 300 else 4,
               busy_seconds=100 + max(0, 300 - ago))
    c = readmodel.chart_series(machine, time.time(), "1h")
    assert c["proofs"] == 1 and c["covered"] == pytest.approx(600, abs=2)
    assert c["rate"] == pytest.approx(0.1, abs=0.01)  # 1 proof in 10 min, not 6/min
    assert c["busy"] == pytest.approx(25, abs=1)  # 300 of 2 × 600 worker-seconds
    assert c["partial"] and c["window_label"] == "1 h"
    assert len(c["series"]["t"]) == len(c["series"]["busy"]) == len(c["series"]["rate"])
    assert max(v for v in c["series"]["busy"] if v is not None) == pytest.approx(50, abs=1)

    short = readmodel.chart_series(machine, time.time(), "15m")
    assert short["window"] == "15m" and short["proofs"] == 1


def test_charts_survive_engine_restarts_and_gaps(machine):
    sample(machine, 400, completed=50, busy_seconds=900)
    sample(machine, 390, completed=52, busy_seconds=910)
    sample(machine, 100, completed=1, busy_seconds=2)  # host away, then a restarted engine
    sample(machine, 90, completed=2, busy_seconds=7)
    sample(machine, 80, completed=1, busy_seconds=3)  # restarted again, one proof since
    c = readmodel.chart_series(machine, time.time(), "15m")
    assert c["proofs"] == 2 + 1 + 1  # nothing is counted across the gap
    assert None in c["series"]["rate"]  # the gap stays a gap
    assert all(v is None or v >= 0 for v in c["series"]["rate"] + c["series"]["busy"])


def test_the_window_picker_fragment_and_page(admin_client, machine):
    fragment = admin_client.get(f"/fragments/machines/{machine.pk}/charts/?window=24h").content.decode()
    assert f'id="host-{machine.pk}-charts"' in fragment and 'data-window="24h"' in fragment
    assert "over the last 24 h" in fragment and f'id="host-{machine.pk}-chart-data"' in fragment
    page = admin_client.get(f"/machines/{machine.pk}/?window=15m").content.decode()
    assert 'data-window="15m"' in page and "uPlot" in page
    bad = admin_client.get(f"/fragments/machines/{machine.pk}/charts/?window=7y").content.decode()
    assert 'data-window="1h"' in bad


def test_srs_hint_uses_real_ids_and_an_unknown_id_is_refused_in_the_form(admin_client, machine):
    page = admin_client.get(f"/machines/{machine.pk}/").content.decode()
    assert "winning-post.tiny" in page and "winning-post:tiny" not in page
    assert '<option value="snap-update.large">' in page
    response = admin_client.post(f"/machines/{machine.pk}/srs/",
                                 {"action": "preload", "circuit_id": "winning-post:tiny"})
    assert response.status_code == 400
    assert "Unknown circuit id &#x27;winning-post:tiny&#x27;" in response.content.decode()
    assert not machine.actions.exists()


class RecordingPublisher:
    def __init__(self):
        self.sent = []
        self.reconnected = False

    async def send(self, messages):
        self.sent.extend(messages)
        return True

    async def close(self):
        return None


@pytest.mark.django_db(transaction=True)
async def test_a_failed_proof_is_pushed_as_a_toast_to_the_fleet_and_its_host(machine):
    from channels.db import database_sync_to_async

    job = await database_sync_to_async(ProofJob.objects.create)(
        kind="porep-c2", seed=1, machine=machine, status="running")
    await database_sync_to_async(job.fail)("partition 3: out of memory")
    publisher = RecordingPublisher()
    await FleetController(publisher=publisher).dispatcher.publish_job(job)
    toasts = {group: html for group, html in publisher.sent if 'class="toast' in html}
    assert set(toasts) == {"fleet", f"host.{machine.pk}", f"proof.{job.pk}"}
    assert 'id="toasts" hx-swap-oob="beforeend"' in toasts["fleet"]
    assert "failed on gpu-1: partition 3: out of memory" in toasts["fleet"]


async def test_a_host_going_offline_is_pushed_as_a_toast(machine):
    publisher = RecordingPublisher()
    clock = [time.time()]
    controller = FleetController(publisher=publisher, clock=lambda: clock[0])
    controller.machines = {machine.pk: machine}
    live = MachineLive(machine.pk, snapshot=SNAPSHOT, seq=7, last_seen=clock[0], connected=True)
    controller.hosts[machine.pk] = WatchedMachine(live)
    controller._collect_changes(clock[0])
    assert controller.notices == []
    live.lost("connection refused", clock[0] + 1)
    controller._collect_changes(clock[0] + 1)
    (fleet, fleet_html), (machine_group, _) = controller.notices
    assert (fleet, machine_group) == ("fleet", f"host.{machine.pk}")
    assert "gpu-1 went offline: connection refused" in fleet_html


def test_a_host_going_offline_repushes_its_running_proofs_pages_marked_stale(machine):
    """A proof page shows its partitions as of the host's last snapshot: when the host goes
    offline the page must say so, though no progress changed."""
    job = ProofJob.objects.create(kind="porep-c2", seed=1, machine=machine, status="running",
                                  engine_job_id="a")
    clock = [time.time()]
    controller = FleetController(publisher=RecordingPublisher(), clock=lambda: clock[0])
    controller.machines = {machine.pk: machine}
    live = MachineLive(machine.pk, snapshot=SNAPSHOT, seq=7, last_seen=clock[0], connected=True)
    controller.hosts[machine.pk] = WatchedMachine(live)
    controller._collect_changes(clock[0])
    controller.connection_changed.clear()
    live.lost("connection refused", clock[0] + 1)
    changed = controller._collect_changes(clock[0] + 1)
    statuses = [controller._status_row(m, clock[0] + 1) for m in changed]
    messages, _, _ = controller._persist(statuses, controller.connection_changed)
    pages = dict(messages)
    assert f"proof.{job.pk}" in pages
    assert 'data-host-stale="true"' in pages[f"proof.{job.pk}"]
    # Back live without the job (an engine restart lost it): its page keeps the stale label
    # (the result waiter re-queues it); back with it: the page is live again.
    for listed, pushed in (([], False), ([{**SNAPSHOT["pipelines"][0], "request_id": str(job.pk)}],
                                         True)):
        controller.connection_changed.clear()
        live.lost("down again", clock[0] + 2)
        controller._collect_changes(clock[0] + 2)
        controller.connection_changed.clear()
        live.accept({**SNAPSHOT, "seq": SNAPSHOT["seq"] + len(listed) + 1, "pipelines": listed},
                    "direct", clock[0] + 3)
        changed = controller._collect_changes(clock[0] + 3)
        statuses = [controller._status_row(m, clock[0] + 3) for m in changed]
        messages, _, _ = controller._persist(statuses, controller.connection_changed)
        assert (f"proof.{job.pk}" in dict(messages)) is pushed, listed


def test_a_batch_submit_is_confirmed(admin_client, machine):
    Machine.objects.filter(pk=machine.pk).update(state=Machine.State.RUNNING)  # ready to prove
    response = admin_client.post("/proofs/new/", {
        "machine": machine.pk, "kind": "porep-c2", "profile": "tiny", "seed": 1, "count": 3,
        "priority": ""}, follow=True)
    assert "Queued 3 porep-c2/tiny proofs on gpu-1." in response.content.decode()


def test_the_machine_page_heading_rereads_the_lifecycle_state(admin_client, machine):
    page = admin_client.get(f"/remote/machines/{machine.pk}/").content.decode()
    assert f'hx-get="/fragments/machines/{machine.pk}/state/"' in page
    machine.transition(Machine.State.PROVISIONING)
    machine.transition(Machine.State.REGISTERED, reason="ssh failed")
    state = admin_client.get(f"/fragments/machines/{machine.pk}/state/").content.decode()
    assert ">registered</span>" in state and f'id="machine-{machine.pk}-state"' in state


def test_jobs_left_undispatched_beside_an_idle_engine_are_flagged_only_after_the_hold():
    idle = Machine.objects.create(name="idle", provider="local", last_seen=timezone.now())
    MachineStatus.objects.create(machine=idle, connected=True, interval=1, snapshot={
        "seq": 1, "gpu_workers": [{"worker_id": 0, "state": "idle"}], "pipelines": []})
    job = ProofJob.objects.create(kind="porep-c2", seed=1)  # just submitted: dispatch is next

    def flagged() -> bool:
        return readmodel.fleet_totals(readmodel.load_machines(time.time()))["idle_while_waiting"]

    assert not flagged()
    ProofJob.objects.filter(pk=job.pk).update(submitted_at=timezone.now() - timedelta(seconds=6))
    assert flagged()
