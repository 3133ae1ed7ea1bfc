"""The rules the call-home protocol adds to vast-manager's, in-process (the contract test
presses the compatible behaviour over HTTP): the required secret, the rate limit, the bounds
on stored logs, and how a machine follows its instance."""

import json

import pytest

from vastmgr.fleet.models import Event, Machine
from vastmgr.instances import models as instance_models
from vastmgr.instances.config import AUTH_REQUIRED, CallHomeSettings
from vastmgr.instances.models import DeploySecret, Instance, LogLine
from vastmgr.instances.protocol import RateLimiter

pytestmark = [pytest.mark.django_db, pytest.mark.urls("vastmgr.remote.callhome.urls")]


@pytest.fixture(autouse=True)
def required(settings):
    settings.VASTMGR_CALLHOME = CallHomeSettings(auth=AUTH_REQUIRED, rate_per_s=1000,
                                                 burst=1000)


def post(client, path, body, secret=None):
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    response = client.post(path, json.dumps(body), content_type="application/json",
                           headers=headers)
    return response.status_code, json.loads(response.content) if response.content else None


def test_required_mode_refuses_calls_without_the_secret(client):
    code, body = post(client, "/register", {"label": "C.1"})
    assert code == 401 and "VASTMGR_CALLHOME_SECRET" in body["error"]
    assert client.get("/status").status_code == 401
    secret = DeploySecret.issue(note="test")
    assert DeploySecret.objects.get().digest != secret  # only its hash is kept
    code, body = post(client, "/register", {"label": "C.1"}, secret)
    assert code == 200 and set(body) == {"uuid", "runner_id"}
    assert post(client, "/param-done", {"uuid": body["uuid"]}, secret) == (200, {"ok": True})
    # Another deployment's secret does not drive this instance.
    other = DeploySecret.issue(note="other")
    assert post(client, "/running", {"uuid": body["uuid"]}, other)[0] == 401


def test_a_machine_follows_its_instance_without_inventing_steps(client):
    machine = Machine.objects.create(name="vast-9", provider=Machine.Provider.VAST,
                                     vast_instance_id=9)
    secret = DeploySecret.issue(machine=machine)
    _, me = post(client, "/register", {"label": "anything"}, secret)  # bound by its secret
    assert post(client, "/running", {"uuid": me["uuid"]}, secret)[0] == 200
    machine.refresh_from_db()
    # registered → running is one legal step: no provisioning or benchmark is claimed.
    assert machine.state == Machine.State.RUNNING
    assert [e.data["to"] for e in Event.objects.filter(machine=machine, kind="lifecycle")] == \
        ["running"]


def test_log_buffers_are_bounded(monkeypatch):
    monkeypatch.setattr(instance_models, "LOG_LINES_PER_INSTANCE", 100)
    monkeypatch.setattr(instance_models, "STRAY_LOG_BUFFERS", 3)
    LogLine.push("u1", "cuzk", "".join(f"line {i}\n" for i in range(100)).encode())
    LogLine.push("u1", "cuzk", b"one more\n")
    kept = list(LogLine.objects.filter(uuid="u1").values_list("text", flat=True))
    # Full: the oldest 10 % went, as vast-manager's buffer dropped them.
    assert len(kept) == 91 and kept[0] == "line 10" and kept[-1] == "one more"
    for n in range(2, 6):  # uuids no instance registered: at most 3 buffers
        LogLine.push(f"u{n}", "setup", b"x\n")
    assert sorted(LogLine.objects.values_list("uuid", flat=True).distinct()) == \
        ["u3", "u4", "u5"]


def test_registered_instances_keep_their_logs_beyond_the_stray_bound(monkeypatch):
    monkeypatch.setattr(instance_models, "STRAY_LOG_BUFFERS", 1)
    me = Instance.register("C.5", 0, None)
    LogLine.push(me.uuid, "setup", b"mine\n")
    LogLine.push("stray-1", "setup", b"x\n")
    LogLine.push("stray-2", "setup", b"x\n")
    assert set(LogLine.objects.values_list("uuid", flat=True)) == {me.uuid, "stray-2"}


def test_rate_limiter_allows_the_burst_then_the_rate():
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.wait("a", 2, 3) for _ in range(3)] == [0, 0, 0]
    assert limiter.wait("a", 2, 3) == pytest.approx(0.5)
    assert limiter.wait("b", 2, 3) == 0  # per address
    now[0] += 0.5
    assert limiter.wait("a", 2, 3) == 0
