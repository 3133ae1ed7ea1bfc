"""Notifications through apprise to a real local webhook receiver: rules, de-duplication and
the resend interval, retries with backoff through an outage with no duplicate, giving up, the
test button, and the channel URL kept secret."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.notify.models import Channel, Delivery
from vastmgr.notify.outbox import backoff, deliver_due
from vastmgr.remote.models import Secret

from .receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def fast_retries(settings):
    settings.VASTMGR_NOTIFY_BACKOFF_SECONDS = 0.05
    settings.VASTMGR_NOTIFY_BACKOFF_CAP_SECONDS = 0.2
    settings.VASTMGR_NOTIFY_ATTEMPTS = 4


def channel(url: str, **rules) -> Channel:
    c = Channel.objects.create(name=rules.pop("name", "ops"), **rules)
    c.set_url(url)
    return c


def alert(kind: str, message: str, machine=None) -> Event:
    return Event.record("alert", message, machine=machine, level=Event.Level.WARNING,
                        data={"alert": kind})


def deliver_all(timeout: float = 10.0) -> None:
    """Run the notifier's rounds until nothing is pending (waiting out the backoff)."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    while Delivery.objects.filter(state=Delivery.State.PENDING).exists():
        assert timezone.now() < deadline, list(Delivery.objects.values())
        deliver_due()


def test_rules_choose_kinds_and_levels(receiver, fast_retries):
    gpu = Machine.objects.create(name="gpu-1")
    channel(receiver.url, name="pager", topics=["host_offline"], min_level="warning")
    channel(receiver.url, name="errors", min_level="error")
    alert("host_offline", "gpu-1 offline for 5 min", gpu)
    alert("job_failed", "porep-c2 proof failed", gpu)
    Event.record("ssh", "gpu-1: SSH connection refused", machine=gpu, level=Event.Level.ERROR)
    Event.record("lifecycle", "gpu-1: registered → running", machine=gpu)
    deliver_all()
    sent = sorted((d.channel.name, d.body) for d in Delivery.objects.all())
    assert sent == [("errors", "gpu-1: SSH connection refused"),
                    ("pager", "gpu-1 offline for 5 min")]
    assert sorted(receiver.messages()) == ["gpu-1 offline for 5 min",
                                           "gpu-1: SSH connection refused"]
    titles = {r["title"] for r in receiver.received}
    assert "[warning] host_offline on gpu-1" in titles


def test_repeats_are_suppressed_until_the_resend_interval(receiver, fast_retries):
    gpu = Machine.objects.create(name="gpu-1")
    ops = channel(receiver.url, resend_after=timedelta(minutes=30))
    alert("host_offline", "gpu-1 offline for 5 min", gpu)
    alert("host_offline", "gpu-1 offline for 10 min", gpu)  # the same alert, later
    alert("host_offline", "gpu-2 offline for 5 min")  # another one
    deliver_all()
    assert receiver.messages() == ["gpu-1 offline for 5 min", "gpu-2 offline for 5 min"]
    assert Delivery.objects.filter(state="suppressed").count() == 1
    # Past the resend interval the same alert goes out again.
    Delivery.objects.filter(state="sent").update(created=timezone.now() - timedelta(minutes=31))
    alert("host_offline", "gpu-1 offline for 40 min", gpu)
    deliver_all()
    assert receiver.messages()[-1] == "gpu-1 offline for 40 min"
    assert ops.deliveries.filter(state="sent").count() == 3


def test_an_outage_is_retried_with_backoff_and_nothing_is_sent_twice(receiver, fast_retries):
    channel(receiver.url)
    receiver.fail_next = 3  # the service is down for the first three requests
    alert("job_failed", "proof A failed")
    alert("job_failed", "proof B failed")
    deliver_all()
    assert receiver.refused == 3
    assert sorted(receiver.messages()) == ["proof A failed", "proof B failed"]
    deliveries = list(Delivery.objects.order_by("id"))
    assert all(d.state == "sent" for d in deliveries)
    assert sum(d.attempts for d in deliveries) == 2 + 3
    # Nothing is left to send: another round sends nothing more.
    assert deliver_due() == 0
    assert len(receiver.received) == 2


def test_the_wait_doubles_up_to_its_cap(settings):
    settings.VASTMGR_NOTIFY_BACKOFF_SECONDS = 5
    settings.VASTMGR_NOTIFY_BACKOFF_CAP_SECONDS = 600
    assert [backoff(n).total_seconds() for n in (1, 2, 3, 4, 10)] == [5, 10, 20, 40, 600]


def test_a_channel_that_stays_down_is_given_up_once(receiver, fast_retries):
    channel(receiver.url)
    receiver.fail_next = 100
    alert("job_failed", "proof C failed")
    deliver_all()
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("failed", 4)
    assert "500" in delivery.last_error and "127.0.0.1" not in delivery.last_error
    gave_up = Event.objects.get(kind="notify")
    assert "given up after 4 attempts" in gave_up.message
    # The notifier's own Event is never notified (a dead channel must not feed itself).
    assert not Delivery.objects.filter(event=gave_up).exists()


