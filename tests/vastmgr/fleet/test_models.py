"""State changes go through model methods; illegal ones raise; events are append-only."""

import pytest

from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import AppendOnlyError, IllegalTransition
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


def make_machine(**kw):
    return Machine.objects.create(name=kw.pop("name", "gpu-1"), host="127.0.0.1", **kw)


def test_machine_walks_the_full_lifecycle_and_records_each_step():
    m = make_machine()
    for state in ["provisioning", "params_ready", "benchmarked", "running", "stopped", "running"]:
        m.transition(state)
    m.kill("below minimum bench rate")
    m.refresh_from_db()
    assert m.state == "killed" and m.kill_reason == "below minimum bench rate"
    steps = [e.data["to"] for e in m.events.order_by("time", "id")]
    assert steps == ["provisioning", "params_ready", "benchmarked", "running", "stopped",
                     "running", "killed"]


@pytest.mark.parametrize("start, target", [
    ("registered", "benchmarked"), ("registered", "params_ready"), ("provisioning", "running"),
    ("killed", "running"), ("killed", "registered"), ("stopped", "benchmarked"),
])
def test_illegal_machine_transitions_raise_and_change_nothing(start, target):
    m = make_machine(state=start)
    with pytest.raises(IllegalTransition, match=f"cannot move from '{start}' to '{target}'"):
        m.transition(target)
    m.refresh_from_db()
    assert m.state == start
    assert not m.events.exists()


def test_kill_needs_a_reason():
    m = make_machine()
    with pytest.raises(ValueError, match="needs a reason"):
        m.transition("killed")
    assert Machine.objects.get(pk=m.pk).state == "registered"


def test_unknown_state_is_refused():
    with pytest.raises(IllegalTransition, match="unknown state"):
        make_machine().transition("exploded")


def test_engine_token_never_appears_in_repr_or_str():
    m = make_machine(engine_token="s3cret-token-value")
    assert "s3cret" not in repr(m) and "s3cret" not in str(m)


def test_proof_job_happy_path_sets_times():
    job = ProofJob.objects.create(kind="snap-update", seed=7)
    m = make_machine()
    job.move_to("dispatched", machine=m)
    job.move_to("running")
    assert job.started_at is not None
    job.move_to("done", proof=b"\x01" * 192, verified=True)
    job.refresh_from_db()
    assert job.status == "done" and job.finished_at is not None and bytes(job.proof) == b"\x01" * 192


def test_proof_job_requeue_clears_its_machine():
    job = ProofJob.objects.create(kind="porep-c2", seed=1)
    job.move_to("dispatched", machine=make_machine())
    job.move_to("running")
    job.move_to("queued")
    job.refresh_from_db()
    assert job.status == "queued" and job.machine is None and job.started_at is None


@pytest.mark.parametrize("final", ["done", "failed", "cancelled"])
def test_final_proof_jobs_cannot_move_again(final):
    job = ProofJob.objects.create(kind="winning-post", seed=1, status=final)
    for target in ["queued", "dispatched", "running", "done"]:
        with pytest.raises(IllegalTransition):
            job.move_to(target)


def test_queued_job_cannot_jump_to_running_or_done():
    job = ProofJob.objects.create(kind="window-post", seed=1)
    for target in ["running", "done"]:
        with pytest.raises(IllegalTransition):
            job.move_to(target)


def test_failing_a_job_records_the_reason():
    job = ProofJob.objects.create(kind="window-post", seed=1)
    job.fail("engine offline")
    job.refresh_from_db()
    assert job.status == "failed" and job.error == "engine offline" and job.finished_at


def test_events_are_append_only():
    e = Event.record("test", "hello")
    e.message = "changed"
    with pytest.raises(AppendOnlyError):
        e.save()
    with pytest.raises(AppendOnlyError):
        e.delete()
    assert Event.objects.get(pk=e.pk).message == "hello"
