"""Vast's notification webhooks (issue 36, step 5), through Django's test client on the real
route and database: signed deliveries act once, forged, stale and replayed ones do not, and the
machine's pages say which signal told them; polling stays the fallback."""

import hashlib
import hmac
import json
import time
import uuid

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import RemoteMachine, VastNotification
from vastmgr.remote.vast import _apply_status

pytestmark = pytest.mark.django_db

SECRET = "whsec-test-0123456789abcdef"
URL = "/remote/vast/webhook/"
REMOTE = RemoteSettings(vast_webhook_secret=SECRET)


def signed(body: bytes, *, secret: str = SECRET, stamp: int | None = None,
           event_id: str | None = None, signature: str | None = None,
           attempt: int = 1) -> dict[str, str]:
    """The headers Vast sends with `body`: the raw body signed over "<timestamp>.<body>"."""
    stamp = int(time.time()) if stamp is None else stamp
    digest = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Vast-Event-Id": event_id or uuid.uuid4().hex,
            "X-Vast-Delivery-Attempt": str(attempt), "X-Vast-Timestamp": str(stamp),
            "X-Vast-Signature-256": signature or f"sha256={digest}"}


def deliver(client, payload: dict, **signing):
    """POST as Vast does."""
    body = json.dumps(payload).encode()
    return client.generic("POST", URL, body, content_type="application/json",
                          headers=signed(body, **signing))


def event(notif_type: str, **more) -> dict:
    return {"event_id": uuid.uuid4().hex, "user_id": 123, "notif_type": notif_type,
            "subject": more.pop("subject", f"Vast: {notif_type}"), "message": "",
            "timestamp": time.time(), **more}


@pytest.fixture
def machine():
    machine = Machine.objects.create(name="vast-18000001", provider=Machine.Provider.VAST,
                                     vast_instance_id=18_000_001, host="127.0.0.1")
    RemoteMachine.objects.create(machine=machine, vast_status="running",
                                 vast_status_signal=RemoteMachine.SIGNAL_POLLING,
                                 vast_seen_at=timezone.now())
    return machine


@override_settings(VASTMGR_REMOTE=REMOTE)
def test_the_route_is_the_one_the_docs_name():
    assert reverse("remote:vast_webhook") == URL


@override_settings(VASTMGR_REMOTE=REMOTE)
def test_a_signed_outbid_marks_the_machine_at_once_and_the_page_says_the_webhook_told_it(
        client, admin_client, machine):
    job = ProofJob.objects.create(kind="porep-c2", seed=1, machine=machine,
                                  status=ProofJob.Status.RUNNING)
    answer = deliver(client, event("outbid", instance_id=18_000_001,
                                   message="Your interruptible instance was outbid"))
    assert answer.status_code == 204
    job.refresh_from_db()  # back in the queue at once, for another machine
    assert (job.status, job.machine_id) == (ProofJob.Status.QUEUED, None)
    remote = RemoteMachine.objects.get(machine=machine)
    assert (remote.vast_status, remote.vast_status_signal) == ("outbid",
                                                               RemoteMachine.SIGNAL_WEBHOOK)
    assert remote.vast_down_since is None  # outbid is not down: the autopilot decides
    assert Event.objects.filter(kind="alert", machine=machine,
                                data__alert="instance_outbid").count() == 1
    page = admin_client.get(f"/remote/machines/{machine.pk}/").content.decode()
    assert 'data-signal="Vast webhook">outbid</span> (told by Vast webhook' in page
    # The fleet says outbid, not offline, though its engine is away.
    fleet = admin_client.get("/").content.decode()
    row = fleet[fleet.index(f'id="host-{machine.pk}-row"'):]
    row = row[:row.index("</tr>")]
    assert 'data-conn="outbid"' in row and 'data-signal="Vast webhook"' in row


