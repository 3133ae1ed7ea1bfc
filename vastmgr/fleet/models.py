from django.db import models, transaction
from django.utils import timezone

from vastmgr.transitions import check_transition


class Machine(models.Model):
    """A host running (or about to run) a proving engine."""

    class Provider(models.TextChoices):
        LOCAL = "local"
        SSH = "ssh"
        VAST = "vast"

    class State(models.TextChoices):
        REGISTERED = "registered"
        PROVISIONING = "provisioning"
        PARAMS_READY = "params_ready"
        BENCHMARKED = "benchmarked"
        RUNNING = "running"
        STOPPED = "stopped"
        KILLED = "killed"

    # A local engine needs no provisioning, so `registered` may go straight to `running`;
    # a failed provisioning step returns the host to `registered` for another try.
    TRANSITIONS = {
        State.REGISTERED: {State.PROVISIONING, State.RUNNING, State.KILLED},
        State.PROVISIONING: {State.PARAMS_READY, State.REGISTERED, State.KILLED},
        State.PARAMS_READY: {State.BENCHMARKED, State.PROVISIONING, State.KILLED},
        State.BENCHMARKED: {State.RUNNING, State.PROVISIONING, State.KILLED},
        State.RUNNING: {State.STOPPED, State.PROVISIONING, State.KILLED},
        State.STOPPED: {State.RUNNING, State.PROVISIONING, State.KILLED},
        State.KILLED: set(),
    }

    name = models.CharField(max_length=100, unique=True)
    provider = models.CharField(max_length=10, choices=Provider.choices, default=Provider.SSH)
    host = models.CharField(max_length=255, blank=True, help_text="Hostname or IP for SSH")
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=64, default="root")
    engine_port = models.PositiveIntegerField(default=9821)
    engine_token = models.CharField(
        max_length=200, blank=True, help_text="Bearer token of the engine API (never displayed)"
    )
    state = models.CharField(max_length=20, choices=State.choices, default=State.REGISTERED)
    kill_reason = models.TextField(blank=True)
    enabled = models.BooleanField(default=True, help_text="Stream status and dispatch jobs")
    gpu_name = models.CharField(max_length=100, blank=True)
    gpu_count = models.PositiveIntegerField(default=0)
    price_per_hour = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    bench_rate = models.FloatField(null=True, blank=True, help_text="Proofs per hour")
    last_seen = models.DateTimeField(null=True, blank=True)
    vast_instance_id = models.BigIntegerField(null=True, blank=True)
    vast_machine_id = models.BigIntegerField(null=True, blank=True)
    vast_host_id = models.BigIntegerField(null=True, blank=True)
    ssh_host_key = models.TextField(blank=True, help_text="Pinned on first contact")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        # Never include the engine token, even in debugging output.
        return f"<Machine {self.pk} {self.name!r} {self.provider} {self.state}>"

    def transition(self, target: str, *, reason: str = "", user=None) -> None:
        """Move to `target` (saved, with an Event), or raise IllegalTransition."""
        check_transition(f"machine {self.name}", self.TRANSITIONS, self.state, target)
        if target == self.State.KILLED and not reason:
            raise ValueError(f"machine {self.name}: killing needs a reason")
        previous = self.state
        with transaction.atomic():
            self.state = target
            self.kill_reason = reason if target == self.State.KILLED else ""
            self.save(update_fields=["state", "kill_reason", "updated"])
            Event.record(
                "lifecycle",
                f"{self.name}: {previous} → {target}" + (f" ({reason})" if reason else ""),
                machine=self,
                data={"from": previous, "to": target, "reason": reason,
                      "by": user.get_username() if user else None},
            )

    def kill(self, reason: str, *, user=None) -> None:
        self.transition(self.State.KILLED, reason=reason, user=user)

    def mark_seen(self, when=None) -> None:
        self.last_seen = when or timezone.now()
        self.save(update_fields=["last_seen"])


class AppendOnlyError(RuntimeError):
    pass


class Event(models.Model):
    """An append-only audit record: lifecycle changes, provider calls, failures, alerts."""

    class Level(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    time = models.DateTimeField(default=timezone.now, db_index=True)
    machine = models.ForeignKey(
        Machine, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    level = models.CharField(max_length=10, choices=Level.choices, default=Level.INFO)
    kind = models.CharField(max_length=40, db_index=True)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"[{self.level}] {self.kind}: {self.message}"

    @classmethod
    def record(cls, kind: str, message: str, *, machine=None, level=Level.INFO, data=None):
        return cls.objects.create(
            kind=kind, message=message, machine=machine, level=level, data=data or {}
        )

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise AppendOnlyError("events are append-only: an existing event cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("events are append-only: they cannot be deleted")
