from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from vastmgr.lib.errors import AppendOnlyError
from vastmgr.lib.transitions import check_transition


class MachineQuerySet(models.QuerySet):
    def update(self, **kwargs):
        # `updated` is the fleet controller's change marker: it re-reads only the machines
        # whose marker moved, so a bulk update moves it too.
        kwargs.setdefault("updated", timezone.now())
        return super().update(**kwargs)


class Machine(models.Model):
    """A host running (or about to run) a proving engine."""

    class Provider(models.TextChoices):
        LOCAL = "local"
        SSH = "ssh"
        VAST = "vast"

    class Flavour(models.TextChoices):
        """Which daemon answers on the engine port. Upstream is Curio's Rust `cuzk`: only its
        status server (`GET /status`) is spoken; its proving API is gRPC, which we do not drive."""

        CUZK_ENGINE = "cuzk_engine", "cuzk_engine (this project's engine)"
        CUZK_UPSTREAM = "cuzk-upstream", "cuzk-upstream (Curio's Rust cuzk daemon, watch only)"

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

    NAME_MAX_LENGTH = 100
    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    provider = models.CharField(max_length=10, choices=Provider.choices, default=Provider.SSH)
    host = models.CharField(max_length=255, blank=True, help_text="Hostname or IP for SSH")
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=64, default="root")
    engine_port = models.PositiveIntegerField(default=9821)
    engine_token = models.CharField(
        max_length=200, blank=True, help_text="Bearer token of the engine API (never displayed)"
    )
    engine_flavour = models.CharField(max_length=20, choices=Flavour.choices,
                                      default=Flavour.CUZK_ENGINE)
    # An upstream cuzk daemon's gRPC API as seen on the machine: grpc://HOST:PORT or
    # unix:///path/to/cuzk.sock (transport.DaemonAddress). Empty: watched through its HTTP status
    # server only. With it, engine_port names the status server, 0 when it is off (Curio's
    # default).
    engine_url = models.CharField(max_length=255, blank=True)
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

    objects = MachineQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        # `updated` is the fleet controller's change marker (it re-reads only the machines
        # whose marker moved): a save of some fields moves it too.
        fields = kwargs.get("update_fields")
        if fields is not None and "updated" not in fields:
            kwargs["update_fields"] = [*fields, "updated"]
        super().save(*args, **kwargs)

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
            if target == self.State.KILLED:
                # A killed machine bills nothing (the ledger's intervals end with it).
                BillingInterval.objects.filter(machine=self, ended_at__isnull=True).update(
                    ended_at=timezone.now())
            Event.record(
                "lifecycle",
                f"{self.name}: {previous} → {target}" + (f" ({reason})" if reason else ""),
                machine=self,
                data={"from": previous, "to": target, "reason": reason,
                      "by": user.get_username() if user else None},
            )

    def kill(self, reason: str, *, user=None) -> None:
        self.transition(self.State.KILLED, reason=reason, user=user)

    @property
    def is_upstream(self) -> bool:
        return self.engine_flavour == self.Flavour.CUZK_UPSTREAM

    @property
    def speaks_grpc(self) -> bool:
        """An upstream daemon whose gRPC API we reach (not only its status server)."""
        return self.is_upstream and bool(self.engine_url)

    @property
    def status_server(self) -> bool:
        """Whether there is an HTTP status server to poll: our engine's API, or an upstream
        daemon's `status_listen` (off by default there)."""
        return not self.speaks_grpc or self.engine_port != 0

    def destroy_refusal(self) -> str:
        """Why this machine can never be destroyed ('' when it can, or already was): the
        pages hide its Destroy button, and every destroy path refuses with this."""
        if self.provider == self.Provider.LOCAL:
            return (f"{self.name} is the local engine, which `./dev up` runs on this host: it "
                    "cannot be destroyed from the dashboard (stop the stack instead)")
        return ""

    @property
    def can_prove(self) -> bool:
        """Whether vastmgr can submit proofs and SRS actions to this machine's engine."""
        return not self.is_upstream

    def unusable_reason(self) -> str | None:
        """Why a job pinned to this machine can never run there (None: it can, maybe later)."""
        if self.state == self.State.KILLED:
            return f"machine {self.name} was killed ({self.kill_reason})"
        if not self.enabled:
            return f"machine {self.name} is disabled"
        if not self.can_prove:
            return (f"machine {self.name} runs an upstream cuzk daemon, which is watched only "
                    "(its proving API is gRPC)")
        return None

    def not_proving_reason(self) -> str | None:
        """Why a test proof started here now would not run at once (None: the machine is
        running), so the host page offers no proof that could only wait."""
        if reason := self.unusable_reason():
            return reason
        if self.state != self.State.RUNNING:
            return f"machine {self.name} is {self.state}: it proves once it is running"
        return None

    def mark_seen(self, when=None) -> None:
        self.last_seen = when or timezone.now()
        self.save(update_fields=["last_seen"])


