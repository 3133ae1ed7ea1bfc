"""The rows behind vast-manager's instance protocol: instances that called home, the secrets
deployments present, and the log lines instances push.

The states and their rules are vast-manager's (cmd/vast-manager/main.go in Curio's history):
register → params_done → bench_done → running, killed at any point; a failed benchmark kills.
When an instance is one of our Vast machines (its label is `C.<instance id>`, as Vast sets
VAST_CONTAINERLABEL, or it presented the secret issued for that machine), the machine follows
along through its own state machine, each step an Event.
"""

import hashlib
import secrets
import uuid
from datetime import timedelta

from django.db import models, transaction
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine

SECRET_ENV = "VASTMGR_CALLHOME_SECRET"
LOG_LINES_PER_INSTANCE = 10_000  # vast-manager's per-instance buffer
LOG_PUSH_MAX_BYTES = 256 * 1024  # a push is read up to this much; the rest is dropped
# Log buffers of uuids that never registered: at most this many, the oldest dropped first.
STRAY_LOG_BUFFERS = 50
KILLED_KEPT = timedelta(days=7)  # vast-manager purged killed rows after a week
DEFAULT_MIN_RATE = 50.0  # what register assumes when min_rate is missing or not positive
UUID_MAX = 100
SOURCE_MAX = 64


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class DeploySecret(models.Model):
    """A secret handed to one deployment in its environment (VASTMGR_CALLHOME_SECRET); only
    its SHA-256 is kept (it is 32 random bytes, so no slow hash is needed)."""

    digest = models.CharField(max_length=64, unique=True)
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="callhome_secrets")
    note = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"call-home secret {self.pk} ({self.note or self.machine or 'no machine'})"

    @classmethod
    def issue(cls, *, machine: Machine | None = None, note: str = "") -> str:
        """A new secret (returned once, never stored in clear)."""
        secret = "vmch_" + secrets.token_urlsafe(32)
        cls.objects.create(digest=_digest(secret), machine=machine, note=note[:200])
        return secret

    @classmethod
    def find(cls, secret: str) -> "DeploySecret | None":
        return cls.objects.select_related("machine").filter(digest=_digest(secret)).first()


class RunnerSequence(models.Model):
    """The last runner id handed out: ids are never reused, even after rows are purged."""

    last = models.BigIntegerField(default=0)

    @classmethod
    def next(cls) -> int:
        row, _ = cls.objects.select_for_update().get_or_create(pk=1)
        row.last += 1
        row.save(update_fields=["last"])
        return row.last


