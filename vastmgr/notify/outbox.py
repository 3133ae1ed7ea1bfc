"""From Events to deliveries, and deliveries to channels through apprise.

`enqueue` runs in whichever process records an Event: it only writes rows. `deliver_due`
runs in the notifier process: it claims due deliveries, sends each through apprise, and on a
failure schedules the next try with a doubling wait, until the attempts run out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import apprise
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from vastmgr.fleet.models import Event
from vastmgr.lib.errors import SecretUnavailable
from vastmgr.notify.models import Channel, Delivery, event_topic, fingerprint

log = logging.getLogger(__name__)

# A claimed delivery is not picked up by another notifier for this long (one send's timeouts).
CLAIM_SECONDS = 60
APPRISE_TYPES = {"info": apprise.NotifyType.INFO, "warning": apprise.NotifyType.WARNING,
                 "error": apprise.NotifyType.FAILURE}


def enqueue(sender, instance: Event, created: bool, **kwargs) -> None:
    """post_save of Event: one delivery per channel that wants it (by its rules, or because it
    was told of the failure this Event ends); a repeat of something sent to that channel within
    its resend interval is recorded as suppressed."""
    if not created or kwargs.get("raw"):
        return
    # A recovery that ends a failure the channel was told of is never a repeat: the failure
    # in between made it news again.
    ending = {c.pk for c in Channel.objects.filter(enabled=True) if c.awaits_recovery(instance)}
    channels = [c for c in Channel.objects.filter(enabled=True)
                if c.pk in ending or c.wants(instance)]
    if not channels:
        return
    print_ = fingerprint(instance)
    machine = instance.machine.name if instance.machine_id and instance.machine else ""
    title = f"[{instance.level}] {event_topic(instance)}" + (f" on {machine}" if machine else "")
    for channel in channels:
        repeat = channel.pk not in ending and Delivery.objects.filter(
            channel=channel, fingerprint=print_, created__gte=instance.time - channel.resend_after,
            state__in=(Delivery.State.PENDING, Delivery.State.SENT)).exists()
        Delivery.objects.create(
            channel=channel, event=instance, fingerprint=print_, title=title[:200],
            body=instance.message, level=instance.level,
            state=Delivery.State.SUPPRESSED if repeat else Delivery.State.PENDING)


def send(url: str, title: str, body: str, level: str) -> str | None:
    """Send one notification; None when it went out, else why not (never the URL: it may
    carry a token)."""
    notifier = apprise.Apprise()
    if not notifier.add(url):
        return "the channel's URL is not one apprise understands"
    with apprise_log() as records:
        sent = notifier.notify(title=title, body=body,
                               notify_type=APPRISE_TYPES.get(level, apprise.NotifyType.INFO))
    if sent:
        return None
    return plain_reason(records).replace(url, "<channel URL>")[-500:]


class _Kept(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def apprise_log() -> Iterator[list[logging.LogRecord]]:
    """apprise's log records of one send, kept for the reason and not passed on: its debug
    lines hold the socket error's own words, and they must not reach our logs (nor leave
    apprise's logger at debug level, as apprise.LogCapture does)."""
    logger = logging.getLogger("apprise")
    records: list[logging.LogRecord] = []
    handler, saved = _Kept(records), (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def plain_reason(records: list[logging.LogRecord]) -> str:
    """apprise's log of a failed send as a sentence: its warnings without timestamps or levels,
    and the system's own words for a socket error (only in its debug lines), e.g. "A Connection
    error occurred sending JSON notification to 127.0.0.1 (connection refused)."."""
    said = " ".join(r.getMessage().strip() for r in records if r.levelno >= logging.WARNING)
    socket_errors = [found.group(1).strip().lower() for r in records
                     if (found := SOCKET_ERROR.search(r.getMessage()))]
    if socket_errors:
        said = f"{said.rstrip('.')} ({socket_errors[-1]})." if said else f"{socket_errors[-1]}."
    return said or "apprise could not send it (no reason given)"


# "[Errno 111] Connection refused" inside a requests exception's text.
SOCKET_ERROR = re.compile(r"\[Errno -?\d+\] ([^\"'()\]\[]+)")


def backoff(attempts: int) -> timedelta:
    """The wait before try `attempts + 1`: the base, doubled each time, up to the cap."""
    seconds = settings.VASTMGR_NOTIFY_BACKOFF_SECONDS * 2 ** max(attempts - 1, 0)
    return timedelta(seconds=min(seconds, settings.VASTMGR_NOTIFY_BACKOFF_CAP_SECONDS))


def _claim(limit: int) -> list[Delivery]:
    now = timezone.now()
    with transaction.atomic():
        due = list(Delivery.objects.select_for_update(skip_locked=True)
                   .filter(state=Delivery.State.PENDING, next_attempt__lte=now)
                   .select_related("channel").order_by("next_attempt", "id")[:limit])
        Delivery.objects.filter(pk__in=[d.pk for d in due]).update(
            next_attempt=now + timedelta(seconds=CLAIM_SECONDS))
    return due


def deliver_due(limit: int = 50) -> int:
    """Send the deliveries that are due; return how many were tried."""
    due = _claim(limit)
    for delivery in due:
        attempt(delivery)
    return len(due)


def attempt(delivery: Delivery) -> None:
    try:
        error = send(delivery.channel.url(), delivery.title, delivery.body, delivery.level)
    except SecretUnavailable as exc:
        error = str(exc)
    delivery.attempts += 1
    now = timezone.now()
    if error is None:
        delivery.state, delivery.sent_at, delivery.last_error = Delivery.State.SENT, now, ""
    else:
        delivery.last_error = error
        if delivery.attempts >= settings.VASTMGR_NOTIFY_ATTEMPTS:
            delivery.state = Delivery.State.FAILED
            Event.record("notify", f"notification to {delivery.channel.name} given up after "
                         f"{delivery.attempts} attempts ({error}): {delivery.title}",
                         level=Event.Level.ERROR, data={"channel": delivery.channel.name})
        else:
            delivery.next_attempt = now + backoff(delivery.attempts)
    delivery.save(update_fields=["attempts", "state", "sent_at", "last_error", "next_attempt"])


def send_test(channel: Channel, user) -> Delivery:
    """The "send test notification" button: one try, now, recorded with its outcome."""
    delivery = Delivery(channel=channel, fingerprint=f"test|{channel.pk}",
                        title="vastmgr test notification", level=Event.Level.INFO,
                        body=f"A test from vastmgr to the channel {channel.name}, sent by "
                             f"{user.get_username()}.",
                        attempts=1, state=Delivery.State.FAILED)
    try:
        error = send(channel.url(), delivery.title, delivery.body, delivery.level)
    except SecretUnavailable as exc:
        error = str(exc)
    if error is None:
        delivery.state, delivery.sent_at = Delivery.State.SENT, timezone.now()
    delivery.last_error = error or ""
    delivery.save()
    return delivery
