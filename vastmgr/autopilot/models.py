"""The autopilot's state, kept in the database so it survives restarts: its switch and limits
(one row), the hosts it rented, and the proposals a person approves in dry-run mode."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from vastmgr.autopilot.planner import Decision, Limits
from vastmgr.fleet.models import Event, Machine

EVENT_KIND = "autopilot"
# Minutes from submission to done, per kind ("kind:priority" keys override one priority).
DEFAULT_BUDGETS_MIN = {"winning-post": 0.5, "window-post": 25.0, "snap-update": 360.0,
                       "porep-c2": 90.0}


def default_budgets() -> dict:
    return dict(DEFAULT_BUDGETS_MIN)


class Autopilot(models.Model):
    """The one autopilot: off, proposing (dry run, the default) or acting alone."""

    class Mode(models.TextChoices):
        OFF = "off", "Off"
        DRY_RUN = "dry_run", "Dry run (proposes, a person approves)"
        ACT = "act", "Acts alone"

    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.DRY_RUN)
    max_dollars_per_hour = models.FloatField(default=5.0, validators=[MinValueValidator(0.0)])
    max_hosts = models.PositiveIntegerField(default=8)
    max_rents_per_hour = models.PositiveIntegerField(default=6)
    min_hosts = models.JSONField(default=dict, blank=True, help_text="Warm hosts per kind")
    budgets_min = models.JSONField(default=default_budgets)
    cooldown_min = models.FloatField(default=5.0, validators=[MinValueValidator(0.0)])
    pipeline_margin_min = models.FloatField(default=10.0, validators=[MinValueValidator(0.0)])
    idle_release_min = models.FloatField(default=5.0, validators=[MinValueValidator(0.0)])
    scale_to_zero = models.BooleanField(default=True)
    last_change_at = models.DateTimeField(null=True, blank=True)
    plan = models.JSONField(null=True, blank=True, help_text="The latest plan")
    planned_at = models.DateTimeField(null=True, blank=True)
    # Exactly one process plans at a time (several automation processes in scale-out mode).
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"autopilot ({self.mode})"

    @classmethod
    def current(cls) -> Autopilot:
        pilot, _ = cls.objects.get_or_create(pk=1)
        return pilot

    def limits(self) -> Limits:
        return Limits(max_dollars_per_hour=self.max_dollars_per_hour, max_hosts=self.max_hosts,
                      max_rents_per_hour=self.max_rents_per_hour,
                      min_hosts={k: int(v) for k, v in (self.min_hosts or {}).items()},
                      cooldown_s=self.cooldown_min * 60,
                      pipeline_margin_s=self.pipeline_margin_min * 60,
                      idle_release_s=self.idle_release_min * 60,
                      scale_to_zero=self.scale_to_zero)

    def budget_s(self, kind: str, priority: str) -> float:
        budgets = self.budgets_min or DEFAULT_BUDGETS_MIN
        minutes = budgets.get(f"{kind}:{priority}", budgets.get(kind,
                                                                DEFAULT_BUDGETS_MIN[kind]))
        return float(minutes) * 60

    def set_mode(self, mode: str, user=None) -> None:
        if mode not in self.Mode.values:
            raise ValueError(f"{mode!r} is not an autopilot mode")
        previous = self.mode
        with transaction.atomic():
            self.mode = mode
            self.save(update_fields=["mode"])
            if mode != self.Mode.DRY_RUN:
                Proposal.objects.filter(status=Proposal.Status.PROPOSED).update(
                    status=Proposal.Status.SUPERSEDED, decided_at=timezone.now())
            Event.record(EVENT_KIND, f"autopilot switched from {self.Mode(previous).label} to "
                                     f"{self.Mode(mode).label}",
                         data={"from": previous, "to": mode,
                               "by": user.get_username() if user else None})

    @classmethod
    def claim(cls, owner: str, period_s: float, now: datetime | None = None) -> bool:
        """Hold (or renew) the planning lease for `period_s`; False while another holds it."""
        now = now or timezone.now()
        cls.current()
        taken = cls.objects.filter(pk=1).filter(
            models.Q(lease_owner=owner) | models.Q(lease_owner="")
            | models.Q(lease_expires__lt=now)).update(
            lease_owner=owner, lease_expires=now + timedelta(seconds=period_s))
        return bool(taken)

    @classmethod
    def release(cls, owner: str) -> None:
        cls.objects.filter(pk=1, lease_owner=owner).update(lease_owner="", lease_expires=None)


class ManagedMachine(models.Model):
    """A machine the autopilot rented: only these may it drain or destroy."""

    machine = models.OneToOneField(Machine, on_delete=models.CASCADE, related_name="autopilot")
    offer_id = models.BigIntegerField()
    rented_at = models.DateTimeField(default=timezone.now, db_index=True)
    draining = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.machine.name} (autopilot{', draining' if self.draining else ''})"


def draining_machine_ids() -> set[int]:
    """Machines that take no new work (the dispatcher leaves them out)."""
    return set(ManagedMachine.objects.filter(draining=True).values_list("machine_id", flat=True))


class Proposal(models.Model):
    """One decision of a dry-run plan, waiting for a person (or superseded by a newer plan)."""

    class Status(models.TextChoices):
        PROPOSED = "proposed"
        APPROVED = "approved"  # being carried out
        DONE = "done"
        FAILED = "failed"
        SUPERSEDED = "superseded"

    created = models.DateTimeField(default=timezone.now, db_index=True)
    decision = models.JSONField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PROPOSED)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL)
    decided_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)

    class Meta:
        ordering = ("-created", "-id")

    def __str__(self) -> str:
        return f"{self.status}: {self.decision.get('summary', '')}"

    @property
    def as_decision(self) -> Decision:
        return Decision.from_json(self.decision)

    @classmethod
    def approve(cls, pk: int, user) -> Proposal | None:
        """Take a proposal for carrying out (None: it is no longer open: approved twice,
        superseded by a newer plan, or the autopilot left dry-run)."""
        with transaction.atomic():
            taken = cls.objects.filter(pk=pk, status=cls.Status.PROPOSED).update(
                status=cls.Status.APPROVED, decided_by=user, decided_at=timezone.now())
        return cls.objects.get(pk=pk) if taken else None

    def conclude(self, ok: bool, outcome: str) -> None:
        self.status = self.Status.DONE if ok else self.Status.FAILED
        self.outcome = outcome[:2000]
        self.save(update_fields=["status", "outcome"])