def test_page_adds_a_channel_keeps_its_url_secret_and_sends_a_test(receiver, admin_user):
    client = Client()
    client.force_login(admin_user)
    url = receiver.url + "?token=hunter2"
    response = client.post("/notify/", {"name": "team", "url": url, "min_level": "warning",
                                        "topics": ["host_offline", "job_failed"],
                                        "resend_minutes": 30})
    assert response.status_code == 302
    team = Channel.objects.get(name="team")
    assert team.topics == ["host_offline", "job_failed"]
    assert team.resend_after == timedelta(minutes=30)
    stored = Secret.objects.get(name=team.secret_name)
    assert b"hunter2" not in bytes(stored.ciphertext) and team.url() == url
    page = client.get("/notify/").content.decode()
    assert "team" in page and "hunter2" not in page and "Send test notification" in page
    result = client.post(f"/notify/{team.pk}/test/", headers={"HX-Request": "true"})
    assert "sent to team" in result.content.decode()
    assert receiver.messages() == [("A test from vastmgr to the channel team, sent by "
                                    f"{admin_user.username}.")]
    receiver.fail_next = 1
    failed = client.post(f"/notify/{team.pk}/test/").content.decode()
    assert "not sent" in failed and "hunter2" not in failed


def test_page_refuses_a_url_apprise_does_not_know(admin_user):
    client = Client()
    client.force_login(admin_user)
    response = client.post("/notify/", {"name": "x", "url": "nonsense://what",
                                        "min_level": "info", "resend_minutes": 5})
    assert response.status_code == 400
    assert "apprise does not understand this URL" in response.content.decode()
    assert not Channel.objects.exists()


def test_only_staff_see_notifications(django_user_model):
    user = django_user_model.objects.create_user("op", password="pw-123456")
    client = Client()
    client.force_login(user)
    assert client.get("/notify/").status_code in (302, 403)


def test_the_budget_alerts_once_when_crossed_and_once_when_back(settings):
    from vastmgr.fleet import ledger
    from vastmgr.notify import watch

    settings.VASTMGR_BUDGET_DOLLARS_PER_HOUR = 1.0
    gpu = Machine.objects.create(name="gpu-1", provider="vast", state="running",
                                 price_per_hour="0.75")
    ledger.bill(gpu, "running", gpu.price_per_hour, cause="rent")
    assert watch.check() == []
    gpu2 = Machine.objects.create(name="gpu-2", provider="vast", state="running",
                                  price_per_hour="0.5")
    ledger.bill(gpu2, "running", gpu2.price_per_hour, cause="rent")
    [over] = watch.check()
    assert over.message == "the fleet costs $1.25/h, over its budget of $1.00/h"
    assert watch.check() == []  # still over: said once
    ledger.stop_billing(gpu2)
    [back] = watch.check()
    assert "back within its budget" in back.message and back.level == "info"
    assert watch.check() == []


def test_an_upstream_lie_alerts_once_per_episode():
    from vastmgr.fleet.models import MachineStatus
    from vastmgr.notify import watch

    host = Machine.objects.create(name="curio-1", engine_flavour="cuzk-upstream",
                                  state="running", last_seen=timezone.now())

    def tally(episodes: int, present: bool) -> None:
        MachineStatus.objects.update_or_create(machine=host, defaults={"snapshot": {"lie_tally": [
            {"code": "gpu_without_worker", "title": "partition on the GPU with no worker",
             "episodes": episodes, "snapshots": 3, "first_seen": 1.0, "last_seen": 2.0,
             "present": present}]}})

    tally(1, True)
    [lie] = watch.check()
    assert lie.message == ("curio-1: the cuzk daemon's status shows partition on the GPU with "
                           "no worker (gpu_without_worker; episode 1)")
    assert watch.check() == []
    tally(1, False)
    assert watch.check() == []
    tally(2, True)
    assert len(watch.check()) == 1


def test_a_recovery_reaches_every_channel_that_was_told_of_the_failure(receiver, fast_retries):
    """"SSH connection back" is info, below the pager's minimum level: it still goes wherever
    the outage went, once, and nowhere the outage did not go. Recorded by the SSH link's own
    functions, as every process that finds the machine down or back does."""
    from vastmgr.remote.models import RemoteMachine
    from vastmgr.remote.ssh import _record_failure, _record_recovery

    gpu = Machine.objects.create(name="gpu-1", provider="ssh", host="127.0.0.1")
    RemoteMachine.objects.create(machine=gpu)
    with Receiver() as elsewhere:
        channel(receiver.url, name="pager", min_level="error")
        channel(elsewhere.url, name="offline-only", topics=["host_offline"])
        _record_failure(gpu.pk, "gpu-1: SSH connection refused", "ssh")
        _record_failure(gpu.pk, "gpu-1: SSH connection refused", "ssh")  # another process
        deliver_all()
        _record_recovery(gpu.pk, 3, 12.0)
        _record_recovery(gpu.pk, 3, 12.0)  # another process finds it back too: said once
        deliver_all()
        assert receiver.messages() == ["gpu-1: SSH connection refused",
                                       ("gpu-1: SSH connection back after 3 failed attempt(s) "
                                       "over 12 s")]
        assert elsewhere.messages() == []
    # The next outage and its end go out again; a recovery nobody was told the failure of
    # (the pager had it already) does not.
    _record_failure(gpu.pk, "gpu-1: SSH connection timed out", "ssh")
    _record_recovery(gpu.pk, 1, 4.0)
    Event.record("ssh", "gpu-1: SSH connection back", machine=gpu,
                 data={Event.RECOVERS: True})
    deliver_all()
    assert receiver.messages()[2:] == ["gpu-1: SSH connection timed out",
                                       ("gpu-1: SSH connection back after 1 failed attempt(s) "
                                       "over 4 s")]