class Instance(models.Model):
    """One instance as vast-manager's protocol knows it."""

    class State(models.TextChoices):
        REGISTERED = "registered"
        PARAMS_DONE = "params_done"
        BENCH_DONE = "bench_done"
        RUNNING = "running"
        KILLED = "killed"

    # The machine state each protocol state corresponds to, reached step by step.
    MACHINE_PATH = (Machine.State.REGISTERED, Machine.State.PROVISIONING,
                    Machine.State.PARAMS_READY, Machine.State.BENCHMARKED, Machine.State.RUNNING)
    MACHINE_STATE = {State.PARAMS_DONE: Machine.State.PARAMS_READY,
                     State.BENCH_DONE: Machine.State.BENCHMARKED,
                     State.RUNNING: Machine.State.RUNNING}

    uuid = models.CharField(max_length=36, unique=True)
    label = models.CharField(max_length=200, db_index=True)
    runner_id = models.BigIntegerField(unique=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.REGISTERED)
    min_rate = models.FloatField(default=DEFAULT_MIN_RATE)
    registered_at = models.DateTimeField(default=timezone.now)
    param_done_at = models.DateTimeField(null=True, blank=True)
    bench_done_at = models.DateTimeField(null=True, blank=True)
    bench_rate = models.FloatField(null=True, blank=True)
    killed_at = models.DateTimeField(null=True, blank=True)
    kill_reason = models.TextField(blank=True)
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="callhome_instances")
    secret = models.ForeignKey(DeploySecret, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="instances")

    class Meta:
        ordering = ["-runner_id"]

    def __str__(self) -> str:
        return f"{self.label} ({self.uuid}, runner {self.runner_id}, {self.state})"

    @property
    def vast_id(self) -> int | None:
        """The Vast instance id in a `C.<id>` label (Vast's VAST_CONTAINERLABEL)."""
        if self.label.startswith("C.") and self.label[2:].isascii() and self.label[2:].isdigit():
            return int(self.label[2:])
        return None

    @classmethod
    def register(cls, label: str, min_rate: float, secret: DeploySecret | None
                 ) -> "Instance":
        """The live instance with this label (a re-register gets the same uuid and runner id),
        or a new one."""
        with transaction.atomic():
            existing = cls.objects.select_for_update().filter(label=label).exclude(
                state=cls.State.KILLED).first()
            if existing is not None:
                return existing
            instance = cls.objects.create(
                uuid=str(uuid.uuid4()), label=label, runner_id=RunnerSequence.next(),
                min_rate=min_rate if min_rate > 0 else DEFAULT_MIN_RATE, secret=secret,
                machine=secret.machine if secret and secret.machine else None)
            if instance.machine is None:
                instance.machine = instance.find_machine()
                instance.save(update_fields=["machine"])
            instance.note(f"registered as runner {instance.runner_id} (label {label}, "
                          f"min rate {instance.min_rate:g} proofs/h)")
        return instance

    def find_machine(self) -> Machine | None:
        vast_id = self.vast_id
        if vast_id is None:
            return None
        return Machine.objects.filter(provider=Machine.Provider.VAST,
                                      vast_instance_id=vast_id).exclude(
            state=Machine.State.KILLED).first()

    def params_done(self) -> None:
        """registered → params_done; any other state is left as it is."""
        if self.state != self.State.REGISTERED:
            return
        self.state, self.param_done_at = self.State.PARAMS_DONE, timezone.now()
        self.save(update_fields=["state", "param_done_at"])
        self.note("parameters fetched")
        self.follow()

    def bench_done(self, rate: float) -> bool:
        """Record the benchmark; passed when rate >= min_rate, otherwise the instance is killed
        (the caller destroys its Vast instance). A killed instance stays killed."""
        passed = rate >= self.min_rate
        self.bench_rate, self.bench_done_at = rate, timezone.now()
        fields = ["bench_rate", "bench_done_at"]
        if self.state != self.State.KILLED:
            if passed:
                self.state = self.State.BENCH_DONE
                fields.append("state")
            else:
                self.kill(f"bench_rate {rate:.1f} below min_rate {self.min_rate:.1f}",
                          save=False)
                fields += ["state", "killed_at", "kill_reason"]
        self.save(update_fields=fields)
        self.note(f"benchmark {rate:g} proofs/h, minimum {self.min_rate:g}: "
                  f"{'passed' if passed else 'failed'}",
                  level=Event.Level.INFO if passed else Event.Level.WARNING)
        if self.machine_id is not None and passed:
            Machine.objects.filter(pk=self.machine_id).update(bench_rate=rate)
            self.follow()
        return passed

    def running(self) -> None:
        self.state = self.State.RUNNING
        self.save(update_fields=["state"])
        self.note("running")
        self.follow()

    def kill(self, reason: str, *, save: bool = True) -> None:
        self.state, self.killed_at, self.kill_reason = self.State.KILLED, timezone.now(), reason
        if save:
            self.save(update_fields=["state", "killed_at", "kill_reason"])

    def follow(self) -> None:
        """Move the machine to the state matching ours: directly where its state machine
        allows (registered → running), else through the steps the instance took on its own
        (fetching parameters is provisioning). Never backwards."""
        if self.machine_id is None or self.state not in self.MACHINE_STATE:
            return
        machine = Machine.objects.get(pk=self.machine_id)
        target = self.MACHINE_STATE[self.State(self.state)]
        if machine.state not in self.MACHINE_PATH:
            return  # killed or stopped: an operator's word outweighs a call home
        path = self.MACHINE_PATH
        steps = path[path.index(machine.state) + 1: path.index(target) + 1]
        if target in Machine.TRANSITIONS[Machine.State(machine.state)]:
            steps = (target,)
        for step in steps:
            machine.transition(step, reason=f"runner {self.runner_id} called home")

    def note(self, message: str, level: str = Event.Level.INFO) -> None:
        Event.record("callhome", f"{self.label}: {message}", machine=self.machine, level=level,
                     data={"uuid": self.uuid, "runner_id": self.runner_id})

    @classmethod
    def purge(cls) -> None:
        """Killed instances are forgotten after a week, with their logs."""
        old = cls.objects.filter(state=cls.State.KILLED,
                                 killed_at__lt=timezone.now() - KILLED_KEPT)
        LogLine.objects.filter(uuid__in=old.values("uuid")).delete()
        old.delete()


