"""The Vast client and fleet operations against a fake Vast API on loopback."""

import pytest
from asgiref.sync import sync_to_async

from vastmgr.fleet.models import Event, Machine
from vastmgr.remote import vast
from vastmgr.remote.models import BadHost, HostPerf, RemoteHost, Secret
from vastmgr.remote.ssh import MachineLink
from vastmgr.remote.vast import OfferFilter, RentRequest, VastAuthError, VastClient, VastError

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(fake_vast, sleep, key=API_KEY):
    return VastClient(key, fake_vast.url, sleep=sleep)


async def vast_events():
    return [e async for e in Event.objects.filter(kind="vast").order_by("id")]


async def test_search_sends_the_filters_and_flags_bad_hosts_with_a_price_per_proof(
        fake_vast, no_sleep):
    cheap = fake_vast.add_offer(gpu_name="RTX 4090", dph_total=0.30, machine_id=11)
    bad = fake_vast.add_offer(gpu_name="RTX 4090", dph_total=0.35, machine_id=12)
    fake_vast.add_offer(gpu_name="RTX 4090", dph_total=0.90, machine_id=13)
    fake_vast.add_offer(gpu_name="A100", dph_total=0.20, machine_id=14)
    await sync_to_async(BadHost.flag)(12, "benchmark 3/h below 50/h")
    await sync_to_async(HostPerf.record)(provider_machine_id=11, gpu_name="RTX 4090",
                                         gpu_count=1, rate=120.0)

    offers = await client_for(fake_vast, no_sleep).search_offers(
        OfferFilter(gpu_name="RTX 4090", max_dph=0.5, min_cpu_ram_gb=128))
    annotated = await sync_to_async(vast.annotate_offers)(offers)

    by_id = {o["id"]: o for o in annotated}
    assert set(by_id) == {cheap["id"], bad["id"]}
    assert by_id[bad["id"]]["bad_host"] and not by_id[cheap["id"]]["bad_host"]
    assert by_id[cheap["id"]]["price_per_proof"] == pytest.approx(0.30 / 120)
    assert by_id[cheap["id"]]["rate_source"] == "this machine"
    # Machine 12 has no benchmark of its own: the estimate comes from the same GPU set.
    assert by_id[bad["id"]]["price_per_proof"] == pytest.approx(0.35 / 120)
    method, path, body = fake_vast.requests[-1]
    assert (method, path) == ("POST", "/api/v0/bundles/")
    assert body["cpu_ram"] == {"gte": 128 * 1024} and body["rentable"] == {"eq": True}


async def test_429_and_502_are_retried_with_growing_backoff(fake_vast, no_sleep):
    fake_vast.add_offer()
    fake_vast.fail_next("/api/v0/bundles/", 429,
                        {"detail": "API requests too frequent endpoint threshold=10"})
    fake_vast.fail_next("/api/v0/bundles/", 502, {"msg": "bad gateway"})

    offers = await client_for(fake_vast, no_sleep).search_offers(OfferFilter())

    assert len(offers) == 1
    assert len(no_sleep.delays) == 2 and no_sleep.delays[1] > no_sleep.delays[0]
    [event] = await vast_events()
    assert event.data["attempts"] == 3 and event.data["status"] == 200


async def test_a_persistent_error_surfaces_vasts_message(fake_vast, no_sleep):
    for _ in range(6):
        fake_vast.fail_next("/api/v0/bundles/", 503, {"msg": "overloaded"})
    with pytest.raises(VastError, match="503, 6 attempts\\): overloaded"):
        await client_for(fake_vast, no_sleep).search_offers(OfferFilter())


async def test_a_revoked_key_is_a_clear_error_and_never_recorded(fake_vast, no_sleep):
    revoked = "revoked-key-feedface"
    with pytest.raises(VastAuthError, match="API key was rejected"):
        await client_for(fake_vast, no_sleep, key=revoked).search_offers(OfferFilter())
    assert no_sleep.delays == [], "an auth error is not retried"
    [event] = await vast_events()
    assert event.level == Event.Level.ERROR
    assert revoked not in event.message and revoked not in str(event.data)
    assert revoked not in repr(client_for(fake_vast, no_sleep, key=revoked))


async def test_the_api_key_is_stored_encrypted(settings):
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    row = await Secret.objects.aget(name=Secret.VAST_API_KEY)
    assert API_KEY.encode() not in bytes(row.ciphertext)
    assert await sync_to_async(Secret.reveal)(Secret.VAST_API_KEY) == API_KEY

    settings.SECRET_KEY = "another-secret-key-after-rotation"
    with pytest.raises(Exception, match="cannot be decrypted"):
        await sync_to_async(Secret.reveal)(Secret.VAST_API_KEY)


async def test_rent_creates_a_machine_reachable_over_ssh_with_its_own_key(
        fake_vast, fake_host, no_sleep):
    offer = fake_vast.add_offer(gpu_name="RTX 4090", num_gpus=2, dph_total=0.8, machine_id=42)
    client = client_for(fake_vast, no_sleep)

    machine = await vast.rent(client, RentRequest.from_offer(offer, image="img:1", disk_gb=40))

    assert machine.provider == Machine.Provider.VAST and machine.state == Machine.State.REGISTERED
    assert (machine.host, machine.ssh_port) == ("127.0.0.1", fake_host.port)
    assert machine.vast_machine_id == 42 and machine.gpu_count == 2
    instance = fake_vast.instances[machine.vast_instance_id]
    create = next(body for method, path, body in fake_vast.requests if method == "PUT")
    assert create["image"] == "img:1" and create["disk"] == 40 and create["env"] == {}
    # The onstart script is visible to the host's owner: it must hold no secret.
    assert create["onstart"] == vast.DEFAULT_ONSTART
    [attached] = instance["ssh_keys"]
    assert attached.startswith("ssh-ed25519 ")

    link = MachineLink(machine.pk)
    assert (await link.run("echo rented")).stdout == "rented\n"
    await link.close()


async def test_renting_a_bad_host_is_refused(fake_vast, no_sleep):
    offer = fake_vast.add_offer(machine_id=77)
    await sync_to_async(BadHost.flag)(77, "install failed")
    with pytest.raises(VastError, match="bad-hosts list"):
        await vast.rent(client_for(fake_vast, no_sleep), RentRequest.from_offer(offer))
    assert not fake_vast.instances


async def test_reconcile_pages_through_v1_and_kills_vanished_instances(fake_vast, no_sleep):
    fake_vast.page_size = 2
    client = client_for(fake_vast, no_sleep)
    machines = [await vast.rent(client, RentRequest.from_offer(fake_vast.add_offer()))
                for _ in range(3)]
    del fake_vast.instances[machines[1].vast_instance_id]
    fake_vast.instances[99999] = {"id": 99999, "actual_status": "running"}

    summary = await vast.reconcile(client)

    assert summary == {"updated": 2, "killed": 1, "unmanaged": [99999]}
    gone = await Machine.objects.aget(pk=machines[1].pk)
    assert gone.state == Machine.State.KILLED
    assert gone.kill_reason == "the instance disappeared from Vast"
    remote = await RemoteHost.objects.aget(machine=gone)
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