class Event(models.Model):
    """An append-only audit record: lifecycle changes, provider calls, failures, alerts."""

    class Level(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    # `data[RECOVERS]` true: this Event says a failure (an Event of the same kind, or alert,
    # and machine, at warning or above) is over. Notification channels told of the failure are
    # told of its end too (vastmgr/notify).
    RECOVERS = "recovers"

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


class MachineStatus(models.Model):
    """The fleet controller's latest view of one machine's engine, shared by every dashboard process.

    Pages and consumers render from this row, so a browser that (re)connects to any daphne
    process sees the same state. `connected` is the controller's word on the link; whether the
    data is still fresh is judged from `last_seen` at render time, so a dead controller can
    never leave a host looking live.
    """

    machine = models.OneToOneField(Machine, on_delete=models.CASCADE, related_name="live")
    connected = models.BooleanField(default=False)
    via = models.CharField(max_length=10, blank=True, help_text="stream or poll")
    interval = models.FloatField(default=1.0, help_text="Expected seconds between snapshots")
    seq = models.BigIntegerField(null=True, blank=True)
    snapshot = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    updated = models.DateTimeField(default=timezone.now)
    # The snapshot's times ("last used N s ago", busy N s) are relative to when it was taken;
    # an idle engine keeps its seq, so the stored snapshot can be much older than `updated`.
    snapshot_at = models.DateTimeField(null=True, blank=True)
    # Since when (controller clock) a worker has sat idle while synthesized work waited.
    idle_waiting_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.machine.name}: {'connected' if self.connected else 'down'}"


class MachineSample(models.Model):
    """A downsampled history point (one every few seconds per host), pruned by age."""

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="samples")
    time = models.DateTimeField(default=timezone.now, db_index=True)
    busy_fraction = models.FloatField(help_text="Share of GPU workers proving, 0..1")
    busy_by_device = models.JSONField(default=dict, blank=True)
    proofs_completed = models.BigIntegerField(help_text="Engine counter (cumulative)")
    proofs_failed = models.BigIntegerField(default=0)
    queue_depth = models.IntegerField(default=0)
    busy_seconds = models.FloatField(
        null=True, blank=True,
        help_text="Engine counter: worker-seconds spent on a device since engine start")
    workers = models.IntegerField(default=0)
    memory_used = models.BigIntegerField(default=0)
    memory_total = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["machine", "time"]
        indexes = [models.Index(fields=["machine", "time"])]


class MachineAction(models.Model):
    """An operator's request to an engine (SRS preload/evict), carried out by the controller."""

    class Action(models.TextChoices):
        PRELOAD = "preload"
        EVICT = "evict"

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="actions")
    action = models.CharField(max_length=10, choices=Action.choices)
    circuit_id = models.CharField(max_length=200)
    created = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["created"]


class ControllerHeartbeat(models.Model):
    """A running fleet controller (scale-out mode), alive while `expires` is in the future.

    Controllers count each other here to know their fair share of the hosts, including a
    controller that has just started and owns nothing yet.
    """

    name = models.CharField(max_length=200, primary_key=True)
    expires = models.DateTimeField()

    @classmethod
    def beat(cls, name: str, period: float) -> int:
        """Renew `name`; return how many controllers are alive (this one included)."""
        now = timezone.now()
        cls.objects.update_or_create(name=name,
                                     defaults={"expires": now + timedelta(seconds=period)})
        cls.objects.filter(expires__lt=now - timedelta(seconds=period)).delete()
        return cls.objects.filter(expires__gt=now).count()

    @classmethod
    def leave(cls, name: str) -> None:
        cls.objects.filter(name=name).delete()