class LogLine(models.Model):
    """One line an instance pushed, by source (setup, benchdaemon, benchout, cuzk, curio...)."""

    uuid = models.CharField(max_length=UUID_MAX, db_index=True)
    source = models.CharField(max_length=SOURCE_MAX)
    text = models.TextField()
    ts = models.BigIntegerField(help_text="milliseconds since the epoch, when received")

    class Meta:
        ordering = ["id"]

    @classmethod
    def push(cls, uuid: str, source: str, body: bytes) -> int:
        """Store the non-empty lines of `body`; a buffer over its bound loses its oldest tenth
        (vast-manager's rule). Returns how many lines were stored."""
        ts = int(timezone.now().timestamp() * 1000)
        lines = [line for line in body.decode(errors="replace").split("\n") if line]
        if not lines:
            return 0
        lines = lines[-LOG_LINES_PER_INSTANCE:]
        with transaction.atomic():
            if not cls.objects.filter(uuid=uuid).exists() and \
                    not Instance.objects.filter(uuid=uuid).exists():
                cls._make_room_for_stray()
            # django-stubs types cls(...) as LogLine, not Self (typeddjango/django-stubs#3401).
            cls.objects.bulk_create([cls(uuid=uuid, source=source, text=line,  # type: ignore[misc]
                                         ts=ts) for line in lines])
            count = cls.objects.filter(uuid=uuid).count()
            if count > LOG_LINES_PER_INSTANCE:
                # A tenth at a time, as often as needed to fit again.
                tenth = max(LOG_LINES_PER_INSTANCE // 10, 1)
                drop = -(-(count - LOG_LINES_PER_INSTANCE) // tenth) * tenth
                cut = cls.objects.filter(uuid=uuid).order_by("id").values_list(
                    "id", flat=True)[drop - 1]
                cls.objects.filter(uuid=uuid, id__lte=cut).delete()
        return len(lines)

    @classmethod
    def _make_room_for_stray(cls) -> None:
        known = Instance.objects.values("uuid")
        strays = (cls.objects.exclude(uuid__in=known).values("uuid")
                  .annotate(first=models.Min("id")).order_by("-first"))
        for old in strays[STRAY_LOG_BUFFERS - 1:]:
            cls.objects.filter(uuid=old["uuid"]).delete()

    @classmethod
    def tail(cls, uuid: str, source: str = "", limit: int = 1000) -> list["LogLine"]:
        lines = cls.objects.filter(uuid=uuid)
        if source and source != "all":
            lines = lines.filter(source=source)
        return list(reversed(lines.order_by("-id")[:limit]))

    @classmethod
    def by_source(cls, machine: Machine, limit: int = 200) -> dict[str, list["LogLine"]]:
        """The last `limit` lines of each source pushed by the machine's instances."""
        uuids = list(machine.callhome_instances.values_list("uuid", flat=True))
        sources = (cls.objects.filter(uuid__in=uuids).values_list("source", flat=True)
                   .distinct().order_by("source"))
        return {source: list(reversed(cls.objects.filter(uuid__in=uuids, source=source)
                                      .order_by("-id")[:limit]))
                for source in sources}

    def as_json(self) -> dict:
        return {"src": self.source, "text": self.text, "ts": self.ts}
