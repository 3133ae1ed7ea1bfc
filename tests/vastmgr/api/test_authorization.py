"""Who may do what through the JSON API: the pages' permissions, a token or a session, and
4xx with a message for everything else."""

import json
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from vastmgr.api.models import ApiToken
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Machine
from vastmgr.instances.models import Instance, LogLine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.models import RemoteMachine

pytestmark = pytest.mark.django_db


def call(client, method: str, path: str, token: str | None = None, body: dict | None = None):
    headers = {"Authorization": token} if token else {}
    response = getattr(client, method)(path, json.dumps(body or {}),
                                       content_type="application/json", headers=headers) \
        if method == "post" else client.get(path, headers=headers)
    return response.status_code, response.json() if response.content else None


@pytest.fixture
def ssh_host(db) -> Machine:
    machine = Machine.objects.create(name="gpu-1", provider=Machine.Provider.SSH, host="127.0.0.9")
    RemoteMachine.objects.create(machine=machine)
    return machine


EVERY_OPERATION = [("get", "/api/v1/machines"), ("get", "/api/v1/machines/1"),
                   ("post", "/api/v1/machines"), ("post", "/api/v1/machines/1/actions/destroy"),
                   ("get", "/api/v1/proofs"), ("post", "/api/v1/proofs"),
                   ("get", "/api/v1/events"), ("get", "/api/v1/fleet"),
                   ("get", "/api/v1/offers"), ("post", "/api/v1/offers/1/rent"),
                   ("get", "/api/dashboard"), ("get", "/api/instance-logs/x"),
                   ("get", "/api/host-perf"), ("post", "/api/kill"),
                   ("get", "/api/manager-logs"), ("get", "/api/offers?filter=num_gpus=1"),
                   ("post", "/api/deploy"), ("get", "/api/cuzk-status/x")]


@pytest.mark.parametrize("token", [None, "Bearer vmapi_not-a-token", "Basic b3BzOnB3"])
def test_no_valid_token_is_401_everywhere(client, ssh_host, token):
    for method, path in EVERY_OPERATION:
        assert call(client, method, path, token)[0] == 401, path
    assert Machine.objects.get(pk=ssh_host.pk).state != Machine.State.KILLED


