from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models, transaction
from django.utils import timezone

from cuzk_engine.vocabulary import KINDS, PRIORITIES, PROFILES, TERMINAL_STATUSES
from vastmgr.fleet.models import Event
from vastmgr.lib.transitions import check_transition
from vastmgr.proofs.progress import (
    PHASE_LABELS,
    PHASE_TITLES,
    JobProgress,
    proof_duration_ms,
    remaining_s,
)

# The engine accepts seeds up to 2**64 - 1; the database's signed 64-bit integer stops earlier.
MAX_SEED = 2**63 - 1
# A job that ended while partitions were still in flight shows this until they settle.
UNSETTLED_PHASE = {"cancelled": "cancelling", "failed": "failing"}
# Keys of a stored progress that change with every snapshot without anything happening: a
# progress equal but for them is not written again (the page ticks them on from `as_of`).
_TICKING = ("as_of", "phase_secs", "started_secs_ago")


def word_choices(words: tuple[str, ...]) -> list[tuple[str, str]]:
    """Django choices for the engine's words, labelled as forms show them ("porep-c2": "Porep C2")."""
    return [(word, word.replace("-", " ").title()) for word in words]


KIND_CHOICES = word_choices(KINDS)
PROFILE_CHOICES = word_choices(PROFILES)
PRIORITY_CHOICES = word_choices(PRIORITIES)


class ProofJobQuerySet(models.QuerySet):
    def in_flight(self) -> ProofJobQuerySet:
        return self.filter(status__in=ProofJob.IN_FLIGHT)


