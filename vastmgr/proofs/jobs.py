"""The controller's side of a proof job: taking queued jobs for a machine, recording
submissions, progress, results and re-queues.

Every function here is synchronous (run in a thread by the controller) and re-reads the job
row before writing, so a result that arrives after a re-queue or a cancel is ignored rather
than counted twice.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, fields
from datetime import timedelta

from django.db import transaction
from django.db.models import Case, Count, Q, Value, When
from django.utils import timezone

from cuzk_engine.engine.snapshot import PipelineSnapshot
from cuzk_engine.vocabulary import PRIORITY_RANK, UNFINISHED_STATUSES
from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import VerificationError
from vastmgr.proofs.models import ProofJob
from vastmgr.proofs.progress import JobProgress
from vastmgr.proofs.verify import reverify


def queued_jobs(limit: int = 200) -> list[ProofJob]:
    """Queued jobs, most urgent first and oldest first within a priority (ordered in the
    query, so an urgent job is never left out behind a long backlog)."""
    rank = Case(*(When(priority=name, then=Value(r)) for name, r in PRIORITY_RANK.items()),
                default=Value(len(PRIORITY_RANK)))
    return list(ProofJob.objects.filter(status=ProofJob.Status.QUEUED)
                .select_related("machine").order_by(rank, "submitted_at")[:limit])


def holding_by_machine() -> dict[int, int]:
    """Jobs on each machine's engine, as the dashboard knows them (dispatched or running)."""
    return dict(ProofJob.objects.in_flight().values("machine_id").annotate(n=Count("pk"))
                .values_list("machine_id", "n"))


def in_flight_jobs(machine_ids=None) -> list[ProofJob]:
    jobs = ProofJob.objects.in_flight()
    if machine_ids is not None:
        jobs = jobs.filter(machine_id__in=machine_ids)
    return list(jobs)


def open_jobs() -> tuple[list[ProofJob], list[ProofJob]]:
    """The jobs in flight and the queued ones (`queued_jobs`), read together for one pass of
    the dispatcher."""
    return in_flight_jobs(), queued_jobs()


def cancel_requests(in_flight: list[ProofJob]) -> list[ProofJob]:
    """Of the jobs in flight, those an operator asked to cancel (queued ones are cancelled at
    once)."""
    return [job for job in in_flight if job.cancel_requested]


def cancel_refused(job_id, error: str) -> None:
    job = ProofJob.objects.select_related("machine").filter(pk=job_id).first()
    if job is not None:
        Event.record("proof", f"proof {job.pk}: the engine refused to cancel it: {error}",
                     machine=job.machine, level=Event.Level.WARNING, data={"job": str(job.pk)})


def fail(job_id, error: str) -> ProofJob | None:
    job = ProofJob.objects.filter(pk=job_id).first()
    if job is None or job.is_final:
        return None
    job.fail(error)
    return job


def claim(job_id, machine_id: int) -> ProofJob | None:
    """Take a queued job for `machine_id` before submitting it (None: another controller has
    it, or it is no longer queued). The row is locked while it is taken and skipped by the
    others, so exactly one controller submits each job. One that dies between the claim and
    the engine's answer leaves it dispatched with no engine id: the machine's next watcher
    sends it again under the same request id (`unconfirmed`), which the engine takes as the
    same request if the first one arrived."""
    with transaction.atomic():
        job = (ProofJob.objects.select_for_update(skip_locked=True)
               .filter(pk=job_id, status=ProofJob.Status.QUEUED).first())
        if job is None:
            return None
        job.move_to(ProofJob.Status.DISPATCHED, machine_id=machine_id, engine_job_id="")
    return job


def unclaim(job_id, machine_id: int) -> None:
    """The submit did not get through: back to the queue, for any controller to take."""
    job = ProofJob.objects.filter(pk=job_id, machine_id=machine_id, engine_job_id="",
                                  status=ProofJob.Status.DISPATCHED).first()
    if job is not None:
        job.move_to(ProofJob.Status.QUEUED, progress=None)


def unconfirmed(job_id, machine_id: int) -> ProofJob | None:
    """The job claimed for `machine_id` whose submit was never confirmed (no engine id yet),
    None when it has been confirmed, re-queued or ended meanwhile."""
    return ProofJob.objects.in_flight().filter(pk=job_id, machine_id=machine_id,
                                               engine_job_id="").first()


def mark_submitted(job_id, machine_id: int, engine_job_id: str) -> ProofJob | None:
    """Record the engine's id for a claimed job (None: it was re-queued or ended meanwhile)."""
    job = ProofJob.objects.in_flight().filter(pk=job_id, machine_id=machine_id).first()
    if job is None:
        return None
    job.engine_job_id = engine_job_id
    job.save(update_fields=["engine_job_id"])
    return job


def not_accepted(job_id, machine_id: int, reason: str) -> None:
    """The engine refused a submission because it is draining: the job simply stays queued."""
    job = ProofJob.objects.filter(pk=job_id, status=ProofJob.Status.QUEUED).first()
    machine = Machine.objects.filter(pk=machine_id).first()
    if job is not None and machine is not None:
        Event.record("proof", f"proof {job.pk} stays queued: {machine.name} is not accepting "
                     f"new jobs ({reason})", machine=machine, level=Event.Level.WARNING,
                     data={"job": str(job.pk)})


def requeue(job_id, machine_id: int, reason: str) -> ProofJob | None:
    with transaction.atomic():  # locked: of controllers noticing the same loss, one re-queues
        job = (ProofJob.objects.select_for_update().in_flight()
               .filter(pk=job_id, machine_id=machine_id).first())
        if job is not None:
            job.requeue(reason)
    return job


