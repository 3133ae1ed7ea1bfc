"""vast-manager's instance protocol, as written in its main.go (Curio's history), pressed over
HTTP against the served stack (`manage.py up`): what a script or image built for vast-manager
sends, byte for byte, and what it must get back. The stack runs in compatibility mode (images
that send no secret), with the Vast fake as its provider."""

import asyncio
import http.client
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from devtools.fake_vast import FakeVast
from tests.conftest import REPO, eventually, free_port
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache
from tests.vastmgr.remote.served import served_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

API_KEY = "contract-test-key-0123456789"


class Fake:
    """The Vast fake on its own loop in a thread, as a real provider runs apart."""

    def __init__(self):
        self.vast = FakeVast(API_KEY, boot_s=(0.0, 0.0))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.url = self.call(self.vast.start())

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop(self):
        self.call(self.vast.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def fake():
    found = Fake()
    yield found
    found.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, fake):  # noqa: F811 - the fixture imported above
    yield from served_stack(tmp_path_factory.mktemp("callhome"), param_cache, {
        "VAST_URL": fake.url, "VASTMGR_CALLHOME_AUTH": "compat",
        "VASTMGR_CALLHOME_RATE_PER_S": "5", "VASTMGR_CALLHOME_BURST": "100"})


class Instance:
    """What an image built for vast-manager does: plain HTTP, JSON bodies, no secret."""

    def __init__(self, url: str, secret: str | None = None):
        self.url = url
        self.secret = secret

    def send(self, method: str, path: str, body: bytes | str | dict | None = None,
             headers: dict | None = None) -> tuple[int, str, object]:
        data = json.dumps(body).encode() if isinstance(body, dict) else \
            body.encode() if isinstance(body, str) else body
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers or {})
        if self.secret:
            request.add_header("Authorization", f"Bearer {self.secret}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, kind = response.status, response.read(), \
                    response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        text = raw.decode()
        return status, kind, json.loads(text) if kind.startswith("application/json") else text

    def post(self, path, body):
        return self.send("POST", path, body)

    def get(self, path):
        return self.send("GET", path)


@pytest.fixture(scope="module")
def home(stack):
    return Instance(f"http://127.0.0.1:{stack.callhome_port}")


def status_of(home: Instance, uuid: str) -> dict:
    code, _, rows = home.get("/status")
    assert code == 200
    return next(row for row in rows if row["uuid"] == uuid)


def test_register_params_bench_running(stack, fake, home, operator):
    # A machine rented here whose instance calls home: label C.<vast instance id>.
    fake.vast.add_offer(id=4242, machine_id=777, gpu_name="RTX 4090", num_gpus=2)
    assert operator.post("/remote/offers/api-key/", {"api_key": API_KEY},
                         form="/remote/offers/").status == 200
    rented = operator.post("/remote/offers/rent/", {"offer_ids": [4242], "disk_gb": 64,
                                                    "max_price_per_proof": "0.008"},
                           form="/remote/offers/")
    machine_pk = int(re.search(r"/remote/machines/(\d+)/", rented.url).group(1))
    vast_id = stack.query("SELECT vast_instance_id FROM fleet_machine WHERE id = ?",
                          machine_pk)[0][0]
    label = f"C.{vast_id}"
    env = dict(fake.vast.instances[vast_id]["extra_env"])

    code, kind, first = home.post("/register", {"label": label, "min_rate": 0})
    assert (code, kind) == (200, "application/json")
    assert set(first) == {"uuid", "runner_id"} and re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", first["uuid"])
    # Re-register of a live label: the same pair.
    assert home.post("/register", {"label": label, "min_rate": 99}) == (200, kind, first)
    row = status_of(home, first["uuid"])
    assert row["state"] == "registered" and row["min_rate"] == 50  # min_rate <= 0 → 50
    assert "param_done_at" not in row and "bench_rate" not in row  # omitempty
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["registered_at"])

    assert home.get(f"/runner-id?uuid={first['uuid']}")[2] == {"runner_id": first["runner_id"]}
    assert home.post("/param-done", {"uuid": first["uuid"]})[::2] == (200, {"ok": True})
    assert home.post("/param-done", {"uuid": first["uuid"]})[::2] == (200, {"ok": True})  # no-op
    row = status_of(home, first["uuid"])
    assert row["state"] == "params_done" and "param_done_at" in row

    assert home.post("/bench-done", {"uuid": first["uuid"], "rate": 61.5})[::2] == \
        (200, {"ok": True, "passed": True})
    row = status_of(home, first["uuid"])
    assert (row["state"], row["bench_rate"]) == ("bench_done", 61.5)
    # host_perf keeps the best rate per machine and GPU set.
    perf = "SELECT proofs_per_hour FROM remote_machineperf WHERE provider_machine_id = 777 " \
           "AND gpu_name = 'RTX 4090' AND gpu_count = 2"
    eventually(lambda: stack.query(perf) == [(61.5,)], 30, "host perf not recorded")
    assert home.post("/running", {"uuid": first["uuid"]})[::2] == (200, {"ok": True})
    assert status_of(home, first["uuid"])["state"] == "running"
    # The machine followed every step, each an Event.
    assert stack.query("SELECT state, bench_rate FROM fleet_machine WHERE id = ?",
                       machine_pk) == [("running", 61.5)]
    assert home.post("/bench-done", {"uuid": first["uuid"], "rate": 40.0})[::2] == \
        (200, {"ok": True, "passed": False})
    assert stack.query(perf) == [(61.5,)]  # MAX, not the last
    # main.go checks no state here: a failed benchmark kills even a running instance.
    assert status_of(home, first["uuid"])["state"] == "killed"

    # Logs pushed by source appear on the machine's page.
    for source, text in (("setup", "fetching params\nparams ok\n"),
                         ("benchout", "rate=61.5 proofs/h\n")):
        code, _, body = home.send("POST", "/api/log-push", text,
                                  {"X-Instance-UUID": first["uuid"], "X-Log-Source": source})
        assert (code, body) == (204, "")
    page = operator.get(f"/remote/machines/{machine_pk}/").body
    assert "params ok" in page and "rate=61.5 proofs/h" in page
    assert page.index("setup") < page.index("params ok")
    # The rental got its deployment secret in its environment; the listener knows it.
    assert Instance(home.url, env["VASTMGR_CALLHOME_SECRET"]).get("/status")[0] == 200