class ProofJob(models.Model):
    """One test proof requested from the dashboard, dispatched to one machine's engine."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        DISPATCHED = "dispatched"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINAL = TERMINAL_STATUSES
    # On an engine: the controller waits for its result there.
    IN_FLIGHT = (Status.DISPATCHED, Status.RUNNING)
    # dispatched/running may fall back to queued when their machine goes offline for too long.
    TRANSITIONS = {
        Status.QUEUED: {Status.DISPATCHED, Status.FAILED, Status.CANCELLED},
        Status.DISPATCHED: {Status.RUNNING, Status.QUEUED, Status.DONE, Status.FAILED,
                            Status.CANCELLED},
        Status.RUNNING: {Status.QUEUED, Status.DONE, Status.FAILED, Status.CANCELLED},
        Status.DONE: set(),
        Status.FAILED: set(),
        Status.CANCELLED: set(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    machine = models.ForeignKey(
        "fleet.Machine", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    pinned = models.BooleanField(
        default=False, help_text="The user chose the machine: a re-queued job waits for it"
    )
    kind = models.CharField(max_length=20, choices=KIND_CHOICES)
    profile = models.CharField(max_length=10, choices=PROFILE_CHOICES, default="tiny")
    seed = models.PositiveBigIntegerField(validators=[MaxValueValidator(MAX_SEED)])
    priority = models.CharField(max_length=10, choices=PRIORITY_CHOICES, default="normal")
    status = models.CharField(
        max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    submitted_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    timings = models.JSONField(default=dict, blank=True, help_text="Per-phase milliseconds")
    proof = models.BinaryField(null=True, blank=True)
    public_inputs = models.JSONField(null=True, blank=True)
    vk = models.JSONField(null=True, blank=True)
    verified = models.BooleanField(null=True, blank=True)
    engine_job_id = models.CharField(
        max_length=100, blank=True, help_text="The engine's id for this job on its machine"
    )
    engine_verified = models.BooleanField(
        null=True, blank=True, help_text="The engine's own self-check (ours is `verified`)"
    )
    progress = models.JSONField(
        null=True, blank=True, help_text="Last partition states seen in the engine's status"
    )
    error = models.TextField(blank=True)
    engine_duration = models.DurationField(
        null=True, blank=True,
        help_text="An ended job's duration (progress.proof_duration_ms), kept with every save")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    cancel_requested = models.BooleanField(
        default=False, help_text="An operator asked to cancel; the controller cancels it on the engine"
    )
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    retried = models.BooleanField(
        default=False, help_text="Claimed by its one retry (see `retry`)")

    objects = ProofJobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at"]

    def __str__(self) -> str:
        return f"{self.kind}/{self.profile} seed {self.seed} ({self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    def move_to(self, target: str, **fields) -> None:
        """Change status (and the given fields) in one save, or raise IllegalTransition."""
        check_transition(f"proof job {self.id}", self.TRANSITIONS, self.status, target)
        now = timezone.now()
        if target == self.Status.RUNNING and self.started_at is None:
            fields.setdefault("started_at", now)
        if target in self.FINAL:
            fields.setdefault("finished_at", now)
        if target == self.Status.QUEUED:
            fields.setdefault("machine", self.machine if self.pinned else None)
            fields.setdefault("started_at", None)
        for name, value in fields.items():
            setattr(self, name, value)
        self.status = target
        self.save(update_fields=["status", *fields])

    def save(self, *args, **kwargs) -> None:
        # The duration is derived from the fields it depends on at every save, so no path that
        # ends a job or settles its partitions can leave it behind.
        duration = self.ended_duration()
        if duration != self.engine_duration:
            self.engine_duration = duration
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = [*kwargs["update_fields"], "engine_duration"]
        super().save(*args, **kwargs)

    def ended_duration(self) -> timedelta | None:
        """The ended job's duration as the engine timed it (`proof_duration_ms`); a result
        without the engine's times (an engine too old to send them) is timed on this
        dashboard's clock, from when the job was seen running to its result."""
        if not self.is_final:
            return None
        total_ms = (self.timings or {}).get("total_ms")
        duration_ms = proof_duration_ms(self.engine_progress.partitions, total_ms)
        if duration_ms is not None:
            return timedelta(milliseconds=duration_ms)
        if self.started_at is not None and self.finished_at is not None:
            return self.finished_at - self.started_at
        return None

    def fail(self, error: str, **fields) -> None:
        """Fail the job; every failure is an Event, wherever it was found."""
        self.move_to(self.Status.FAILED, error=error, **fields)
        Event.record("proof", f"proof {self.pk} failed: {error}", machine=self.machine,
                     level=Event.Level.ERROR, data={"job": str(self.pk)})

    def take_progress(self, progress: JobProgress) -> bool:
        """Keep the engine's latest view of this job (False: nothing new). A dispatched job is
        running once its pipeline is; a pipeline the engine cancelled never ran, and its result
        re-queues the job instead."""
        stored = progress.to_json()
        if self.status == self.Status.RUNNING and self.progress is not None and \
                _unchanged(stored, self.progress):
            return False
        if self.status == self.Status.DISPATCHED and progress.status in ("running", "done",
                                                                         "failed"):
            self.move_to(self.Status.RUNNING, progress=stored)
        else:
            self.progress = stored
            self.save(update_fields=["progress"])
        return True

    def requeue(self, reason: str) -> None:
        """Its engine lost it (or will never finish it): back to the queue, unless an operator
        asked to cancel it, which the loss completes."""
        if self.cancel_requested:
            self.move_to(self.Status.CANCELLED, error=f"cancelled by the operator ({reason})")
            return
        machine = self.machine
        source = machine.name if machine else "its machine"
        self.move_to(self.Status.QUEUED, engine_job_id="", progress=None)
        waits = f"; it waits for {source}, the machine its user chose" if self.pinned else ""
        Event.record("proof", f"proof {self.pk} re-queued from {source}: {reason}{waits}",
                     machine=machine, level=Event.Level.WARNING, data={"job": str(self.pk)})

    # ---- operator actions ------------------------------------------------------------------

    def may_be_changed_by(self, user) -> bool:
        """Staff may act on any proof, everyone else on the proofs they started."""
        return bool(user.is_staff or (self.requested_by_id and self.requested_by_id == user.pk))

    @property
    def can_cancel(self) -> bool:
        return not self.is_final and not self.cancel_requested

    @property
    def can_retry(self) -> bool:
        return self.status in (self.Status.FAILED, self.Status.CANCELLED)

    def request_cancel(self, user) -> None:
        """A queued job is cancelled at once; one on an engine is marked for the controller,
        which cancels it there (DELETE /v1/proofs/{id}) and records the engine's answer."""
        if self.status == self.Status.QUEUED:
            self.move_to(self.Status.CANCELLED, cancel_requested=True,
                         error="cancelled by the operator before it reached an engine")
        elif not self.is_final:
            self.cancel_requested = True
            self.save(update_fields=["cancel_requested"])
        Event.record("proof", f"proof {self.pk}: cancel requested by {user.get_username()}",
                     machine=self.machine, data={"job": str(self.pk)})

    def retry(self, user) -> tuple[ProofJob, bool]:
        """This job's retry and whether this call created it: a new queued job with the same
        kind, profile, seed and priority, once (a second click, from another tab, gets the
        first retry back). A job pinned to a machine stays pinned there while that machine can
        take it; otherwise the machine is chosen again (the one it had may be why it failed)."""
        with transaction.atomic():
            # The claim is a conditional UPDATE, the transaction's first statement: of two
            # retries at once, the database lets one set the flag and makes the other wait
            # for it, then find it set, on any database and in any transaction mode
            # (SQLite has no SELECT ... FOR UPDATE; a deferred transaction that read first
            # could not wait for the other's write and failed with "database is locked").
            claimed = ProofJob.objects.filter(pk=self.pk, retried=False).update(retried=True)
            earlier = self.retries.order_by("submitted_at").first()
            if not claimed and earlier is not None:
                return earlier, False
            keep = (self.pinned and self.machine is not None
                    and self.machine.unusable_reason() is None)
            retry = ProofJob.objects.create(
                kind=self.kind, profile=self.profile, seed=self.seed, priority=self.priority,
                requested_by=user, retry_of=self, machine=self.machine if keep else None,
                pinned=keep)
        Event.record("proof", f"proof {self.pk} retried by {user.get_username()} as {retry.pk}"
                     + (f" on {self.machine}" if keep else ""),
                     machine=self.machine, data={"job": str(retry.pk), "retry_of": str(self.pk)})
        return retry, True

    # ---- progress and durations ------------------------------------------------------------

    @property
    def duration(self) -> timedelta | None:
        """An ended job's `engine_duration`; a running one's time since it was seen running
        (pages say "so far")."""
        if self.is_final:
            return self.engine_duration
        return None if self.started_at is None else timezone.now() - self.started_at

    @property
    def shown_status(self) -> str:
        """The status as pages show it: a running job none of whose partitions has reached a
        device yet is `waiting` (for a device), not "running 0/16"."""
        progress = self.engine_progress
        if self.status == self.Status.RUNNING:
            return progress.phase or self.status
        if self.status in UNSETTLED_PHASE and not progress.settled:
            # ended, but a partition was still on a device or finalizing when last seen
            return UNSETTLED_PHASE[self.status]
        return self.status

    @property
    def shown_label(self) -> str:
        return PHASE_LABELS.get(self.shown_status, self.shown_status)

    @property
    def shown_title(self) -> str:
        return PHASE_TITLES.get(self.shown_status, "")

    @property
    def engine_progress(self) -> JobProgress:
        """`progress`, read: the job's pipeline as last seen on its engine."""
        return JobProgress.from_json(self.progress)

    def partition_counts(self) -> tuple[int, int]:
        progress = self.engine_progress
        return progress.count("done"), len(progress.partitions)

    def progress_summary(self) -> dict | None:
        """Progress % from the partition counts and the time left (`progress.remaining_s`,
        None while there is no basis for a number). None when there is nothing to show."""
        if self.is_final:
            return None
        done, total = self.partition_counts()
        if not total:
            return None
        now = timezone.now()
        progress = self.engine_progress
        spans = [] if progress.ready_s is None else self.recent_proving_spans(self.kind,
                                                                             self.profile)
        eta = remaining_s(progress, now.timestamp(), spans)
        # `as_of` labels the ETA; the page counts it down from then.
        return {"done": done, "total": total, "percent": round(100 * done / total),
                "eta_seconds": None if eta is None else round(eta), "as_of": now}

    @classmethod
    def recent_proving_spans(cls, kind: str, profile: str, limit: int = 20) -> list[float]:
        """How long recent done jobs of this kind and profile took on their engine once they
        had their parameters (seconds): their wait in the engine's queue and for parameters
        (a first use generates them) says nothing about the next job's proving."""
        spans = []
        for timings in (cls.objects.filter(kind=kind, profile=profile, status=cls.Status.DONE)
                        .order_by("-finished_at").values_list("timings", flat=True)[:limit]):
            total = (timings or {}).get("total_ms")
            if total is not None:
                waited = (timings.get("queue_ms") or 0.0) + (timings.get("srs_load_ms") or 0.0)
                spans.append(max(total - waited, 0.0) / 1000.0)
        return spans

    @classmethod
    def unfinished_by_place(cls) -> dict[str, int]:
        """Unfinished jobs by where they are: `queued` in the dashboard (no engine has them:
        each goes to the first with room, urgent kinds at once), `dispatched` to an engine
        that has not started them, `running` there."""
        places = (cls.Status.QUEUED, cls.Status.DISPATCHED, cls.Status.RUNNING)
        counts = dict(cls.objects.filter(status__in=places).values("status")
                      .annotate(n=models.Count("pk")).values_list("status", "n"))
        return {str(place): counts.get(place, 0) for place in places}

    @classmethod
    def duration_percentiles(cls, since: timedelta = timedelta(hours=24)) -> list[dict]:
        """p50/p95 of done proofs' durations per kind and profile over the window."""
        rows = (cls.objects.filter(status=cls.Status.DONE, engine_duration__isnull=False,
                                   finished_at__gte=timezone.now() - since)
                .values_list("kind", "profile", "engine_duration"))
        groups: dict[tuple[str, str], list[float]] = {}
        for kind, profile, took in rows:
            groups.setdefault((kind, profile), []).append(took.total_seconds())
        return [{"kind": kind, "profile": profile, "count": len(values),
                 "p50": _percentile(values, 50), "p95": _percentile(values, 95)}
                for (kind, profile), values in sorted(groups.items())]


