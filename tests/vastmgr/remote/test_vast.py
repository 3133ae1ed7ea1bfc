"""The Vast client and fleet operations against the strict fake Vast API on loopback.

One test per user flow and per numbered item of issue 11: search with each filter in a
300+ offer market, rent any offer, reconcile to running, destroy, a wrong key, rate limits,
an instance that exits or disappears, a lost create response, orphans and unmanaged instances.
"""

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.utils import timezone

from devtools.fake_vast import FakeVast
from vastmgr.autopilot.management.commands import remote_automation
from vastmgr.fleet.models import Event, Machine
from vastmgr.instances.models import DeploySecret
from vastmgr.lib.errors import VastAuthError, VastError, VastRateLimited
from vastmgr.remote import vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.lifecycle import Automation
from vastmgr.remote.models import (
    BadMachine,
    MachinePerf,
    ProviderCall,
    RemoteMachine,
    Secret,
    UnmanagedInstance,
)
from vastmgr.remote.ssh import MachineLink
from vastmgr.remote.vast import BACKGROUND, OfferFilter, RentRequest, VastClient

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)

MARKET = 310


def client_for(fake_vast, sleep, key=API_KEY, **options):
    return VastClient(key, fake_vast.url, sleep=sleep, jitter=lambda: 0.5, **options)


async def vast_events():
    return [e async for e in Event.objects.filter(kind="vast").order_by("id")]


async def provider_calls():
    return [c async for c in ProviderCall.objects.order_by("id")]


async def alerts_of(kind):
    return [e async for e in Event.objects.filter(kind="alert", data__alert=kind)]


async def running_machine(fake_vast, client, **offer):
    """Rent an offer and reconcile until its instance runs (the fake's clock, not sleeps)."""
    machine = await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer(**offer)))
    fake_vast.advance(120)
    await vast.reconcile(client)
    return await Machine.objects.select_related("remote").aget(pk=machine.pk)


# ------------------------------------------------------------------ search (items 5-9)

def expected(fake_vast, predicate, storage=vast.DEFAULT_DISK_GB):
    """The oracle: the fake's own market, priced like the search prices it."""
    return {o["id"] for o in (FakeVast.priced(o, storage) for o in fake_vast.offers.values())
            if o["verified"] and predicate(o)}


FILTERS = {
    # item 8: the CLI spelling finds the same GPUs as the API's
    "gpu_name": (OfferFilter(gpu_name="RTX_4090"), lambda o: o["gpu_name"] == "RTX 4090"),
    "num_gpus": (OfferFilter(num_gpus=4), lambda o: o["num_gpus"] == 4),
    # item 5: MB, ×1000 — an offer with 128,000 MB is a 128 GB machine
    "min_cpu_ram_gb": (OfferFilter(min_cpu_ram_gb=128), lambda o: o["cpu_ram"] >= 128_000),
    # item 6: priced with the disk the rent asks for
    "max_dph": (OfferFilter(max_dph=0.4), lambda o: o["dph_total"] <= 0.4),
    # item 7: the official field
    "min_reliability": (OfferFilter(min_reliability=0.98), lambda o: o["reliability"] >= 0.98),
    "geolocation": (OfferFilter(geolocation="se"), lambda o: o["geolocation"].endswith(", SE")),
}


@pytest.mark.parametrize("name", FILTERS)
async def test_search_with_each_filter_finds_exactly_the_matching_offers(
        fake_vast, no_sleep, name):
    fake_vast.populate(MARKET)
    fake_vast.add_offer(cpu_ram=128_000)  # the boundary of the cpu_ram filter
    offer_filter, predicate = FILTERS[name]
    offer_filter = OfferFilter(**{**offer_filter.__dict__, "limit": 1000})

    offers = await client_for(fake_vast, no_sleep).search_offers(offer_filter)

    assert offers and {o["id"] for o in offers} == expected(fake_vast, predicate)
    prices = [o["dph_total"] for o in offers]
    assert prices == sorted(prices), "ordered by dph_total ascending"


