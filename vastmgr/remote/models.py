from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from vastmgr.fleet.liveness import OUTBID
from vastmgr.fleet.models import Event, Machine
from vastmgr.remote import secrets
from vastmgr.remote.config import format_env, parse_env


class Secret(models.Model):
    """One named secret, encrypted at rest; it is written once and never rendered again."""

    VAST_API_KEY = "vast_api_key"

    name = models.CharField(max_length=100, unique=True)
    ciphertext = models.BinaryField()
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<Secret {self.name!r}>"

    @classmethod
    def store(cls, name: str, value: str) -> "Secret":
        if not value or not value.strip():
            raise ValueError(f"secret {name!r} is empty")
        secret, _ = cls.objects.update_or_create(
            name=name, defaults={"ciphertext": secrets.encrypt(value.strip())}
        )
        return secret

    @classmethod
    def reveal(cls, name: str) -> str:
        try:
            row = cls.objects.get(name=name)
        except cls.DoesNotExist:
            raise secrets.SecretUnavailable(cls.missing_message(name)) from None
        return secrets.decrypt(row.ciphertext, name=name)

    @classmethod
    def missing_message(cls, name: str) -> str:
        """What an operator should do, in their words rather than the secret's internal name."""
        if name == cls.VAST_API_KEY:
            return "Enter your Vast API key first (at the top of the Offers page)"
        if name.startswith("ssh_key:"):
            return ("No SSH private key is stored for this machine (it is entered, or a key "
                    "file named, when the host is added)")
        return f"The {name.replace('_', ' ')} has not been entered yet"

    @classmethod
    def is_set(cls, name: str) -> bool:
        return cls.objects.filter(name=name).exists()


class RemoteMachine(models.Model):
    """What the remote app knows about a machine beyond the fleet's own columns."""

    machine = models.OneToOneField(Machine, on_delete=models.CASCADE, related_name="remote")
    key_file = models.CharField(
        max_length=500, blank=True,
        help_text="Private key file on the dashboard host; empty when a key is stored encrypted",
    )
    remote_dir = models.CharField(max_length=200, default="vastmgr-engine",
                                  help_text="Install directory, relative to the login directory")
    billing_started = models.DateTimeField(null=True, blank=True)
    billing_ended = models.DateTimeField(null=True, blank=True)
    offline_alerted_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # A rented machine's label on Vast, chosen before the create call so that an instance whose
    # create response was lost can still be found and adopted (or destroyed).
    vast_label = models.CharField(max_length=100, blank=True, db_index=True)
    # Vast's `actual_status` at the last reconcile, and since when the instance is down
    # (exited, offline, unknown...): the automation destroys it after a grace period.
    vast_status = models.CharField(max_length=40, blank=True)
    vast_down_since = models.DateTimeField(null=True, blank=True)
    # Which signal told us the status last: the automation's listing (polling) or Vast's
    # notification webhook, and when.
    vast_status_signal = models.CharField(max_length=20, blank=True)
    SIGNAL_POLLING, SIGNAL_WEBHOOK = "polling", "Vast webhook"
    vast_status_at = models.DateTimeField(null=True, blank=True)
    # The instance's hardware facts as Vast last listed them (VAST_FACTS of its record; a
    # field Vast left out is absent, shown as "not reported") and when that list was taken.
    vast_facts = models.JSONField(default=dict, blank=True)
    vast_seen_at = models.DateTimeField(null=True, blank=True)
    # The benchmark this machine must reach (proofs/h), chosen when it was rented from a
    # maximum price per proof; empty: the configured minimum.
    min_bench_rate = models.PositiveIntegerField(null=True, blank=True)
    # An interruptible rental's bid for its GPUs ($/h), as placed when it was rented; empty:
    # on demand. Vast's current minimum bid there is in vast_facts (min_bid).
    bid_price = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)

    def __str__(self) -> str:
        return f"remote {self.machine.name}"

    # The machine page's detail grid: label, Vast's field, how to show it (vast-manager's
    # expanded row).
    FACT_ROWS = (
        ("GPU", "gpu_name", "{}"), ("GPUs", "num_gpus", "{}"), ("GPU RAM", "gpu_ram", "{:.0f} MB"),
        ("GPU utilisation", "gpu_util", "{:.0f} %"), ("GPU temperature", "gpu_temp", "{:.0f} °C"),
        ("Host RAM", "cpu_ram", "{:.0f} MB"), ("Memory used", "mem_usage", "{:.1f} GB"),
        ("Memory limit", "mem_limit", "{:.1f} GB"), ("CUDA (max)", "cuda_max_good", "{}"),
        ("Download", "inet_down", "{:.0f} Mbps"), ("Upload", "inet_up", "{:.0f} Mbps"),
        ("Disk", "disk_space", "{:.0f} GB"), ("Reliability", "reliability2", "{:.4f}"),
        ("Location", "geolocation", "{}"),
    )

    def fact_rows(self) -> list[tuple[str, str | None]]:
        """Each fact as Vast last listed it, formatted; None where Vast did not report it."""
        rows = []
        for label, key, fmt in self.FACT_ROWS:
            value = self.vast_facts.get(key)
            try:
                rows.append((label, None if value is None else fmt.format(value)))
            except (TypeError, ValueError):  # not the type Vast documents: shown as sent
                rows.append((label, str(value)))
        return rows

    @property
    def ssh_key_secret_name(self) -> str:
        return f"ssh_key:{self.machine_id}"

    @classmethod
    def for_machine(cls, machine: Machine) -> "RemoteMachine":
        remote, _ = cls.objects.get_or_create(machine=machine)
        return remote

    @classmethod
    def outbid_machine_ids(cls) -> set[int]:
        """Machines Vast stopped for a higher bid: they take no new work, even while their
        engine's link has not yet noticed that it is gone."""
        return set(cls.objects.filter(vast_status=OUTBID).values_list("machine_id",
                                                                           flat=True))