def test_the_schema_is_served_without_a_token(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["info"]["version"] == "1" and "/api/v1/machines/{machine_id}" in \
        schema["paths"]


def test_a_non_staff_token_reads_but_cannot_act_on_machines(client, tokens, ssh_host):
    viewer = tokens["viewer"]
    code, machines = call(client, "get", "/api/v1/machines", viewer)
    assert code == 200 and [m["name"] for m in machines] == ["gpu-1"]
    for action in ("destroy", "provision", "stop", "test"):
        assert call(client, "post", f"/api/v1/machines/{ssh_host.pk}/actions/{action}",
                    viewer) == (403, {"detail": "only staff may act on machines"})
    assert call(client, "post", "/api/v1/machines", viewer,
                {"name": "x", "host": "h", "private_key": "k"})[0] == 403
    assert call(client, "post", "/api/v1/offers/5/rent", viewer, {})[0] == 403
    assert Machine.objects.get(pk=ssh_host.pk).state == Machine.State.REGISTERED
    assert not Machine.objects.filter(name="x").exists()


def test_staff_destroys_through_the_api(client, tokens, ssh_host):
    code, result = call(client, "post", f"/api/v1/machines/{ssh_host.pk}/actions/destroy",
                        tokens["staff"])
    assert code == 200 and result["machine"]["state"] == "killed"
    assert Machine.objects.get(pk=ssh_host.pk).kill_reason == "destroyed by ops (API)"
    assert call(client, "post", f"/api/v1/machines/{ssh_host.pk}/actions/destroy",
                tokens["staff"])[0] == 409


def test_proofs_are_changed_by_staff_or_who_started_them(client, tokens):
    viewer, staff = tokens["viewer"], tokens["staff"]
    theirs = ProofJob.objects.create(kind="winning-post", seed=1,
                                     requested_by=User.objects.get(username="ops"))
    assert call(client, "post", f"/api/v1/proofs/{theirs.pk}/cancel", viewer)[0] == 403
    code, mine = call(client, "post", "/api/v1/proofs", viewer, {"kind": "window-post"})
    assert code == 201 and len(mine) == 1
    # No engine is online: it failed at once, saying why; its starter may retry it.
    assert mine[0]["status"] == "failed" and "no engine" in mine[0]["error"]
    code, retried = call(client, "post", f"/api/v1/proofs/{mine[0]['id']}/retry", viewer)
    assert code == 201 and retried["retry_of"] == mine[0]["id"]
    code, cancelled = call(client, "post", f"/api/v1/proofs/{theirs.pk}/cancel", staff)
    assert code == 200 and cancelled["status"] == "cancelled"
    assert call(client, "post", f"/api/v1/proofs/{theirs.pk}/cancel", staff)[0] == 409


def test_bad_input_is_a_4xx_with_a_message(client, tokens):
    staff = tokens["staff"]
    assert call(client, "get", f"/api/v1/machines/{2**63}", staff)[0] == 422
    assert call(client, "get", "/api/v1/machines/99", staff) == \
        (404, {"detail": "no machine 99"})
    assert call(client, "post", "/api/v1/machines/1/actions/explode", staff)[0] == 422
    code, body = call(client, "get", "/api/v1/proofs?sort=nonsense", staff)
    assert code == 400 and body["detail"].startswith("sort: ")
    code, body = call(client, "post", "/api/v1/machines", staff,
                      {"name": "has space", "host": "h"})
    assert code == 400 and "name:" in body["detail"] and "private_key:" in body["detail"]
    assert call(client, "post", "/api/v1/proofs", staff, {"kind": "no-such-kind"})[0] == 422
    assert call(client, "get", "/api/v1/offers", staff)[1] == \
        {"detail": "Enter your Vast API key first (at the top of the Offers page)"}


def test_tokens_are_created_in_the_ui_shown_once_and_hashed(client):
    person = User.objects.create_user("ann", password="pw-ann-123456")
    client.force_login(person)
    page = client.post("/api/tokens/", {"name": "nightly script"}).content.decode()
    token = page.split('<code id="new-token">')[1].split("</code>")[0]
    stored = ApiToken.objects.get(user=person)
    assert token.startswith("vmapi_") and token not in {stored.digest, stored.hint}
    assert token not in client.get("/api/tokens/").content.decode()  # never shown again
    client.logout()
    assert call(client, "get", "/api/v1/fleet", f"Bearer {token}")[0] == 200
    # Another person cannot revoke it; its owner can, and then it is refused.
    client.force_login(User.objects.create_user("bob"))
    assert client.post(f"/api/tokens/{stored.pk}/revoke/").status_code == 404
    client.force_login(person)
    client.post(f"/api/tokens/{stored.pk}/revoke/")
    client.logout()
    assert call(client, "get", "/api/v1/fleet", f"Bearer {token}")[0] == 401


# DashboardInstance's JSON names in vast-manager's main.go (the omitempty ones set here).
DASHBOARD_INSTANCE = {
    "uuid", "label", "runner_id", "state", "min_rate", "registered_at", "param_done_at",
    "bench_done_at", "bench_rate", "vast_id", "gpu_name", "num_gpus", "dph_total",
    "price_per_proof", "ssh_cmd", "host_id", "machine_id", "geolocation", "cpu_ram_mb",
    "gpu_util", "gpu_temp", "gpu_ram_mb", "cuda_version", "inet_down_mbps", "inet_up_mbps",
    "cpu_util", "mem_usage_gb", "mem_limit_gb", "disk_space_gb", "gpu_mem_bw",
    "driver_version", "reliability", "start_date", "gpu_frac", "status_msg", "public_ip",
    "has_logs", "log_lines"}


def test_vast_manager_dashboard_fields(client, tokens):
    rented = Machine.objects.create(name="vast-77", provider=Machine.Provider.VAST,
                                    vast_instance_id=77, gpu_name="RTX 4090", gpu_count=2,
                                    price_per_hour=Decimal("0.80"))
    ledger.bill(rented, "running", "0.80", gpus=2, cause="rent")
    Machine.objects.create(name="vast-78", provider=Machine.Provider.VAST, vast_instance_id=78)
    instance = Instance.register("C.77", 30, None)
    instance.params_done()
    instance.bench_done(40.0)
    instance.running()
    LogLine.push(instance.uuid, "cuzk", b"one\ntwo\n")
    code, body = call(client, "get", "/api/dashboard", tokens["viewer"])
    [row, loading] = body["instances"]
    assert set(row) == DASHBOARD_INSTANCE and set(loading) == DASHBOARD_INSTANCE - {
        "param_done_at", "bench_done_at", "bench_rate"}
    assert (row["state"], row["vast_id"], row["num_gpus"], row["log_lines"]) == \
        ("running", 77, 2, 2)
    assert row["price_per_proof"] == pytest.approx(0.80 / 40)
    assert (loading["state"], loading["vast_id"]) == ("loading", 78)
    assert body["summary"] | {"avg_price_per_proof": 0} == {
        "total": 2, "running": 1, "benching": 0, "fetching": 0, "loading": 1, "killed": 0,
        "total_dph": 0.8, "total_proofs_hour": 40.0, "avg_price_per_proof": 0,
        "total_gpus": 2, "total_spent": body["summary"]["total_spent"]}
    assert 0 <= body["summary"]["total_spent"] < 0.01
    assert row["machine_id"] == 0  # Vast's machine id, not known for this one: Go's zero
    code, lines = call(client, "get", f"/api/instance-logs/{instance.uuid}?source=cuzk&tail=1",
                       tokens["viewer"])
    assert code == 200 and [(line["src"], line["text"]) for line in lines] == [("cuzk", "two")]
    assert call(client, "get", f"/api/instance-logs/{instance.uuid}?tail={2**70}",
                tokens["viewer"])[0] == 200
    assert call(client, "get", "/api/host-perf", tokens["viewer"])[1] == []  # no Vast machine id
    # vast-manager's Kill: staff only; kills the called-home instance.
    assert call(client, "post", "/api/kill", tokens["viewer"], {"uuid": instance.uuid})[0] == 403
    assert call(client, "post", "/api/kill", tokens["staff"], {"uuid": instance.uuid}) == \
        (200, {"ok": True})
    instance.refresh_from_db()
    assert (instance.state, instance.kill_reason) == ("killed", "manually killed via UI")
    assert code == 200 and set(body) == {"instances", "bad_machines", "summary", "updated_at",
                                         "vast_cache_age_s"}
    assert set(body["summary"]) == {"total", "running", "benching", "fetching", "loading",
                                    "killed", "total_dph", "total_proofs_hour",
                                    "avg_price_per_proof", "total_gpus", "total_spent"}
