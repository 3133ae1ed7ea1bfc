"""Vast's notification webhooks, received: what Vast pushes instead of what we poll for.

From Vast's guide (guides/reference/notification-webhooks.mdx in vast-ai/docs): a signed JSON
POST `{event_id, user_id, notif_type, subject, message, timestamp}` with the headers
`X-Vast-Event-Id`, `X-Vast-Delivery-Attempt`, `X-Vast-Timestamp` (integer seconds) and
`X-Vast-Signature-256` = "sha256=" + HMAC-SHA256(secret, "<timestamp>.<raw body>"). The
receiver verifies the signature over the raw bytes, refuses timestamps more than
MAX_SKEW_S away, drops a repeated event id, acts, and answers 204 quickly; Vast retries 408,
429 and 5xx, and takes any other 4xx as final.

The documented payload names no instance. Instance events are matched to a machine by an
`instance_id` field when the payload carries one, else by "instance <id>" in the subject or
message; one that names none is recorded and the next reconcile (polling, the fallback) finds
what changed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass

from django.contrib.auth.decorators import login_not_required
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from vastmgr.fleet.models import Event, Machine
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import RemoteMachine, VastNotification
from vastmgr.remote.vast import requeue_outbid

MAX_SKEW_S = 300  # Vast's guide: "Reject old requests to reduce replay risk" (300 s)
MAX_BODY_BYTES = 64 * 1024
WEBHOOK = RemoteMachine.SIGNAL_WEBHOOK
_INSTANCE_IN_TEXT = re.compile(r"\binstance\s+(?:id\s+)?#?(\d{3,})", re.IGNORECASE)


@dataclass(frozen=True)
class InstanceEvent:
    """What an instance notification means for its machine's Vast status."""

    status: str  # the status it records (as `actual_status` names it, or "outbid")
    down: bool  # the instance stopped serving: the lifecycle's down grace applies
    level: str


# Slugs (the payload's `notif_type`, without the "client:" prefix of subscription keys).
# `outbid` and `low_credit` are the documented ones; the other instance events are listed by
# name in Vast's notifications guide, and their slugs here are our reading of those names.
INSTANCE_EVENTS = {
    "outbid": InstanceEvent("outbid", False, Event.Level.WARNING),
    "instance_outbid": InstanceEvent("outbid", False, Event.Level.WARNING),
    "instance_offline": InstanceEvent("offline", True, Event.Level.WARNING),
    "instance_error": InstanceEvent("error", True, Event.Level.ERROR),
    "instance_error_detected": InstanceEvent("error", True, Event.Level.ERROR),
    "instance_stopped": InstanceEvent("stopped", True, Event.Level.WARNING),
}
LOW_CREDIT = "low_credit"
GPU_IDLE = ("gpu_idle", "instance_gpu_idle")