@override_settings(VASTMGR_REMOTE=REMOTE)
def test_a_replayed_delivery_is_dropped_by_its_event_id(client, machine):
    payload = event("instance_offline", subject="Instance 18000001 is offline")
    first = deliver(client, payload, event_id="evt-1")
    again = deliver(client, payload, event_id="evt-1", attempt=2)
    assert (first.status_code, again.status_code) == (204, 204)
    notification = VastNotification.objects.get()
    assert (notification.duplicates, notification.machine_id) == (1, machine.pk)
    assert Event.objects.filter(kind="alert", data__alert="instance_offline").count() == 1
    remote = RemoteMachine.objects.get(machine=machine)
    assert remote.vast_status == "offline" and remote.vast_down_since is not None


@override_settings(VASTMGR_REMOTE=REMOTE)
@pytest.mark.parametrize("how", ["wrong secret", "forged signature", "stale", "future",
                                 "no signature"])
def test_forged_and_stale_deliveries_are_refused_and_change_nothing(client, machine, how):
    payload = event("outbid", instance_id=18_000_001)
    now = int(time.time())
    kwargs = {"wrong secret": {"secret": "not-the-secret"},
              "forged signature": {"signature": "sha256=" + "0" * 64},
              "stale": {"stamp": now - 600}, "future": {"stamp": now + 600},
              "no signature": {"signature": "md5=abc"}}[how]
    answer = deliver(client, payload, **kwargs)
    assert answer.status_code == 401, answer.content
    assert "error" in answer.json()
    assert not VastNotification.objects.exists()
    assert RemoteMachine.objects.get(machine=machine).vast_status == "running"


@override_settings(VASTMGR_REMOTE=REMOTE)
def test_bad_input_gets_a_4xx_with_a_message(client):
    assert client.get(URL).status_code == 405
    stamp = int(time.time())
    body = b"not json"
    digest = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    answer = client.generic("POST", URL, body, content_type="application/json", headers={
        "X-Vast-Event-Id": "evt-x", "X-Vast-Timestamp": str(stamp),
        "X-Vast-Signature-256": f"sha256={digest}"})
    assert answer.status_code == 400 and "JSON" in answer.json()["error"]
    assert deliver(client, {"no": "type"}).status_code == 400


@override_settings(VASTMGR_REMOTE=RemoteSettings())
def test_without_a_secret_the_route_answers_404(client):
    answer = deliver(client, event("outbid"))
    assert answer.status_code == 404 and "VASTMGR_VAST_WEBHOOK_SECRET" in answer.json()["error"]


@override_settings(VASTMGR_REMOTE=REMOTE)
def test_low_credit_and_gpu_idle_alert(client, machine):
    assert deliver(client, event("low_credit")).status_code == 204
    assert deliver(client, event("gpu_idle", instance_id="18000001")).status_code == 204
    alerts = set(Event.objects.filter(kind="alert").values_list("data__alert", flat=True))
    assert alerts == {"low_credit", "gpu_idle"}
    assert Event.objects.get(data__alert="gpu_idle").machine_id == machine.pk


def test_polling_sees_an_outbid_instance_when_no_webhook_did(machine):
    """The fallback: the automation's listing of an interruptible instance stopped by a
    higher bid (as the strict fake lists it) marks the machine outbid, told by polling."""
    listed = {"id": 18_000_001, "actual_status": "stopped", "intended_status": "running",
              "is_bid": True, "min_bid": 0.2, "status_msg": "outbid"}
    job = ProofJob.objects.create(kind="snap-update", seed=2, machine=machine,
                                  status=ProofJob.Status.DISPATCHED)
    found = _apply_status(machine, listed, timezone.now())
    job.refresh_from_db()
    assert job.status == ProofJob.Status.QUEUED
    remote = RemoteMachine.objects.get(machine=machine)
    assert (remote.vast_status, remote.vast_status_signal) == ("outbid",
                                                               RemoteMachine.SIGNAL_POLLING)
    assert [a.kind for a in found] == ["instance_outbid"]
    assert remote.vast_down_since is None
    # A stop we asked for is not an outbid.
    asked = {**listed, "intended_status": "stopped"}
    _apply_status(machine, asked, timezone.now())
    assert RemoteMachine.objects.get(machine=machine).vast_status == "stopped"