async def test_search_prices_include_the_disk_the_rent_asks_for(fake_vast, no_sleep):
    offer = fake_vast.add_offer(dph_base=0.3, storage_cost=0.15)
    [found] = await client_for(fake_vast, no_sleep).search_offers(OfferFilter())
    _, _, body, _ = fake_vast.requests[-1]
    assert body["allocated_storage"] == vast.DEFAULT_DISK_GB == RentRequest.disk_gb
    assert found["dph_total"] == pytest.approx(0.3 + 0.15 * 64 / 720)
    assert found["id"] == offer["id"]


async def test_search_flags_bad_hosts_with_a_price_per_proof(fake_vast, no_sleep):
    cheap = fake_vast.add_offer(gpu_name="RTX 4090", dph_base=0.30, machine_id=11)
    bad = fake_vast.add_offer(gpu_name="RTX 4090", dph_base=0.35, machine_id=12)
    await sync_to_async(BadMachine.flag)(12, "benchmark 3/h below 50/h")
    await sync_to_async(MachinePerf.record)(provider_machine_id=11, gpu_name="RTX 4090",
                                         gpu_count=1, rate=120.0)

    offers = await client_for(fake_vast, no_sleep).search_offers(OfferFilter())
    by_id = {o["id"]: o for o in await sync_to_async(vast.annotate_offers)(offers)}

    assert by_id[bad["id"]]["bad_host"] and not by_id[cheap["id"]]["bad_host"]
    assert by_id[cheap["id"]]["rate_source"] == "this machine"
    assert by_id[cheap["id"]]["price_per_proof"] == pytest.approx(
        by_id[cheap["id"]]["dph_total"] / 120)
    # Machine 12 has no benchmark of its own: the estimate comes from the same GPU set.
    assert by_id[bad["id"]]["rate_source"] == "1 similar hosts"


