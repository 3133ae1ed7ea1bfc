from __future__ import annotations

import re
from datetime import timedelta

from django.db import models
from django.utils import timezone

from vastmgr.fleet.models import Event
from vastmgr.remote.models import Secret

LEVELS = [level.value for level in Event.Level]  # in rising order
# Events about notifying itself are never notified (a failing channel would feed itself).
OWN_KIND = "notify"
# A recovery (`Event.RECOVERS`) goes to every channel that was told of the failure it ends,
# whatever the channel's minimum level or topics, so whoever was paged hears that it is over.
_FAILURE_LEVELS = [level for level in LEVELS if LEVELS.index(level) >= LEVELS.index("warning")]


def event_topic(event: Event) -> str:
    """What rules match on: an alert's own kind (host_offline, job_failed ...), else the
    Event's kind (lifecycle, proof, ssh, vast, fault ...)."""
    alert = event.data.get("alert") if isinstance(event.data, dict) else None
    return alert if event.kind == "alert" and isinstance(alert, str) else event.kind


def subject(event: Event) -> str:
    """What an Event is about (its topic and machine): a failure and its recovery share it."""
    return f"{event_topic(event)}|{event.machine_id or '-'}|"


def fingerprint(event: Event) -> str:
    """Events that say the same thing: same topic, machine and level, and the same message but
    for its numbers ("gpu-1 offline for 5 min" and "... for 6 min" are one alert)."""
    text = re.sub(r"\d+(\.\d+)?", "#", event.message)
    return f"{subject(event)}{event.level}|{text}"[:500]


def is_recovery(event: Event) -> bool:
    return isinstance(event.data, dict) and event.data.get(Event.RECOVERS) is True


class Channel(models.Model):
    """Where notifications go: an apprise URL (kept encrypted like the Vast key) and rules."""

    name = models.CharField(max_length=100, unique=True)
    enabled = models.BooleanField(default=True)
    topics = models.JSONField(default=list, blank=True,
                              help_text="Alert or Event kinds to send; empty: every kind")
    min_level = models.CharField(max_length=10, choices=Event.Level.choices,
                                 default=Event.Level.WARNING)
    resend_after = models.DurationField(
        default=timedelta(hours=1),
        help_text="The same alert again within this time is recorded, not sent")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def resend_minutes(self) -> int:
        return round(self.resend_after.total_seconds() / 60)

    @property
    def secret_name(self) -> str:
        return f"notify_channel:{self.pk}"

    def set_url(self, url: str) -> None:
        Secret.store(self.secret_name, url)

    def url(self) -> str:
        return Secret.reveal(self.secret_name)

    def wants(self, event: Event) -> bool:
        return (self.enabled and event.kind != OWN_KIND
                and LEVELS.index(event.level) >= LEVELS.index(self.min_level)
                and (not self.topics or event_topic(event) in self.topics))

    def awaits_recovery(self, event: Event) -> bool:
        """`event` is a recovery and the last this channel was sent about its subject was a
        failure (sent or still to be sent), not yet its end."""
        if not (self.enabled and is_recovery(event)):
            return False
        last = (Delivery.objects.filter(channel=self, fingerprint__startswith=subject(event),
                                        state__in=(Delivery.State.PENDING, Delivery.State.SENT))
                .order_by("-created", "-id").values_list("level", flat=True).first())
        return last in _FAILURE_LEVELS

    def delete(self, *args, **kwargs):
        Secret.objects.filter(name=self.secret_name).delete()
        return super().delete(*args, **kwargs)


class Delivery(models.Model):
    """One Event for one channel: sent, suppressed as a repeat, or retried until it goes out
    or gives up. Unique per (channel, event), so an Event is never sent twice to a channel."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        SUPPRESSED = "suppressed"
        FAILED = "failed"

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.SET_NULL)
    fingerprint = models.CharField(max_length=500, db_index=True)
    title = models.CharField(max_length=200)
    body = models.TextField()
    level = models.CharField(max_length=10, choices=Event.Level.choices)
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING,
                             db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt = models.DateTimeField(default=timezone.now, db_index=True)
    last_error = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = (models.UniqueConstraint(fields=("channel", "event"),
                                               name="one_delivery_per_event"),)

    def __str__(self) -> str:
        return f"{self.channel}: {self.title} ({self.state})"