def test_a_failed_benchmark_kills_and_destroys(stack, fake, home):
    vast_id = fake.vast.add_instance(label=None)
    vast_machine = fake.vast.instances[vast_id]["machine_id"]
    label = f"C.{vast_id}"
    _, _, first = home.post("/register", {"label": label, "min_rate": 30})
    assert home.post("/bench-done", {"uuid": first["uuid"], "rate": 12.25})[::2] == \
        (200, {"ok": True, "passed": False})
    row = status_of(home, first["uuid"])
    assert row["state"] == "killed" and row["kill_reason"] == \
        "bench_rate 12.2 below min_rate 30.0" and "killed_at" in row
    eventually(lambda: vast_id not in fake.vast.instances, 30,
               "the failed instance was not destroyed on Vast")
    # Not a machine of ours: its host's performance came from Vast's record of the instance.
    assert stack.query("SELECT proofs_per_hour FROM remote_machineperf WHERE "
                       "provider_machine_id = ?", vast_machine) == [(12.25,)]
    assert home.post("/running", {"uuid": first["uuid"]}) == \
        (404, "application/json", {"error": "instance not found or already killed"})
    # A killed label registers anew: a new uuid and a new runner id.
    code, _, again = home.post("/register", {"label": label})
    assert code == 200 and again["uuid"] != first["uuid"]
    assert again["runner_id"] > first["runner_id"]


def test_unknown_uuids_and_bad_requests(home):
    json_kind = "application/json"
    for path in ("/param-done", "/bench-done"):
        assert home.post(path, {"uuid": "no-such-uuid", "rate": 1}) == \
            (404, json_kind, {"error": "instance not found"})
    assert home.post("/running", {"uuid": "no-such-uuid"})[0] == 404
    assert home.get("/runner-id?uuid=no-such-uuid") == \
        (404, json_kind, {"error": "instance not found"})
    assert home.get("/runner-id") == (400, json_kind, {"error": "uuid query param required"})
    assert home.post("/register", {"min_rate": 5}) == (400, json_kind,
                                                       {"error": "label is required"})
    code, _, body = home.post("/register", "{not json")
    assert code == 400 and body["error"].startswith("bad request: ")
    assert home.post("/register", b"")[::2] == (400, {"error": "bad request: EOF"})
    assert home.post("/register", {"label": 5})[0] == 400
    assert home.get("/register") == (405, "text/plain; charset=utf-8", "method not allowed\n")
    assert home.get("/no-such-route")[0] == 404
    # The dashboard's pages are not on this port.
    assert home.get("/accounts/login/")[0] == 404