async def test_the_fake_refuses_what_the_official_contract_does_not_allow(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    for path, method, body, status in [
            ("/api/v0/bundles", "POST", {}, 404),  # no trailing slash
            ("/api/v0/bundles/", "GET", None, 405),
            ("/api/v0/bundles/", "POST", {"reliability2": {"gte": 0.9}}, 400),
            ("/api/v0/bundles/", "POST", {"cpu_ram": {"nin": [1]}}, 400),
            ("/api/v0/bundles/", "POST", {"order": [["nonsense", "asc"]]}, 400),
            ("/api/v0/asks/1/", "PUT", {"client_id": "me", "image": "x", "disk": 10}, 404),
    ]:
        with pytest.raises(VastError) as raised:
            await client.call(method, path, body=body)
        assert raised.value.status == status, (method, path, body)
    offer = fake_vast.add_offer(num_gpus=1)
    # What the official CLI sends for 'num_gpus=1 reliability>0.5 geolocation in [US,CA,SE]'
    # (operands as strings, cast by the server) is accepted.
    cli_query = {"num_gpus": {"eq": "1"}, "reliability": {"gt": "0.5"},
                 "geolocation": {"in": ["US", "CA", "SE", "TW", "DE"]}}
    payload = await client.call("POST", "/api/v0/bundles/", body=cli_query)
    assert [o["id"] for o in payload["offers"]] == [offer["id"]]
    with pytest.raises(VastError, match="image is required") as raised:
        await client.call("PUT", f"/api/v0/asks/{offer['id']}/",
                          body={"client_id": "me", "disk": 10})
    assert raised.value.status == 400
    good = {"client_id": "me", "image": "magik6k/curio-cuzk:latest", "disk": 250}
    for bad, why in (({"env": {"MIN_RATE": 30.0}}, "string values"),
                     ({"runtype": "ssh direct"}, "unknown runtype"),
                     ({"image": "two words"}, "image is required")):
        with pytest.raises(VastError, match=why) as raised:
            await client.call("PUT", f"/api/v0/asks/{offer['id']}/", body={**good, **bad})
        assert raised.value.status == 400 and offer["id"] in fake_vast.offers
    with pytest.raises(VastError) as raised:
        await client.call("GET", "/api/v1/instances/",
                          params={"select_filters": {"dph_total": {"lt": 1}}})
    assert raised.value.status == 400


# ------------------------------------------------------------------ key

async def test_the_api_key_is_stored_encrypted(settings):
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    row = await Secret.objects.aget(name=Secret.VAST_API_KEY)
    assert API_KEY.encode() not in bytes(row.ciphertext)
    assert await sync_to_async(Secret.reveal)(Secret.VAST_API_KEY) == API_KEY

    settings.SECRET_KEY = "another-secret-key-after-rotation"
    with pytest.raises(Exception, match="cannot be decrypted"):
        await sync_to_async(Secret.reveal)(Secret.VAST_API_KEY)


async def test_a_wrong_key_is_a_clear_error_and_never_recorded(fake_vast, no_sleep):
    wrong = "revoked-key-feedface"
    with pytest.raises(VastAuthError, match="API key was rejected") as raised:
        await client_for(fake_vast, no_sleep, key=wrong).search_offers(OfferFilter())
    assert raised.value.status == 401 and raised.value.code == "auth_error"
    assert no_sleep.delays == [], "an auth error is not retried"
    [event] = await vast_events()
    assert event.level == Event.Level.ERROR
    assert wrong not in event.message and wrong not in str(event.data)
    assert wrong not in repr(client_for(fake_vast, no_sleep, key=wrong))


# ------------------------------------------------------------------ rate limits (item 3)

async def test_retry_after_3_is_waited_out_then_the_call_succeeds(fake_vast, no_sleep):
    fake_vast.add_offer()
    fake_vast.rate_limit("/api/v0/bundles/", retry_after="3")

    offers = await client_for(fake_vast, no_sleep).search_offers(OfferFilter())

    assert len(offers) == 1 and no_sleep.delays == [3.0]
    [call] = await provider_calls()
    assert call.ok and call.attempts == 2 and call.waited_s == 3.0
    assert not await vast_events(), "a call that succeeded is no Event"


async def test_retry_after_as_an_http_date_is_honoured(fake_vast, no_sleep):
    fake_vast.add_offer()
    now = 1_900_000_000.0
    when = datetime.fromtimestamp(now + 4, tz=UTC)
    fake_vast.rate_limit("/api/v0/bundles/", retry_after=format_datetime(when, usegmt=True))

    await client_for(fake_vast, no_sleep, wallclock=lambda: now).search_offers(OfferFilter())

    assert no_sleep.delays == [4.0]


async def test_without_retry_after_the_backoff_grows_with_jitter(fake_vast, no_sleep):
    fake_vast.add_offer()
    fake_vast.rate_limit("/api/v0/bundles/", times=2, text=True)  # a plain-text 429 body
    fake_vast.fail_next("/api/v0/bundles/", 502, {"msg": "bad gateway"})

    assert await client_for(fake_vast, no_sleep).search_offers(OfferFilter())

    # jitter 0.5 → 75 % of 1, 2, 4 s
    assert no_sleep.delays == [0.75, 1.5, 3.0]


async def test_an_interactive_call_gives_up_early_and_says_when_to_retry(fake_vast, no_sleep):
    fake_vast.rate_limit("/api/v0/bundles/", retry_after="30", times=10)

    with pytest.raises(VastRateLimited, match="Vast is rate limiting us, retry in 30 s") as e:
        await client_for(fake_vast, no_sleep).search_offers(OfferFilter())

    assert e.value.retry_in_s == 30 and no_sleep.delays == []
    # The automation loop's budget waits it out.
    fake_vast.faults.clear()
    fake_vast.add_offer()
    fake_vast.rate_limit("/api/v0/bundles/", retry_after="30", times=2)
    assert await client_for(fake_vast, no_sleep, retry=BACKGROUND).search_offers(OfferFilter())
    assert no_sleep.delays == [30.0, 30.0]


async def test_a_real_one_second_retry_after_end_to_end(fake_vast):
    """The fake refuses every call for one real second; the client really waits."""
    fake_vast.add_offer()
    fake_vast.rate_limit("/api/v0/bundles/", retry_after="1", window_s=1.0)
    started = time.monotonic()

    offers = await VastClient(API_KEY, fake_vast.url).search_offers(OfferFilter())

    assert len(offers) == 1 and time.monotonic() - started >= 1.0
    [call] = await provider_calls()
    assert call.ok and call.attempts == 2


async def test_the_offers_page_says_when_to_retry_while_vast_rate_limits(
        fake_vast, settings, client):
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url)
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    fake_vast.rate_limit("/api/v0/bundles/", retry_after="45", times=5)
    user = await sync_to_async(User.objects.create_user)("viewer", password="pw-12345678")
    await sync_to_async(client.force_login)(user)

    page = await sync_to_async(client.get)("/remote/offers/", {"gpu_name": "RTX 4090"})

    assert page.status_code == 200
    assert "Vast is rate limiting us, retry in 45 s" in page.content.decode()


