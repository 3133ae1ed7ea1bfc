"""vast-manager parity on the offers and bad-hosts pages, through the Django client against the
strict fake Vast: hide bad hosts, the known-perf badge, bulk ignore, the rent dialog's minimum
bench rate (ceil($/h ÷ max $/proof)) carried to the benchmark gate, remembered values per user,
the reconcile's hardware facts and listing time; bad input is a 400 with the reason."""

import math
import re
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from vastmgr.fleet.models import Machine
from vastmgr.remote import vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import judge_benchmark
from vastmgr.remote.models import (
    BadMachine,
    MachinePerf,
    RemoteMachine,
    RentPreference,
    Secret,
    VastSync,
)
from vastmgr.remote.tunnel import has_engine

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(name: str, staff: bool = True) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(name, password="pw-123456789", is_staff=staff))
    return client


@pytest.fixture
async def market(fake_vast, settings):
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url)
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    offers = [fake_vast.add_offer(gpu_name="RTX 4090", machine_id=machine_id)
              for machine_id in (501, 502, 503)]
    return fake_vast, offers


def offer_rows(html: str) -> dict[int, str]:
    return {int(offer_id): row for offer_id, row in
            re.findall(r'<tr id="offer-(\d+)"(.*?)</tr>', html, re.DOTALL)}


async def test_hide_bad_hosts_known_perf_and_the_bad_badge(market):
    _, offers = market
    await sync_to_async(BadMachine.flag)(502, "broken CUDA")
    await MachinePerf.objects.acreate(provider_machine_id=501, gpu_name="RTX 4090", gpu_count=1,
                                   proofs_per_hour=42.5)
    staff = await sync_to_async(logged_in)("ops")
    html = (await sync_to_async(staff.get)("/remote/offers/", {"gpu_name": "RTX 4090"})
            ).content.decode()
    rows = offer_rows(html)
    assert set(rows) == {o["id"] for o in offers}
    assert 'class="perf perf-good"' in rows[offers[0]["id"]] and "42.5 p/h" in rows[offers[0]["id"]]
    assert "perf-" not in rows[offers[2]["id"]]  # never benchmarked: no badge
    bad = await BadMachine.objects.aget(provider_machine_id=502)
    assert f'data-bad-host="{bad.pk}"' in rows[offers[1]["id"]] and "broken CUDA" in rows[offers[1]["id"]]
    assert "rent-open" not in rows[offers[1]["id"]]  # a bad host cannot be rented
    hidden = (await sync_to_async(staff.get)("/remote/offers/", {"gpu_name": "RTX 4090",
                                                                 "hide_bad": "on"})).content.decode()
    assert set(offer_rows(hidden)) == {offers[0]["id"], offers[2]["id"]}
    assert "1 offer from bad hosts hidden" in hidden


async def test_bulk_ignore_marks_the_machines_bad(market):
    staff = await sync_to_async(logged_in)("ops")
    response = await sync_to_async(staff.post)("/remote/offers/ignore/", {
        "machine_ids": ["501", "503", "501"], "reason": "too far", "next": "/remote/offers/?x=1"})
    assert response.status_code == 302 and response.url == "/remote/offers/?x=1"
    marked = {b.provider_machine_id: b.reason async for b in BadMachine.objects.all()}
    assert marked == {501: "too far (by ops)", 503: "too far (by ops)"}
    for bad in ({"machine_ids": ["x"], "reason": "r"}, {"reason": "r"},
                {"machine_ids": ["1"], "reason": ""},
                {"machine_ids": [str(i) for i in range(21)], "reason": "r"},
                {"machine_ids": [str(2**63)], "reason": "r"}):
        response = await sync_to_async(staff.post)("/remote/offers/ignore/", bad)
        assert response.status_code == 400 and b"Nothing marked" in response.content, bad
    viewer = await sync_to_async(logged_in)("viewer", staff=False)
    response = await sync_to_async(viewer.post)("/remote/offers/ignore/",
                                                {"machine_ids": ["502"], "reason": "r"})
    assert response.status_code == 403 and b"Only staff" in response.content
    assert not await BadMachine.objects.filter(provider_machine_id=502).aexists()