def test_log_push_truncates_at_256_kb_and_keeps_sources_apart(stack, home):
    _, _, me = home.post("/register", {"label": "log-pusher"})
    line = "x" * 1023 + "\n"  # 1 KiB per line
    code, _, _ = home.send("POST", "/api/log-push", (line * 300).encode(),
                           {"X-Instance-UUID": me["uuid"], "X-Log-Source": "cuzk"})
    assert code == 204
    kept = stack.query("SELECT COUNT(*), SUM(LENGTH(text)) FROM instances_logline "
                       "WHERE uuid = ? AND source = 'cuzk'", me["uuid"])[0]
    assert kept == (256, 256 * 1023)  # 256 KiB read, the rest dropped
    assert home.send("POST", "/api/log-push", "a line\n", {"X-Instance-UUID": me["uuid"]})[0] \
        == 204
    assert stack.query("SELECT source FROM instances_logline WHERE uuid = ? AND text = "
                       "'a line'", me["uuid"]) == [("unknown",)]
    assert home.send("POST", "/api/log-push", "x\n")[::2] == \
        (400, {"error": "X-Instance-UUID header required"})
    assert home.send("POST", "/api/log-push", b"",
                     {"X-Instance-UUID": me["uuid"]})[0] == 204  # empty: nothing stored


def test_bad_hosts(home):
    assert home.post("/bad-host", {"machine_id": "31337", "reason": "flaky GPU"})[::2] == \
        (200, {"ok": True})
    code, _, listed = home.get("/bad-host")
    assert code == 200 and {"machine_id": "31337", "reason": "flaky GPU"}.items() <= \
        next(b for b in listed if b["machine_id"] == "31337").items()
    assert home.post("/bad-host", {"reason": "x"})[::2] == (400, {"error": "machine_id required"})
    assert home.send("DELETE", "/bad-host/31337")[::2] == (200, {"ok": True})
    assert all(b["machine_id"] != "31337" for b in home.get("/bad-host")[2])


def test_secrets_bind_an_instance(stack, home):
    wrong = Instance(home.url, secret="vmch_not-issued")
    assert wrong.post("/register", {"label": "secret-holder"})[0] == 401
    issued = subprocess.run([sys.executable, "manage.py", "callhome_secret", "--note", "test"],
                            cwd=REPO, env=stack.env, capture_output=True, text=True, check=True)
    secret = issued.stdout.strip().split("=", 1)[1]
    holder = Instance(home.url, secret=secret)
    code, _, me = holder.post("/register", {"label": "secret-holder"})
    assert code == 200
    # Registered with a secret: nobody without it can drive it, even in compatibility mode.
    assert home.post("/running", {"uuid": me["uuid"]})[0] == 401
    assert home.send("POST", "/api/log-push", "x\n", {"X-Instance-UUID": me["uuid"]})[0] == 401
    assert holder.post("/running", {"uuid": me["uuid"]})[::2] == (200, {"ok": True})


def test_a_script_uses_the_json_api_with_a_token_made_on_its_page(stack, fake, operator, home):
    page = operator.post("/api/tokens/", {"name": "fleet script"}).body
    token = re.search(r'<code id="new-token">([^<]+)</code>', page).group(1)
    script = Instance(stack.url, secret=token)  # Authorization: Bearer, as on the call-home port
    code, _, machines = script.get("/api/v1/machines?include_killed=true")
    assert code == 200 and {m["provider"] for m in machines} >= {"local", "vast"}
    code, _, dashboard = script.get("/api/dashboard")
    assert code == 200 and dashboard["summary"]["total"] == len(dashboard["instances"]) >= 3
    # vast-manager's Kill of an instance no machine here manages: destroyed on Vast.
    stray = fake.vast.add_instance(label="someone-else")
    assert script.post("/api/kill", {"vast_id": stray})[::2] == (200, {"ok": True})
    assert stray not in fake.vast.instances
    assert home.get("/api/v1/machines")[0] == 404  # the API is not on the call-home port
    assert Instance(stack.url).get("/api/v1/machines")[0] == 401