def _unchanged(new: dict, old: dict) -> bool:
    return all(new.get(k) == old.get(k) for k in new.keys() | old.keys() if k not in _TICKING)


def _percentile(values: list[float], pct: int) -> float:
    """Nearest-rank percentile: always a duration that was actually measured."""
    ordered = sorted(values)
    rank = max(1, -(-pct * len(ordered) // 100))
    return ordered[rank - 1]


class BenchmarkProof(models.Model):
    """One proof an operator asked an upstream cuzk daemon to make, to measure the machine: the
    input (a PoRep C1 output, or one vanilla proof of a PoSt sector or SnapDeals partition) and
    its parameters, submitted with gRPC SubmitProof and followed with AwaitProof by the fleet
    controller; the timings are upstream's own. `proofs_per_hour` and `dollars_per_proof` are
    derived here, once, for every page.

    The request id (which upstream makes the job id) is `vastmgr-bench-<pk>`, so a controller
    that restarts mid-proof awaits the same job again instead of submitting a second."""

    class Status(models.TextChoices):
        QUEUED = "queued"  # stored, not sent yet (the daemon is not connected)
        SUBMITTED = "submitted"  # the daemon has it; awaited
        COMPLETED = "completed"
        FAILED = "failed"

    # Upstream's ProofKind, in the words its status uses.
    KINDS = ("porep-c2", "snap-update", "window-post", "winning-post")
    MAX_INPUT_BYTES = 128 * 1024 * 1024  # the daemon's message limit (the request must fit)

    machine = models.ForeignKey("fleet.Machine", on_delete=models.CASCADE,
                                related_name="benchmarks")
    proof_kind = models.CharField(max_length=20, choices=[(k, k) for k in KINDS])
    registered_proof = models.PositiveBigIntegerField()
    sector_size = models.PositiveBigIntegerField()
    miner_id = models.PositiveBigIntegerField()
    sector_number = models.PositiveBigIntegerField()
    randomness = models.BinaryField(blank=True, default=b"")
    partition_index = models.PositiveIntegerField(default=0)
    input_name = models.CharField(max_length=500, help_text="the uploaded file's name, or its path")
    input_bytes = models.BinaryField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    job_id = models.CharField(max_length=200, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    assigned_gpu = models.CharField(max_length=100, blank=True)
    queue_wait_ms = models.PositiveBigIntegerField(null=True, blank=True)
    srs_load_ms = models.PositiveBigIntegerField(null=True, blank=True)
    synthesis_ms = models.PositiveBigIntegerField(null=True, blank=True)
    gpu_compute_ms = models.PositiveBigIntegerField(null=True, blank=True)
    total_ms = models.PositiveBigIntegerField(null=True, blank=True)
    proof_bytes = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # The machine's price when the proof completed: $/proof stays what it was then.
    price_per_hour = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    cancel_requested = models.DateTimeField(null=True, blank=True)
    cancel_answer = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(default=timezone.now)
    submitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"benchmark {self.pk} {self.proof_kind} on {self.machine_id}: {self.status}"

    @property
    def request_id(self) -> str:
        return f"vastmgr-bench-{self.pk}"

    @property
    def proofs_per_hour(self) -> float | None:
        """One proof alone, end to end: 3600 s over its total time. A daemon proving several at
        once overlaps them, so this is the floor of its throughput."""
        if self.status != self.Status.COMPLETED or not self.total_ms:
            return None
        return 3_600_000 / self.total_ms

    @property
    def dollars_per_proof(self) -> float | None:
        rate = self.proofs_per_hour
        if rate is None or self.price_per_hour is None:
            return None
        return float(self.price_per_hour) / rate