async def test_the_rent_dialog_sets_each_machines_minimum_rate_and_is_remembered(market, fake_host):
    fake_vast, offers = market
    staff = await sync_to_async(logged_in)("ops")
    page = (await sync_to_async(staff.get)("/remote/offers/", {"gpu_name": "RTX 4090"})
            ).content.decode()
    assert 'name="max_price_per_proof" step="0.00001" min="0.00001" max="10" required value="0.008"' in page
    assert 'name="disk_gb" step="1" min="16" max="2000" required value="64"' in page

    response = await sync_to_async(staff.post)("/remote/offers/rent/", {
        "offer_ids": [offers[0]["id"], offers[2]["id"]], "max_price_per_proof": "0.004",
        "disk_gb": "100"})

    assert response.status_code == 302 and response.url == "/"
    machines = [m async for m in Machine.objects.filter(provider="vast").select_related("remote")]
    assert len(machines) == 2
    for machine in machines:
        instance = fake_vast.instances[machine.vast_instance_id]
        assert instance["disk_space"] == 100.0
        expected = math.ceil(Decimal(str(instance["dph_total"])) / Decimal("0.004"))
        assert machine.remote.min_bench_rate == expected
    # remembered for this user (and its offers are priced with that disk), not for another
    pref = await RentPreference.objects.aget(user__username="ops")
    assert (pref.max_price_per_proof, pref.disk_gb) == (Decimal("0.004"), 100)
    page = (await sync_to_async(staff.get)("/remote/offers/", {"gpu_name": "RTX 4090"})
            ).content.decode()
    assert 'value="0.004"' in page and 'required value="100"' in page
    assert "(with 100 GB disk)" in page
    other = await sync_to_async(logged_in)("ops2")
    page = (await sync_to_async(other.get)("/remote/offers/")).content.decode()
    assert 'value="0.008"' in page


async def test_an_upstream_cuzk_worker_is_rented_with_its_image_env_and_onstart(market,
                                                                                 fake_host):
    fake_vast, offers = market
    staff = await sync_to_async(logged_in)("ops")
    page = (await sync_to_async(staff.get)("/remote/offers/")).content.decode()
    # The defaults are vast-manager's image and onstart (settings), offered hidden until chosen.
    assert 'value="magik6k/curio-cuzk:latest"' in page
    # Our engine is the first choice, under the value the form takes.
    assert re.search(r'name="engine_flavour" value="(\w+)" checked', page).group(1) == \
        Machine.Flavour.CUZK_ENGINE
    assert "nohup /usr/local/bin/entrypoint.sh &gt; /var/log/entrypoint.log 2&gt;&amp;1 &amp;" in page

    response = await sync_to_async(staff.post)("/remote/offers/rent/", {
        "offer_ids": [offers[1]["id"]], "max_price_per_proof": "0.01", "disk_gb": "250",
        "engine_flavour": "cuzk-upstream", "image": "magik6k/curio-cuzk:latest",
        "env": "PAVAIL=pa-secret\n# the relay\nPAVAIL_SERVER=192.0.2.7:22222\n",
        "onstart": "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"})

    machine = await Machine.objects.select_related("remote").aget(provider="vast")
    assert response.status_code == 302 and response.url == f"/remote/machines/{machine.pk}/"
    assert machine.engine_flavour == "cuzk-upstream" and machine.engine_port == 9821
    # Watched (its cuzk status through the SSH tunnel) once Vast has given it an address.
    assert machine.host == "" and not has_engine(machine)
    machine.host = "127.0.113.9"
    assert has_engine(machine)
    [create] = [body for method, _, body, _ in fake_vast.requests if method == "PUT"]
    min_rate = machine.remote.min_bench_rate
    assert min_rate == math.ceil(Decimal(str(fake_vast.instances[machine.vast_instance_id][
        "dph_total"])) / Decimal("0.01"))
    secret = create["env"].pop("VASTMGR_CALLHOME_SECRET")
    assert secret.startswith("vmch_")
    assert create["env"] == {"PAVAIL": "pa-secret", "PAVAIL_SERVER": "192.0.2.7:22222",
                             "MIN_RATE": f"{min_rate:.1f}"}
    assert (create["image"], create["disk"], create["runtype"]) == \
        ("magik6k/curio-cuzk:latest", 250, "ssh_direc ssh_proxy")  # vastai --ssh --direct
    assert create["onstart"] == \
        "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
    # Remembered: the next dialog opens on the upstream worker with the same env's names (the
    # values are secrets: test_rent_env_secrets.py).
    page = (await sync_to_async(staff.get)("/remote/offers/")).content.decode()
    assert 'value="cuzk-upstream" checked' in page and "PAVAIL_SERVER=••••••••" in page
    assert "pa-secret" not in page


@pytest.mark.parametrize("fields", [
    {"max_price_per_proof": "0.01", "disk_gb": "64"},
    {"offer_ids": ["abc"], "max_price_per_proof": "0.01", "disk_gb": "64"},
    {"offer_ids": ["1"], "max_price_per_proof": "0", "disk_gb": "64"},
    {"offer_ids": ["1"], "max_price_per_proof": "lots", "disk_gb": "64"},
    {"offer_ids": ["1"], "max_price_per_proof": "0.01", "disk_gb": "5"},
    {"offer_ids": [str(i) for i in range(6)], "max_price_per_proof": "0.01", "disk_gb": "64"},
    *({"offer_ids": ["1"], "max_price_per_proof": "0.01", "disk_gb": "64",
       "engine_flavour": "cuzk-upstream", "image": "magik6k/curio-cuzk:latest", **bad}
      for bad in ({"image": ""}, {"image": "two words"}, {"env": "not an assignment"},
                  {"env": "1X=2"}, {"env": "A=1\nA=2"}, {"env": "MIN_RATE=1"},
                  {"env": "VASTMGR_CALLHOME_SECRET=x"}, {"onstart": "x" * 4097},
                  {"engine_flavour": "docker"})),
])
def test_bad_rent_input_is_a_400_with_the_reason(fields):
    staff = logged_in("ops")
    response = staff.post("/remote/offers/rent/", fields)
    assert response.status_code == 400 and b"Not rented: " in response.content
    assert not Machine.objects.exists() and not RentPreference.objects.exists()