def test_an_upstream_worker_rented_from_the_dialog_calls_home_and_its_machine_follows(
        stack, fake, home, operator):
    # vast-manager's deploy, from the rent dialog: its image, env and onstart reach Vast as is.
    # Its SSH address is a closed port: the controller's watch of its status fails at once,
    # and no real sshd on this machine is asked.
    fake.vast.ssh_endpoint = ("127.0.0.1", free_port())
    fake.vast.add_offer(id=5151, machine_id=5150, gpu_name="RTX 4090")
    assert operator.post("/remote/offers/api-key/", {"api_key": API_KEY},
                         form="/remote/offers/").status == 200
    onstart = "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
    rented = operator.post("/remote/offers/rent/", {
        "offer_ids": [5151], "disk_gb": 250, "max_price_per_proof": "0.008",
        "engine_flavour": "cuzk-upstream", "image": "magik6k/curio-cuzk:latest",
        "env": "PAVAIL=pa-secret\nPAVAIL_SERVER=192.0.2.7:22222", "onstart": onstart},
        form="/remote/offers/")
    machine_pk = int(re.search(r"/remote/machines/(\d+)/", rented.url).group(1))
    [(_, _, create, _)] = [r for r in fake.vast.requests
                           if r[0] == "PUT" and r[1] == "/api/v0/asks/5151/"]
    secret = create["env"].pop("VASTMGR_CALLHOME_SECRET")
    min_rate = stack.query("SELECT min_bench_rate FROM remote_remotemachine WHERE machine_id = ?",
                           machine_pk)[0][0]
    assert create["env"] == {"PAVAIL": "pa-secret", "PAVAIL_SERVER": "192.0.2.7:22222",
                             "MIN_RATE": f"{min_rate:.1f}"}
    assert (create["image"], create["onstart"], create["runtype"], create["disk"]) == \
        ("magik6k/curio-cuzk:latest", onstart, "ssh_direc ssh_proxy", 250)

    # Its image calls home with the secret from its environment (no label we could match).
    instance = Instance(home.url, secret)
    _, _, me = instance.post("/register", {"label": "worker-a", "min_rate": min_rate})
    for path, body, state in (("/param-done", {"uuid": me["uuid"]}, "params_ready"),
                              ("/bench-done", {"uuid": me["uuid"], "rate": min_rate + 1},
                               "benchmarked"),
                              ("/running", {"uuid": me["uuid"]}, "running")):
        assert instance.post(path, body)[0] == 200
        page = operator.get(f"/remote/machines/{machine_pk}/").body
        shown = re.search(rf'id="machine-{machine_pk}-state"[^>]*>(\w+)<', page).group(1)
        assert shown == state == stack.query("SELECT state FROM fleet_machine WHERE id = ?",
                                             machine_pk)[0][0]
    assert stack.query("SELECT engine_flavour FROM fleet_machine WHERE id = ?", machine_pk) == \
        [("cuzk-upstream",)]


def test_vast_managers_operator_routes_on_the_served_stack(stack, fake, operator):
    page = operator.post("/api/tokens/", {"name": "vast-manager script"}).body
    script = Instance(stack.url, re.search(r'<code id="new-token">([^<]+)</code>', page).group(1))
    code, _, lines = script.get("/api/manager-logs?tail=2")
    assert code == 200 and len(lines) == 2 and {line["src"] for line in lines} == {"manager"}
    fake.vast.add_offer(id=6161, machine_id=6160, gpu_name="RTX 4090", disk_space=2000.0)
    code, _, found = script.get("/api/offers?filter=gpu_name=RTX_4090%20disk_space%3E=1500")
    assert code == 200 and 6161 in [o["id"] for o in found["offers"]]
    assert found["total"] == found["filtered"] == len(found["offers"])
    assert script.get("/api/offers?filter=warp_drive>9")[::2] == \
        (400, {"error": "bad filter: unknown column 'warp_drive'"})
    assert script.get("/api/cuzk-status/no-such-uuid")[::2] == \
        (404, {"error": "no SSH info for instance"})
    assert script.post("/api/deploy", {"machine_id": 1})[::2] == \
        (400, {"error": "offer_id required"})
    assert script.post("/api/deploy", "{not json")[0] == 400
    assert Instance(stack.url).get("/api/manager-logs")[0] == 401


def test_rate_limited_per_address(stack, home):
    # An instance at another loopback address: it empties its own bucket, not the one the
    # module's other tests share (127.0.0.1), which goes on answering.
    connection = http.client.HTTPConnection("127.0.0.1", stack.callhome_port, timeout=30,
                                            source_address=("127.0.0.2", 0))
    answers = []
    for _ in range(120):
        connection.request("GET", "/runner-id?uuid=none")
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read())))
    connection.close()
    assert {code for code, _ in answers} == {404, 429}
    limited = next(body for code, body in answers if code == 429)
    assert limited["error"].startswith("too many requests: retry in ")
    assert home.get("/runner-id?uuid=none")[0] == 404