async def test_a_persistent_5xx_surfaces_vasts_message(fake_vast, no_sleep):
    fake_vast.fail_next("/api/v0/bundles/", 503, {"msg": "overloaded"}, times=20)
    with pytest.raises(VastError, match="503, 4 attempts\\): overloaded"):
        await client_for(fake_vast, no_sleep).search_offers(OfferFilter())
    assert sum(no_sleep.delays) <= vast.INTERACTIVE.budget_s


@pytest.mark.parametrize("how", ["not_json", "truncated", "drop"])
async def test_a_broken_response_is_a_clear_vast_error(fake_vast, no_sleep, how):
    fake_vast.add_offer()
    for _ in range(10):
        fake_vast.break_next("/api/v0/bundles/", how)
    with pytest.raises(VastError, match="not JSON|no usable response"):
        await client_for(fake_vast, no_sleep).search_offers(OfferFilter())
    # Once: retried (a GET-like search is safe to repeat) and answered.
    fake_vast.faults.clear()
    fake_vast.break_next("/api/v0/bundles/", how)
    if how != "not_json":
        assert await client_for(fake_vast, no_sleep).search_offers(OfferFilter())


async def test_a_broken_answer_does_not_stop_the_automation_loop(fake_vast, settings):
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url)
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    fake_vast.break_next("/api/v1/instances/", "not_json")  # a 200 from a broken proxy

    await remote_automation.Command().tick()

    failed = await Event.objects.filter(message__startswith="reconcile failed").afirst()
    assert failed is not None and "not JSON" in failed.message


# ------------------------------------------------------------------ rent (items 1, 6)

async def test_any_offer_in_a_large_market_can_be_rented_from_the_page(
        fake_vast, fake_host, settings, client):
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url)
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    fake_vast.populate(MARKET)
    priced = sorted((FakeVast.priced(o, 64) for o in fake_vast.offers.values()
                     if o["verified"]), key=lambda o: o["dph_total"])
    dearest = priced[-1]
    assert priced.index(dearest) >= 200, "beyond the 200 cheapest"
    staff = await sync_to_async(User.objects.create_user)("ops", password="pw-12345678",
                                                          is_staff=True)
    await sync_to_async(client.force_login)(staff)
    # The page shows what the rent will charge: the price with the rent's disk.
    cheapest = next(o for o in priced if o["gpu_name"] == dearest["gpu_name"])
    page = await sync_to_async(client.get)("/remote/offers/", {"gpu_name": dearest["gpu_name"]})
    assert f"{cheapest['dph_total']:.3f}" in page.content.decode()

    response = await sync_to_async(client.post)("/remote/offers/rent/", {
        "offer_ids": [dearest["id"]], "max_price_per_proof": "0.008", "disk_gb": 64})

    machine = await Machine.objects.aget(provider=Machine.Provider.VAST)
    assert response.status_code == 302 and response.url == f"/remote/machines/{machine.pk}/"
    assert machine.gpu_name == dearest["gpu_name"]
    [instance] = fake_vast.instances.values()
    *_, lookup = (body for _, path, body, _ in fake_vast.requests if path == "/api/v0/bundles/")
    assert lookup["id"] == {"eq": dearest["id"]}
    # item 6: the price shown on the offers page is the price charged
    assert float(machine.price_per_hour) == pytest.approx(instance["dph_total"], abs=1e-4)
    assert instance["dph_total"] == pytest.approx(dearest["dph_total"])