def test_the_benchmark_gate_uses_the_rate_the_rent_asked_for():
    settings = RemoteSettings(min_bench_rate=50)
    machine = Machine.objects.create(name="m", provider="vast", state="params_ready",
                                     vast_machine_id=9, gpu_name="RTX 4090", gpu_count=1)
    RemoteMachine.objects.create(machine=machine, min_bench_rate=63)
    alert = judge_benchmark(machine, 60.0, settings)  # above the global 50, below its 63
    assert alert is not None and "below the minimum 63" in alert.message
    assert BadMachine.objects.filter(provider_machine_id=9).exists()
    other = Machine.objects.create(name="n", provider="vast", state="params_ready")
    RemoteMachine.objects.create(machine=other)  # no rate asked: the configured one
    assert judge_benchmark(other, 55.0, settings) is None
    other.refresh_from_db()
    assert other.state == Machine.State.BENCHMARKED


async def test_reconcile_keeps_the_hardware_facts_and_when_it_listed_them(market, fake_host,
                                                                          no_sleep):
    fake_vast, offers = market
    client = vast.VastClient(API_KEY, fake_vast.url, sleep=no_sleep)
    machine = await vast.rent(client, vast.RentRequest.from_offer(offers[0]))
    assert await sync_to_async(VastSync.age_s)() is None
    instance = fake_vast.instances[machine.vast_instance_id]
    instance.update(gpu_util=55.0, gpu_temp=66.0)

    await vast.reconcile(client)

    remote = await RemoteMachine.objects.aget(machine=machine)
    assert remote.vast_facts["gpu_util"] == 55.0 and remote.vast_facts["gpu_temp"] == 66.0
    assert remote.vast_facts["num_gpus"] == 1 and "mem_usage" not in remote.vast_facts
    assert remote.vast_seen_at is not None
    assert 0 <= await sync_to_async(VastSync.age_s)() < 30


def test_the_bad_hosts_page_adds_and_removes(client):
    staff = logged_in("ops")
    response = staff.post("/remote/bad-machines/", {"provider_machine_id": "4242",
                                                 "reason": "kernel panics"})
    assert response.status_code == 302
    bad = BadMachine.objects.get()
    assert (bad.provider_machine_id, bad.reason) == (4242, "kernel panics (by ops)")
    html = staff.get("/remote/bad-machines/").content.decode()
    assert f'id="bad-host-{bad.pk}"' in html and "kernel panics" in html
    for fields in ({"provider_machine_id": "-1", "reason": "r"},
                   {"provider_machine_id": "x", "reason": "r"},
                   {"provider_machine_id": "1", "reason": ""}):
        response = staff.post("/remote/bad-machines/", fields)
        assert response.status_code == 400 and b'class="form-errors"' in response.content
    viewer = logged_in("viewer", staff=False)
    page = viewer.get("/remote/bad-machines/")
    assert page.status_code == 200 and b'id="bad-host-form"' not in page.content
    assert viewer.post("/remote/bad-machines/", {"provider_machine_id": "1",
                                              "reason": "r"}).status_code == 403
    assert staff.post(f"/remote/bad-machines/{bad.pk}/unmark/").status_code == 302
    assert not BadMachine.objects.exists()
    assert client.get("/remote/bad-machines/").status_code == 302  # logged out: to the login


async def test_vast_managers_filters_reach_the_search_in_vasts_units(market):
    fake_vast, offers = market
    staff = await sync_to_async(logged_in)("ops")
    page = await sync_to_async(staff.get)("/remote/offers/", {
        "gpu_name": "RTX 4090", "min_gpu_ram_gb": "20", "min_disk_gb": "150",
        "min_inet_down_mbps": "100", "min_cuda": "12", "min_cpu_cores": "8"})
    assert page.status_code == 200
    *_, query = (body for _, path, body, _ in fake_vast.requests if path == "/api/v0/bundles/")
    assert query["gpu_ram"] == {"gte": 20000} and query["disk_space"] == {"gte": 150}
    assert query["inet_down"] == {"gte": 100} and query["cuda_max_good"] == {"gte": 12}
    assert query["cpu_cores_effective"] == {"gte": 8}
    rows = offer_rows(page.content.decode())
    shown = {o["id"] for o in offers if o["disk_space"] >= 150}
    assert set(rows) == shown
    for offer in offers:
        if offer["id"] in shown:
            assert f'{offer["gpu_ram"] / 1000:.0f} GB' in rows[offer["id"]]
            assert f'{offer["cpu_ram"] / 1000:.0f} GB' in rows[offer["id"]]
    bad = await sync_to_async(staff.get)("/remote/offers/", {"min_cuda": "twelve"})
    assert bad.status_code == 400