class VastNotification(models.Model):
    """One delivery of Vast's notification webhook, kept by its event id: Vast delivers at
    least once, so a repeated id is dropped before anything acts on it."""

    event_id = models.CharField(max_length=100, unique=True)
    notif_type = models.CharField(max_length=60)
    subject = models.CharField(max_length=300, blank=True)
    message = models.TextField(blank=True)
    instance_id = models.BigIntegerField(null=True, blank=True)
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="vast_notifications")
    received_at = models.DateTimeField(default=timezone.now)
    sent_at = models.FloatField(null=True, blank=True)  # the payload's timestamp
    delivery_attempt = models.PositiveIntegerField(default=1)
    duplicates = models.PositiveIntegerField(default=0)  # repeated deliveries dropped
    outcome = models.CharField(max_length=300, blank=True)  # what the product did with it

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.notif_type} {self.event_id}"


class VastSync(models.Model):
    """When the automation last listed our Vast instances successfully: how old every
    provider-reported value on the pages is. One row."""

    listed_at = models.DateTimeField()

    # Older than two automation ticks (one a minute): a reconcile was missed.
    STALE_AFTER_S = 120

    @classmethod
    def mark(cls, when) -> None:
        cls.objects.update_or_create(pk=1, defaults={"listed_at": when})

    @classmethod
    def age_s(cls, now=None) -> float | None:
        """Seconds since the last successful listing; None if there never was one."""
        listed = cls.objects.filter(pk=1).values_list("listed_at", flat=True).first()
        if listed is None:
            return None
        return max(0.0, ((now or timezone.now()) - listed).total_seconds())


class RentPreference(models.Model):
    """What a user last chose in the rent dialog, offered again next time."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="rent_preference")
    max_price_per_proof = models.DecimalField(max_digits=8, decimal_places=5)
    disk_gb = models.PositiveIntegerField()
    # What runs there: our engine (provisioned over SSH) or Curio's cuzk image (upstream),
    # with the image and onstart command it was rented with. Its env is not a column: the
    # values are operator secrets (vast-manager's PAVAIL), kept encrypted in a Secret.
    engine_flavour = models.CharField(max_length=20, choices=Machine.Flavour.choices,
                                      default=Machine.Flavour.CUZK_ENGINE)
    image = models.CharField(max_length=255, blank=True)
    onstart = models.TextField(blank=True)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user}: ${self.max_price_per_proof}/proof, {self.disk_gb} GB"

    @staticmethod
    def env_secret_name(user_id: int) -> str:
        return f"rent_env:{user_id}"

    def env(self) -> dict[str, str]:
        """The upstream worker's env this user last rented with; SecretUnavailable when it
        cannot be decrypted any more."""
        name = self.env_secret_name(self.user_id)
        return parse_env(Secret.reveal(name)) if Secret.is_set(name) else {}

    def set_env(self, env: dict[str, str]) -> None:
        """Kept encrypted; an empty env leaves no Secret behind."""
        if env:
            Secret.store(self.env_secret_name(self.user_id), format_env(env))
        else:
            Secret.objects.filter(name=self.env_secret_name(self.user_id)).delete()


@receiver(post_delete, sender=RentPreference)
def _forget_rent_env(sender, instance: RentPreference, **kwargs) -> None:
    """A deleted preference (its user deleted) takes its env's secret with it."""
    instance.set_env({})


