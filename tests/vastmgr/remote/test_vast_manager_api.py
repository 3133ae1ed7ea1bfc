"""vast-manager's remaining operator routes, with main.go's bodies and codes (Curio's history,
cmd/vast-manager/main.go): `/api/manager-logs`, `/api/offers?filter=`, `/api/deploy` and
`/api/cuzk-status/{uuid}`, against the strict Vast fake, a fake SSH host (and for the status,
Debian's real sshd too) and a fake upstream cuzk status server. Bad input is a 4xx with a
message, never a 5xx."""

import json

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from tests.vastmgr.fake_upstream import FakeUpstream
from vastmgr.api.models import ApiToken
from vastmgr.fleet.models import Event, Machine
from vastmgr.instances.models import Instance
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import BadMachine, MachinePerf, RemoteMachine, Secret

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def bearer(name: str, staff: bool = True) -> dict:
    user = User.objects.create_user(name, password="pw-123456789", is_staff=staff)
    return {"Authorization": f"Bearer {ApiToken.issue(user, 'script')[1]}"}


def call(method: str, path: str, headers: dict, body=None):
    client = Client()
    if method == "post":
        answer = client.post(path, body if isinstance(body, str) else json.dumps(body or {}),
                             content_type="application/json", headers=headers)
    else:
        answer = client.get(path, headers=headers)
    kind = answer.headers.get("Content-Type", "")
    return answer.status_code, answer.json() if kind.startswith("application/json") else \
        answer.content.decode()


@pytest.fixture
async def market(fake_vast, settings):
    settings.VASTMGR_REMOTE = RemoteSettings(
        vast_url=fake_vast.url, upstream_env="PAVAIL=pa-secret\nPAVAIL_SERVER=192.0.2.7:22222")
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    return fake_vast


async def test_the_manager_log_is_the_event_log_oldest_first():
    headers = await sync_to_async(bearer)("ops", staff=False)
    for n in range(7):
        await sync_to_async(Event.record)("vast", f"line {n}")
    code, lines = await sync_to_async(call)("get", "/api/manager-logs?tail=3", headers)
    assert code == 200 and [line["text"].rsplit(" ", 2)[1:] for line in lines] == \
        [["line", "4"], ["line", "5"], ["line", "6"]]
    assert all(line["src"] == "manager" and "[vast] line" in line["text"] and
               isinstance(line["ts"], int) for line in lines)
    # main.go: a tail that is not a positive integer is the default (500).
    for tail in ("x", "-1", "0", ""):
        code, lines = await sync_to_async(call)("get", f"/api/manager-logs?tail={tail}", headers)
        assert code == 200 and len(lines) == 7
    assert (await sync_to_async(call)("get", "/api/manager-logs", {}))[0] == 401


async def test_offers_take_vast_managers_filter_string(market):
    fake_vast = market
    big = fake_vast.add_offer(gpu_name="RTX 4090", machine_id=801, disk_space=500.0,
                              cpu_ram=256_000, cuda_max_good=13.0, inet_down=1000.0,
                              cpu_cores=32, dph_base=0.4)
    small = fake_vast.add_offer(gpu_name="RTX 4090", machine_id=802, disk_space=100.0)
    await sync_to_async(BadMachine.flag)(801, "flaky")
    await MachinePerf.objects.acreate(provider_machine_id=801, gpu_name="RTX 4090", gpu_count=1,
                                   proofs_per_hour=44.0)
    headers = await sync_to_async(bearer)("viewer", staff=False)

    code, body = await sync_to_async(call)("get", "/api/offers", headers)
    assert code == 200
    *_, query = (q for _, path, q, _ in fake_vast.requests if path == "/api/v0/bundles/")
    # vast-manager's default filter, in Vast's units (RAM in MB) and names.
    assert query["disk_space"] == {"gte": 250} and query["dph_total"] == {"lte": 0.9}
    assert query["gpu_ram"] == {"gt": 12500} and query["cpu_ram"] == {"gte": 240000}
    assert query["cuda_max_good"] == {"gte": 13} and query["cpu_cores"] == {"gt": 25}
    assert [o["id"] for o in body["offers"]] == [big["id"]]
    assert body["total"] == body["filtered"] == 1
    [offer] = body["offers"]
    assert offer["is_bad_host"] and offer["bad_reason"] == "flaky"
    assert offer["known_perf"]["bench_rate"] == 44.0 and offer["known_perf"]["machine_id"] == 801
    assert offer["machine_id"] == 801 and offer["gpu_ram"] == big["gpu_ram"]

    code, body = await sync_to_async(call)(
        "get", "/api/offers?filter=gpu_name=RTX_4090%20disk_space%3C200", headers)
    assert code == 200 and [o["id"] for o in body["offers"]] == [small["id"]]
    assert "known_perf" not in body["offers"][0] and "bad_reason" not in body["offers"][0]
    assert body["offers"][0]["is_bad_host"] is False
    for bad in ("nonsense>1", "disk_space>>1", "gpu_ram>lots", "disk_space", "x" * 1001):
        code, body = await sync_to_async(call)("get", f"/api/offers?filter={bad}", headers)
        assert code == 400 and body["error"].startswith("bad filter: "), bad