async def test_rent_then_reconcile_to_running_records_the_ssh_address(
        fake_vast, fake_host, no_sleep):
    offer = fake_vast.add_offer(gpu_name="RTX 4090", num_gpus=2, machine_id=42)
    client = client_for(fake_vast, no_sleep)

    machine = await vast.rent(client, RentRequest.from_offer(
        offer, deployment=vast.Deployment(image="img:1"), disk_gb=40))

    assert machine.provider == Machine.Provider.VAST and machine.state == Machine.State.REGISTERED
    assert machine.name == f"vast-{machine.vast_instance_id}" and machine.host == ""
    remote = await RemoteMachine.objects.aget(machine=machine)
    instance = fake_vast.instances[machine.vast_instance_id]
    assert instance["label"] == remote.vast_label and remote.vast_label.startswith("vastmgr-")
    _, _, create, _ = next(r for r in fake_vast.requests if r[0] == "PUT")
    assert create["image"] == "img:1" and create["disk"] == 40
    # Its one variable: the secret it presents when it calls home, bound to this machine.
    [(name, secret)] = create["env"].items()
    assert name == "VASTMGR_CALLHOME_SECRET"
    assert (await sync_to_async(DeploySecret.find)(secret)).machine_id == machine.pk
    # The onstart script is visible to the host's owner: it must hold no secret.
    assert create["onstart"] == vast.DEFAULT_ONSTART
    [attached] = instance["ssh_keys"]
    assert attached.startswith("ssh-ed25519 ")

    fake_vast.advance(20)
    await vast.reconcile(client)
    machine = await Machine.objects.aget(pk=machine.pk)
    remote = await RemoteMachine.objects.aget(machine=machine)
    assert remote.vast_status == "loading" and machine.host == "", "no address before running"

    fake_vast.advance(60)
    await vast.reconcile(client)
    machine = await Machine.objects.aget(pk=machine.pk)
    remote = await RemoteMachine.objects.aget(machine=machine)
    assert remote.vast_status == "running"
    assert (machine.host, machine.ssh_port) == ("127.0.0.1", fake_host.port)
    link = MachineLink(machine.pk)
    assert (await link.run("echo rented")).stdout == "rented\n"
    await link.close()


async def test_renting_a_bad_host_is_refused(fake_vast, no_sleep):
    offer = fake_vast.add_offer(machine_id=77)
    await sync_to_async(BadMachine.flag)(77, "install failed")
    with pytest.raises(VastError, match="bad-machines list"):
        await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))
    assert not fake_vast.instances


async def test_a_taken_offer_fails_the_rent_without_leaving_a_live_machine(fake_vast, no_sleep):
    offer = fake_vast.add_offer()
    del fake_vast.offers[offer["id"]]
    with pytest.raises(VastError, match="no longer available"):
        await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))
    machine = await Machine.objects.aget()
    assert machine.state == Machine.State.KILLED and "rent failed" in machine.kill_reason


# ------------------------------------------------------------------ lost create (item 4)

@pytest.mark.parametrize("how", ["504", "drop"])
async def test_a_lost_create_response_is_adopted_by_label_never_created_twice(
        fake_vast, no_sleep, how):
    offer = fake_vast.add_offer()
    fake_vast.lose_next_create(how)

    machine = await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))

    [instance] = fake_vast.instances.values()
    assert machine.vast_instance_id == instance["id"]
    assert [r[0] for r in fake_vast.requests].count("PUT") == 1, "a create is never retried"
    assert any("answer was lost" in e.message and "adopted" in e.message
               for e in await vast_events())


async def test_a_rate_limited_create_is_retried_after_retry_after(fake_vast, no_sleep):
    """A 429 is refused before any work, so waiting it out cannot create twice."""
    offer = fake_vast.add_offer()
    fake_vast.rate_limit("/api/v0/asks/", retry_after="4.5")

    machine = await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))

    assert no_sleep.delays == [4.5] and list(fake_vast.instances) == [machine.vast_instance_id]


async def test_a_create_that_failed_before_vast_acted_is_not_retried(fake_vast, no_sleep):
    offer = fake_vast.add_offer()
    fake_vast.fail_next("/api/v0/asks/", 502, {"msg": "bad gateway"})

    with pytest.raises(VastError, match="502"):
        await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))

    assert not fake_vast.instances and [r[0] for r in fake_vast.requests].count("PUT") == 1
    machine = await Machine.objects.aget()
    assert machine.state == Machine.State.KILLED and "rent failed" in machine.kill_reason


