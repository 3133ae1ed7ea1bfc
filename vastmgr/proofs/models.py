import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils import timezone

from vastmgr.transitions import check_transition

# The engine accepts seeds up to 2**64 - 1; the database's signed 64-bit integer stops earlier.
MAX_SEED = 2**63 - 1


class ProofJob(models.Model):
    """One test proof requested from the dashboard, dispatched to one machine's engine."""

    class Kind(models.TextChoices):
        WINNING_POST = "winning-post"
        WINDOW_POST = "window-post"
        SNAP_UPDATE = "snap-update"
        POREP_C2 = "porep-c2"

    class Profile(models.TextChoices):
        TINY = "tiny"
        SMALL = "small"
        MEDIUM = "medium"
        LARGE = "large"

    class Priority(models.TextChoices):
        CRITICAL = "critical"
        HIGH = "high"
        NORMAL = "normal"
        LOW = "low"

    class Status(models.TextChoices):
        QUEUED = "queued"
        DISPATCHED = "dispatched"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINAL = {Status.DONE, Status.FAILED, Status.CANCELLED}
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
    kind = models.CharField(max_length=20, choices=Kind.choices)
    profile = models.CharField(max_length=10, choices=Profile.choices, default=Profile.TINY)
    seed = models.PositiveBigIntegerField(validators=[MaxValueValidator(MAX_SEED)])
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
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
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

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

    def fail(self, error: str, **fields) -> None:
        self.move_to(self.Status.FAILED, error=error, **fields)