def signature_problem(headers, body: bytes, secret: str, now: float) -> str:
    """Why this delivery is not Vast's ("" when it is): Vast's own recipe."""
    stamp = headers.get("X-Vast-Timestamp", "")
    signature = headers.get("X-Vast-Signature-256", "")
    if not stamp or not signature.startswith("sha256="):
        return "missing X-Vast-Timestamp or X-Vast-Signature-256"
    try:
        sent = int(stamp)
    except ValueError:
        return "X-Vast-Timestamp is not an integer"
    expected = hmac.new(secret.encode(), stamp.encode() + b"." + body,
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(signature, f"sha256={expected}"):
        return "the signature does not match"
    if abs(now - sent) > MAX_SKEW_S:
        return f"stale: signed {now - sent:.0f} s from now (at most {MAX_SKEW_S} s)"
    return ""


def _refuse(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@csrf_exempt
@login_not_required
@require_POST
def receive(request: HttpRequest) -> HttpResponse:
    secret = RemoteSettings.load().vast_webhook_secret
    if not secret:
        return _refuse(404, "Vast webhooks are not configured (VASTMGR_VAST_WEBHOOK_SECRET)")
    body = request.body
    if len(body) > MAX_BODY_BYTES:
        return _refuse(413, f"the body is over {MAX_BODY_BYTES} bytes")
    problem = signature_problem(request.headers, body, secret, time.time())
    if problem:
        Event.record("vast", f"refused a Vast webhook delivery: {problem}",
                     level=Event.Level.WARNING, data={"problem": problem})
        return _refuse(401, problem)
    event_id = request.headers.get("X-Vast-Event-Id", "").strip()
    try:
        payload = json.loads(body)
    except ValueError:
        return _refuse(400, "the body is not JSON")
    if not isinstance(payload, dict) or not isinstance(payload.get("notif_type"), str):
        return _refuse(400, "the body names no notif_type")
    event_id = event_id or str(payload.get("event_id") or "")
    if not event_id or len(event_id) > 100:
        return _refuse(400, "X-Vast-Event-Id is missing or too long")
    try:
        attempt = int(request.headers.get("X-Vast-Delivery-Attempt", "1"))
    except ValueError:
        attempt = 1
    try:
        with transaction.atomic():
            notification = VastNotification.objects.create(
                event_id=event_id, notif_type=payload["notif_type"][:60],
                subject=str(payload.get("subject") or "")[:300],
                message=str(payload.get("message") or "")[:5000],
                instance_id=_instance_id(payload),
                sent_at=payload.get("timestamp") if isinstance(
                    payload.get("timestamp"), int | float) else None,
                delivery_attempt=max(attempt, 1))
    except IntegrityError:
        # At-least-once delivery: this event was received before; nothing acts twice.
        VastNotification.objects.filter(event_id=event_id).update(
            duplicates=F("duplicates") + 1)
        return HttpResponse(status=204)
    handle(notification)
    return HttpResponse(status=204)


def _instance_id(payload: dict) -> int | None:
    value = payload.get("instance_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    for text in (payload.get("subject"), payload.get("message")):
        found = _INSTANCE_IN_TEXT.search(text) if isinstance(text, str) else None
        if found:
            return int(found.group(1))
    return None


def handle(notification: VastNotification) -> None:
    """Act on one verified, new notification, and write down what was done."""
    kind = notification.notif_type
    machine = (Machine.objects.filter(provider=Machine.Provider.VAST,
                                      vast_instance_id=notification.instance_id)
               .exclude(state=Machine.State.KILLED).first()
               if notification.instance_id is not None else None)
    text = notification.subject or notification.message or kind
    data = {"event_id": notification.event_id, "notif_type": kind,
            "instance_id": notification.instance_id, "signal": WEBHOOK}
    if kind in INSTANCE_EVENTS and machine is not None:
        meaning = INSTANCE_EVENTS[kind]
        _record_status(machine, meaning, text)
        outcome = f"{machine.name}: Vast says {meaning.status}"
        Event.record("vast", f"{outcome} ({WEBHOOK}: {text})", machine=machine,
                     level=meaning.level, data=data)
        Event.record("alert", f"{outcome}: {text}", machine=machine,
                     level=Event.Level.WARNING,
                     data={"alert": f"instance_{meaning.status}", **data})
    elif kind == LOW_CREDIT:
        outcome = "low credit on the Vast account"
        Event.record("alert", f"{outcome}: {text}", level=Event.Level.WARNING,
                     data={"alert": "low_credit", **data})
    elif kind in GPU_IDLE and machine is not None:
        outcome = f"{machine.name}: GPU idle for 24 h or more"
        Event.record("alert", f"{outcome} ({text})", machine=machine,
                     level=Event.Level.WARNING, data={"alert": "gpu_idle", **data})
    elif kind in INSTANCE_EVENTS or kind in GPU_IDLE:
        outcome = (f"names no machine of ours (instance {notification.instance_id}); the next "
                   "reconcile finds what changed")
        Event.record("vast", f"Vast webhook {kind}: {outcome}: {text}",
                     level=Event.Level.WARNING, data=data)
    else:
        outcome = "recorded"
        Event.record("vast", f"Vast webhook {kind}: {text}", data=data)
    notification.machine = machine
    notification.outcome = outcome[:300]
    notification.save(update_fields=["machine", "outcome"])


def _record_status(machine: Machine, meaning: InstanceEvent, text: str) -> None:
    """The machine's Vast status as the webhook told it, at once; the automation's next
    listing confirms or corrects it."""
    now = timezone.now()
    with transaction.atomic():
        remote = RemoteMachine.objects.select_for_update().get_or_create(machine=machine)[0]
        remote.vast_status = meaning.status
        remote.vast_status_signal = WEBHOOK
        remote.vast_status_at = now
        fields = ["vast_status", "vast_status_signal", "vast_status_at"]
        if meaning.down and remote.vast_down_since is None:
            remote.vast_down_since = now
            remote.last_error = (f"Vast instance {machine.vast_instance_id} is "
                                 f"{meaning.status}: {text}")[:1000]
            fields += ["vast_down_since", "last_error"]
        remote.save(update_fields=fields)
    if meaning.status == "outbid":
        requeue_outbid(machine, WEBHOOK)