async def test_when_even_the_lookup_fails_the_next_reconcile_adopts_the_instance(
        fake_vast, no_sleep):
    offer = fake_vast.add_offer()
    client = client_for(fake_vast, no_sleep)
    fake_vast.lose_next_create("504")
    fake_vast.rate_limit("/api/v1/instances/", retry_after="60")

    with pytest.raises(VastError, match="not known yet"):
        await vast.rent(client, RentRequest.from_offer(offer))
    machine = await Machine.objects.aget()
    assert machine.vast_instance_id is None and machine.state == Machine.State.REGISTERED

    summary = await vast.reconcile(client)

    [instance_id] = fake_vast.instances
    assert summary["adopted"] == [instance_id] and summary["destroyed"] == []
    machine = await Machine.objects.aget()
    assert machine.vast_instance_id == instance_id and machine.name == f"vast-{instance_id}"


async def test_a_machine_whose_create_never_produced_an_instance_is_given_up(
        fake_vast, no_sleep):
    offer = fake_vast.add_offer()
    client = client_for(fake_vast, no_sleep)
    fake_vast.fail_next("/api/v0/asks/", 504, text="gateway timeout")  # Vast never acted
    fake_vast.rate_limit("/api/v1/instances/", retry_after="60")
    with pytest.raises(VastError, match="not known yet"):
        await vast.rent(client, RentRequest.from_offer(offer))

    await vast.reconcile(client)
    assert (await Machine.objects.aget()).state == Machine.State.REGISTERED, "within the grace"

    await Machine.objects.aupdate(created=timezone.now() - timedelta(minutes=6))
    await vast.reconcile(client)
    machine = await Machine.objects.aget()
    assert machine.state == Machine.State.KILLED and "carries its label" in machine.kill_reason


async def test_our_labelled_instance_no_machine_wants_is_destroyed(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    machine = await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer()))
    await sync_to_async(machine.kill)("operator gave up on it")  # the destroy never happened

    summary = await vast.reconcile(client)

    assert summary["destroyed"] == [machine.vast_instance_id] and not fake_vast.instances
    assert any(f"destroyed instance {machine.vast_instance_id}" in e.message
               for e in await vast_events())
    assert not await UnmanagedInstance.objects.aexists()


async def test_an_unmanaged_billing_instance_is_alerted_and_shown_on_the_fleet_page(
        fake_vast, no_sleep, client):
    client_api = client_for(fake_vast, no_sleep)
    foreign = fake_vast.add_instance(label="jupyter-notebook")
    fake_vast.add_instance(label=None)
    fake_vast.vanish(max(fake_vast.instances))  # one unlabelled, gone before we look

    summary = await vast.reconcile(client_api)
    await vast.reconcile(client_api)

    assert summary["unmanaged"] == [foreign] and foreign in fake_vast.instances, "not ours"
    [alert] = await alerts_of("unmanaged_instance")
    assert str(foreign) in alert.message and "billing" in alert.message
    # said once: no other Event repeats it (on the Events page and to on-call)
    assert [e async for e in Event.objects.filter(message__contains=f"instance {foreign} ")] \
        == [alert]
    user = await sync_to_async(User.objects.create_user)("viewer", password="pw-12345678")
    await sync_to_async(client.force_login)(user)
    page = (await sync_to_async(client.get)("/")).content.decode()
    assert "unmanaged instance billing" in page.lower() and str(foreign) in page
    assert "jupyter-notebook" in page

    fake_vast.vanish(foreign)
    await vast.reconcile(client_api)
    page = (await sync_to_async(client.get)("/")).content.decode()
    assert str(foreign) not in page


# ------------------------------------------------------------------ instance status (item 2)