class UnmanagedInstance(models.Model):
    """A Vast instance on our account that no machine manages: it bills, so the fleet page shows
    it until it is gone. Rewritten by every reconcile; `seen_at` says how current it is."""

    instance_id = models.BigIntegerField(unique=True)
    label = models.CharField(max_length=300, blank=True)
    actual_status = models.CharField(max_length=40, blank=True)
    dph_total = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True)
    first_seen = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("instance_id",)

    def __str__(self) -> str:
        return f"unmanaged Vast instance {self.instance_id}"


class BadMachine(models.Model):
    """A provider machine that failed us (slow benchmark, broken install): never rent it again."""

    provider = models.CharField(max_length=10, choices=Machine.Provider.choices,
                                default=Machine.Provider.VAST)
    provider_machine_id = models.BigIntegerField()
    reason = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = (models.UniqueConstraint(fields=("provider", "provider_machine_id"),
                                               name="unique_bad_host"),)
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.provider} machine {self.provider_machine_id}"

    @classmethod
    def flag(cls, provider_machine_id: int, reason: str, *, machine=None,
             provider=Machine.Provider.VAST) -> "BadMachine":
        bad, created = cls.objects.get_or_create(
            provider=provider, provider_machine_id=provider_machine_id,
            defaults={"reason": reason},
        )
        if created:
            Event.record("bad_host", f"{provider} machine {provider_machine_id} marked bad: {reason}",
                         machine=machine, level=Event.Level.WARNING,
                         data={"provider_machine_id": provider_machine_id, "reason": reason})
        return bad

    def unmark(self, *, by: str) -> None:
        """Off the list: its offers can be rented again."""
        Event.record("bad_host", f"{self.provider} machine {self.provider_machine_id} unmarked "
                                 f"by {by} (was: {self.reason})",
                     data={"provider_machine_id": self.provider_machine_id, "by": by})
        self.delete()


class MachinePerf(models.Model):
    """Best benchmark seen per provider machine and GPU set; feeds the price-per-proof estimate."""

    provider_machine_id = models.BigIntegerField(null=True, blank=True)
    gpu_name = models.CharField(max_length=100)
    gpu_count = models.PositiveIntegerField()
    proofs_per_hour = models.FloatField()
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = (models.UniqueConstraint(
            fields=("provider_machine_id", "gpu_name", "gpu_count"), name="unique_host_perf"),)

    def __str__(self) -> str:
        return f"{self.gpu_count}x {self.gpu_name} @ {self.provider_machine_id}: {self.proofs_per_hour}/h"

    @classmethod
    def record(cls, *, provider_machine_id, gpu_name: str, gpu_count: int, rate: float) -> None:
        perf, created = cls.objects.get_or_create(
            provider_machine_id=provider_machine_id, gpu_name=gpu_name, gpu_count=gpu_count,
            defaults={"proofs_per_hour": rate},
        )
        if not created and rate > perf.proofs_per_hour:
            perf.proofs_per_hour = rate
            perf.save(update_fields=["proofs_per_hour", "updated"])


class ProviderCall(models.Model):
    """One call to a provider's API, with its outcome: the provider log (its own page), apart
    from the Events timeline, which says what happened to the fleet. A call that failed is
    also an error Event (the alert rules and on-call act on those); a routine listing is not.
    Kept for `KEEP`."""

    KEEP = timedelta(days=7)

    time = models.DateTimeField(default=timezone.now, db_index=True)
    provider = models.CharField(max_length=20, default="vast")
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="provider_calls")
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=300)
    status = models.PositiveSmallIntegerField(null=True, blank=True,
                                              help_text="HTTP status; empty: no response")
    ok = models.BooleanField()
    attempts = models.PositiveSmallIntegerField(default=1)
    waited_s = models.FloatField(default=0.0, help_text="Seconds waited between attempts")
    problem = models.TextField(blank=True, help_text="What was wrong with the answer")

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.provider} {self.method} {self.path} → {self.status or 'no response'}"

    @classmethod
    def record(cls, **fields) -> "ProviderCall":
        cls.objects.filter(time__lt=timezone.now() - cls.KEEP).delete()
        return cls.objects.create(**fields)