def record_progress(machine_id: int, pipelines: list[dict]) -> list[ProofJob]:
    """Copy partition progress from a snapshot into our jobs; return the jobs that changed.
    A job that ended while partitions were still in flight (its result came before the
    device let go) keeps following its pipeline until every partition has settled."""
    by_request = {p["request_id"]: p for p in pipelines if _is_uuid(p.get("request_id"))}
    if not by_request:
        return []
    seen = time.time()
    jobs = ProofJob.objects.filter(pk__in=list(by_request), machine_id=machine_id).filter(
        Q(status__in=ProofJob.IN_FLIGHT) | Q(status__in=ProofJob.FINAL, progress__isnull=False))
    return [job for job in jobs
            if (not job.is_final or not job.engine_progress.settled)
            and job.take_progress(JobProgress.from_json(by_request[str(job.pk)], seen))]


def orphans(machine_id: int, pipelines: list[dict]) -> tuple[list[ProofJob], list[str]]:
    """Pipelines on this engine that carry one of our job ids but are not ours to run there.

    Returns (jobs to adopt: queued here with no machine, e.g. submitted just before a
    controller crash; engine job ids to cancel: the job now belongs to another engine, or
    it ended before it reached one).
    """
    active = [p for p in pipelines
              if _is_uuid(p.get("request_id")) and p.get("status") in UNFINISHED_STATUSES]
    if not active:
        return [], []
    jobs = {str(j.pk): j for j in ProofJob.objects.filter(pk__in=[p["request_id"] for p in active])}
    adopt, cancel = [], []
    for pipeline in active:
        job = jobs.get(pipeline["request_id"])
        if job is None:
            continue
        if job.status == ProofJob.Status.QUEUED and job.machine_id in (None, machine_id):
            job.move_to(ProofJob.Status.DISPATCHED, machine_id=machine_id,
                        engine_job_id=pipeline["job_id"])
            adopt.append(job)
        elif job.machine_id not in (None, machine_id) or (job.is_final
                                                           and job.machine_id is None):
            # It belongs to another engine now, or it ended before reaching any. One that
            # ended on this very engine is not an orphan: this snapshot predates the result
            # its result waiter has already written.
            cancel.append(pipeline["job_id"])
    return adopt, cancel


@dataclass(frozen=True, slots=True)
class EngineResult:
    """The engine's record of a job that ended (`GET /v1/proofs/{id}`), the fields read here.
    A field the engine left out reads as None."""

    status: str | None
    error: str | None
    cancelled_by: str | None  # "request" (a DELETE) or "engine" (its own shutdown)
    timings: dict | None
    proof: str | None  # hex
    vk: dict | None
    public_inputs: list | None
    verified: bool | None  # the engine's own self-check

    @classmethod
    def from_json(cls, record: dict) -> EngineResult:
        return cls(*(record.get(f.name) for f in fields(cls)))


def final_progress(record: dict, pipeline: PipelineSnapshot | None) -> JobProgress | None:
    """The job's partitions as the engine answered with its result: `partition_states`, each
    partition's state and times then, and `settled`, whether none was still on a device or
    finalizing (an older engine sends neither: then its last pipeline in /status, if it still
    lists it)."""
    seen = time.time()
    states = record.get("partition_states")
    if states is None:
        return None if pipeline is None else JobProgress.of_pipeline(pipeline, seen)
    phase = None
    if record.get("settled") is False:
        phase = {"cancelled": "cancelling", "failed": "failing"}.get(record.get("status", ""))
    return JobProgress.from_json({"status": record.get("status"), "error": record.get("error"),
                                  "partitions": states, "phase": phase or record.get("status")},
                                 seen)


def record_result(job_id, machine_id: int, record: dict,
                  pipeline: PipelineSnapshot | None) -> ProofJob | None:
    job = ProofJob.objects.in_flight().filter(pk=job_id, machine_id=machine_id).first()
    if job is None:
        return None
    result = EngineResult.from_json(record)
    changes: dict = {"timings": result.timings or {}}
    progress = final_progress(record, pipeline)
    if progress is not None:
        changes["progress"] = progress.to_json()
    if result.status == "cancelled":
        if result.cancelled_by != "request":
            # The engine's own shutdown (or an engine too old to say) cancelled it: nobody
            # asked for that, so the job runs again rather than ending here.
            return requeue(job_id, machine_id,
                           f"the engine cancelled it ({result.error or 'no reason given'})")
        job.move_to(ProofJob.Status.CANCELLED, error=result.error or "cancelled", **changes)
        return job
    if result.status == "failed":
        job.fail(result.error or "the engine reported a failure without a reason",
                 engine_verified=result.verified, **changes)
        return job
    try:
        proof = bytes.fromhex(result.proof or "")
    except ValueError:
        job.fail("the engine returned a proof that is not hex", **changes)
        return job
    try:
        ok = reverify(result.vk, result.public_inputs, proof)
        error = "" if ok else "the dashboard's own verification rejected this proof"
    except VerificationError as exc:
        ok, error = False, f"the proof could not be checked: {exc}"
    changes.update(proof=proof, vk=result.vk, public_inputs=result.public_inputs, verified=ok,
                   engine_verified=result.verified)
    if ok:
        if job.started_at is None:
            # Dispatched and done between two looks at the engine: it started when the engine
            # says it did (its total less its queue wait), not never.
            timings = changes["timings"]
            ran_ms = max(timings.get("total_ms", 0) - timings.get("queue_ms", 0), 0)
            changes["started_at"] = timezone.now() - timedelta(milliseconds=ran_ms)
        job.move_to(ProofJob.Status.DONE, **changes)
    else:
        job.fail(error, **changes)
    return job


def _is_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