async def test_deploy_rents_an_upstream_cuzk_worker(market, fake_host):
    fake_vast = market
    offer = fake_vast.add_offer(gpu_name="RTX 4090", machine_id=901)
    staff = await sync_to_async(bearer)("ops")
    code, body = await sync_to_async(call)("post", "/api/deploy", staff,
                                           {"offer_id": offer["id"], "machine_id": 901})
    machine = await Machine.objects.select_related("remote").aget(provider="vast")
    assert code == 200 and body["ok"] is True
    assert body["instance_id"] == machine.vast_instance_id and "rented offer" in body["message"]
    assert machine.engine_flavour == "cuzk-upstream" and machine.remote.min_bench_rate == 30
    [create] = [q for method, _, q, _ in fake_vast.requests if method == "PUT"]
    secret = create["env"].pop("VASTMGR_CALLHOME_SECRET")
    assert secret.startswith("vmch_")
    # main.go's deploy: the image, its env with MIN_RATE as %.1f, --ssh --direct, the onstart.
    assert create["env"] == {"PAVAIL": "pa-secret", "PAVAIL_SERVER": "192.0.2.7:22222",
                             "MIN_RATE": "30.0"}
    assert (create["image"], create["disk"], create["runtype"]) == \
        ("magik6k/curio-cuzk:latest", 250, "ssh_direc ssh_proxy")
    assert create["onstart"] == \
        "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"

    await sync_to_async(BadMachine.flag)(902, "burnt")
    code, body = await sync_to_async(call)("post", "/api/deploy", staff,
                                           {"offer_id": 5, "machine_id": 902})
    assert (code, body) == (409, {"error": "machine 902 is on bad hosts list: burnt"})
    code, body = await sync_to_async(call)("post", "/api/deploy", staff, {"offer_id": 12345})
    assert code == 409 and body["error"].startswith("deploy failed: ")
    assert (await sync_to_async(call)("post", "/api/deploy", staff, {}))[1] == \
        {"error": "offer_id required"}
    assert (await sync_to_async(call)("post", "/api/deploy", staff,
                                      {"offer_id": 1, "disk": 9000}))[0] == 400
    for bad in ('{"offer_id": "many"}', "{not json", '{"offer_id": 1e400}'):
        code, _ = await sync_to_async(call)("post", "/api/deploy", staff, bad)
        assert 400 <= code < 500, bad
    viewer = await sync_to_async(bearer)("viewer", staff=False)
    assert await sync_to_async(call)("post", "/api/deploy", viewer, {"offer_id": 1}) == \
        (403, {"error": "only staff may deploy"})
    assert await Machine.objects.filter(provider="vast").acount() == 1


async def test_cuzk_status_is_read_through_the_machines_ssh_tunnel(fake_host, client_key):
    await cuzk_status_through_ssh(fake_host.port, "prover", client_key)


async def test_cuzk_status_is_read_through_a_real_sshd(sshd_host, client_key):
    """The same through Debian's OpenSSH server, as a rented host runs it."""
    await cuzk_status_through_ssh(sshd_host.port, sshd_host.user, client_key)
    assert sshd_host.log().count("Accepted publickey") >= 1


async def cuzk_status_through_ssh(ssh_port: int, ssh_user: str, client_key) -> None:
    with FakeUpstream() as upstream:
        machine = await Machine.objects.acreate(
            name="vast-77", provider="vast", host="127.0.0.1", ssh_port=ssh_port,
            ssh_user=ssh_user, engine_flavour="cuzk-upstream", engine_port=upstream.port,
            state="running")
        remote = await RemoteMachine.objects.acreate(machine=machine)
        await sync_to_async(Secret.store)(remote.ssh_key_secret_name,
                                          client_key.export_private_key().decode())
        instance = await Instance.objects.acreate(uuid="5f0c1a7e-0000-4000-8000-000000000001",
                                                  label="C.77", runner_id=1, machine=machine)
        headers = await sync_to_async(bearer)("viewer", staff=False)
        code, body = await sync_to_async(call)("get", f"/api/cuzk-status/{instance.uuid}",
                                               headers)
        assert code == 200 and body == json.loads(json.dumps(upstream.body()))
        assert upstream.requests and upstream.requests[-1].startswith("GET /status")

    # The daemon is gone: main.go's 502 with the reason.
    code, body = await sync_to_async(call)("get", f"/api/cuzk-status/{instance.uuid}", headers)
    assert code == 502 and body["error"].startswith("status unreachable over SSH: ")
    for unknown in ("no-such-uuid", "x" * 500):
        assert await sync_to_async(call)("get", f"/api/cuzk-status/{unknown}", headers) == \
            (404, {"error": "no SSH info for instance"})
    assert (await sync_to_async(call)("get", f"/api/cuzk-status/{instance.uuid}", {}))[0] == 401