class MachineLease(models.Model):
    """Which fleet controller watches a machine (and dispatches to it) until `expires`.

    In the scale-out mode every controller renews its leases on a heartbeat; a lease that
    lapses (its controller died or stalled) is free for another to claim. Claims take rows
    with SELECT … FOR UPDATE SKIP LOCKED, so two controllers never claim the same host, and
    each claims at most its fair share, so hosts spread over the controllers.
    """

    machine = models.OneToOneField(Machine, on_delete=models.CASCADE, primary_key=True,
                                   related_name="lease")
    owner = models.CharField(max_length=200, blank=True, db_index=True)
    expires = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.machine_id}: {self.owner or 'free'} until {self.expires}"

    @classmethod
    def renew(cls, owner: str, period: float, controllers: int) -> set[int]:
        """One heartbeat of `owner`: renew what it holds, give back what exceeds its fair share
        of the watchable machines, claim free or lapsed leases up to that share. Returns the
        machine ids `owner` holds now, each until at least `period` seconds from now."""
        now = timezone.now()
        until = now + timedelta(seconds=period)
        watchable = Machine.objects.filter(enabled=True).exclude(state=Machine.State.KILLED)
        with transaction.atomic():
            present = set(cls.objects.values_list("machine_id", flat=True))
            # django-stubs types cls(...) as MachineLease, not Self (typeddjango/django-stubs#3401).
            cls.objects.bulk_create(
                [cls(machine_id=machine_id) for machine_id in  # type: ignore[misc]
                 watchable.exclude(pk__in=present).values_list("pk", flat=True)],
                ignore_conflicts=True)
            cls.objects.filter(owner=owner).exclude(machine__in=watchable).update(
                owner="", expires=None)
            held = cls.objects.filter(owner=owner)
            held.update(expires=until)
            mine = sorted(held.values_list("machine_id", flat=True))
            share = -(-watchable.count() // max(controllers, 1))  # ceiling
            if len(mine) > share:
                cls.objects.filter(machine_id__in=mine[share:], owner=owner).update(
                    owner="", expires=None)
                mine = mine[:share]
            elif len(mine) < share:
                free = list(cls.objects.select_for_update(skip_locked=True, of=("self",))
                            .filter(machine__in=watchable)
                            .filter(models.Q(owner="") | models.Q(expires__lt=now))
                            .order_by("machine_id")
                            .values_list("machine_id", flat=True)[:share - len(mine)])
                cls.objects.filter(machine_id__in=free).update(owner=owner, expires=until)
                mine += free
        return set(mine)

    @classmethod
    def release(cls, owner: str) -> None:
        """Give every lease of `owner` back at once (a clean shutdown)."""
        cls.objects.filter(owner=owner).update(owner="", expires=None)


class BillingInterval(models.Model):
    """One stretch of a rental billed at one rate: what the ledger (vastmgr.fleet.ledger) sums.
    Kept for ever, the machine's deletion included (its name stays), so spend never goes down."""

    class Kind(models.TextChoices):
        RUNNING = "running"  # the GPUs and the disk bill: the rental's whole $/h
        STORED = "stored"  # stopped: only the disk bills

    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="billing_intervals")
    machine_name = models.CharField(max_length=Machine.NAME_MAX_LENGTH)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    dollars_per_hour = models.DecimalField(max_digits=10, decimal_places=6)
    # The GPUs billed in this interval (none while stored).
    gpus = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # What wrote it: "rent", "price change", "stop", "start", "registered"...
    cause = models.CharField(max_length=40)

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [models.UniqueConstraint(
            fields=["machine"], condition=models.Q(ended_at__isnull=True),
            name="one_open_billing_interval_per_machine")]

    def __str__(self) -> str:
        return (f"{self.machine_name} {self.kind} ${self.dollars_per_hour}/h from "
                f"{self.started_at:%Y-%m-%d %H:%M:%S}")


class ProviderBill(models.Model):
    """What the provider last billed for one rental (Vast's `GET /api/v0/charges/`), all time:
    the figure the ledger's estimate is held against."""

    machine = models.OneToOneField(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="provider_bill")
    machine_name = models.CharField(max_length=Machine.NAME_MAX_LENGTH)
    instance_id = models.BigIntegerField(unique=True)
    dollars = models.DecimalField(max_digits=12, decimal_places=4)
    # The provider's breakdown: {"gpu": $, "disk": $, "bwd": $, "bwu": $} as far as reported.
    items = models.JSONField(default=dict, blank=True)
    fetched_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.machine_name}: ${self.dollars} billed (as of {self.fetched_at})"