async def test_an_instance_that_exits_marks_its_machine_alerts_and_is_destroyed_after_grace(
        fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    machine = await running_machine(fake_vast, client)
    fake_vast.set_status(machine.vast_instance_id, "exited", "container exited with code 137")

    await vast.reconcile(client)
    await vast.reconcile(client)

    remote = await RemoteMachine.objects.aget(machine=machine)
    assert remote.vast_status == "exited" and remote.vast_down_since is not None
    assert "exited: container exited with code 137" in remote.last_error
    [alert] = await alerts_of("instance_down")
    assert "exited" in alert.message

    start = timezone.now()
    automation = Automation(RemoteSettings(vast_down_grace_min=10),
                            now=lambda: start + timedelta(minutes=9), vast_client=client)
    await automation.tick()
    assert machine.vast_instance_id in fake_vast.instances, "still within the grace"
    automation.now = lambda: start + timedelta(minutes=11)
    await automation.tick()

    assert machine.vast_instance_id not in fake_vast.instances
    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED and "is exited" in machine.kill_reason
    assert await Event.objects.filter(machine=machine, kind="lifecycle",
                                      data__to="killed").aexists()


async def test_an_instance_that_goes_offline_and_comes_back_is_cleared(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    machine = await running_machine(fake_vast, client)
    fake_vast.set_status(machine.vast_instance_id, "offline")
    await vast.reconcile(client)
    assert (await RemoteMachine.objects.aget(machine=machine)).vast_status == "offline"

    fake_vast.set_status(machine.vast_instance_id, "running")
    await vast.reconcile(client)

    remote = await RemoteMachine.objects.aget(machine=machine)
    assert remote.vast_down_since is None and remote.last_error == ""
    await Automation(RemoteSettings(vast_down_grace_min=0), vast_client=client).tick()
    assert (await Machine.objects.aget(pk=machine.pk)).state != Machine.State.KILLED


async def test_reconcile_pages_through_v1_and_kills_vanished_instances(fake_vast, no_sleep):
    fake_vast.page_size = 2
    client = client_for(fake_vast, no_sleep)
    machines = [await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer()))
                for _ in range(4)]
    fake_vast.vanish(machines[1].vast_instance_id)

    summary = await vast.reconcile(client)

    assert summary["updated"] == 3 and summary["killed"] == 1
    gone = await Machine.objects.aget(pk=machines[1].pk)
    assert gone.state == Machine.State.KILLED
    assert gone.kill_reason == "the instance disappeared from Vast"
    # Not routine: a warning the operator sees (and a channel from "warning" up receives).
    warned = [e async for e in Event.objects.filter(machine=gone, level=Event.Level.WARNING)]
    assert any("no longer listed by Vast" in e.message for e in warned), warned
    remote = await RemoteMachine.objects.aget(machine=gone)
    assert remote.billing_ended is not None
    lists = [r for r in fake_vast.requests if r[1] == "/api/v1/instances/"]
    assert len(lists) == 2, "three instances in pages of two"
    assert not any(r[1] == "/api/v0/instances/" for r in fake_vast.requests)


async def test_destroy_removes_the_instance_and_kills_the_machine(fake_vast, no_sleep):
    client = client_for(fake_vast, no_sleep)
    machine = await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer()))

    await vast.destroy(client, machine, "operator destroyed it")

    assert machine.vast_instance_id not in fake_vast.instances
    machine = await Machine.objects.aget(pk=machine.pk)
    assert machine.state == Machine.State.KILLED and machine.kill_reason == "operator destroyed it"
    # Destroying again (the instance is already gone) is not an error.
    await vast.destroy(client, machine, "again")


async def test_provider_calls_go_to_the_provider_log_not_the_events_timeline(
        fake_vast, no_sleep, client):
    """The reconcile lists our instances twice a minute: each call is a line of the provider
    log; the Events page, which says what happened to the fleet, carries none of them, and a
    call that failed is on both (the alert rules count those)."""
    client_api = client_for(fake_vast, no_sleep)
    await vast.reconcile(client_api)
    await vast.reconcile(client_api)
    fake_vast.fail_next("/api/v1/instances/", 400, text="bad request")
    with pytest.raises(VastError):
        await vast.reconcile(client_api)

    calls = await provider_calls()
    assert [(c.method, c.path, c.status, c.ok) for c in calls] == \
        [("GET", "/api/v1/instances/", 200, True)] * 2 + \
        [("GET", "/api/v1/instances/", 400, False)]
    assert [e.level for e in await vast_events()] == [Event.Level.ERROR]
    user = await sync_to_async(User.objects.create_user)("viewer", password="pw-12345678")
    await sync_to_async(client.force_login)(user)
    events = (await sync_to_async(client.get)("/events/")).content.decode()
    assert events.count("/api/v1/instances/ → ") == 1  # the failure only
    log = await sync_to_async(client.get)("/remote/provider-log/")
    assert log.status_code == 200
    rows = log.content.decode().split('id="provider-calls"')[1]
    assert rows.count("GET /api/v1/instances/") == 3 and rows.count('data-ok="false"') == 1
