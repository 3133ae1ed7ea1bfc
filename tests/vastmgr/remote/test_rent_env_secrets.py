"""An upstream worker's env carries operator secrets (vast-manager's PAVAIL): the rent dialog
remembers it encrypted (a Secret), shows only its names, and still hands Vast every value as
typed. Oracles: every row of every table, the page source, the log records, and the strict
fake Vast's create body."""

import logging
import re

import pytest
from asgiref.sync import sync_to_async
from django.apps import apps
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.forms import ENV_MASK
from vastmgr.remote.models import RentPreference, Secret

from .conftest import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)

PAVAIL = "pa-secret-7f3c91"
SERVER = "192.0.2.7:22222"
TEXTAREA = re.compile(r'<textarea name="env"[^>]*>(.*?)</textarea>', re.DOTALL)


def rows_holding(value: str) -> list[str]:
    """Every table column (model.field) whose stored value contains `value`."""
    found = []
    for model in apps.get_models():
        for row in model.objects.all().values():
            for column, cell in row.items():
                text = bytes(cell).decode("latin-1") if isinstance(cell, bytes | memoryview) \
                    else str(cell)
                if value in text:
                    found.append(f"{model._meta.label}.{column}")
    return found


@pytest.fixture
async def market(fake_vast, settings):
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url)
    await sync_to_async(Secret.store)(Secret.VAST_API_KEY, API_KEY)
    return fake_vast


def staff_client(name: str = "ops") -> tuple[Client, User]:
    user = User.objects.create_user(name, password="pw-123456789", is_staff=True)
    client = Client()
    client.force_login(user)
    return client, user


def rent_upstream(client: Client, fake_vast, env: str):
    """Rent a fresh offer as an upstream worker with `env` typed; the env Vast received."""
    offer = fake_vast.add_offer(gpu_name="RTX 4090")
    before = len([r for r in fake_vast.requests if r[0] == "PUT"])
    response = client.post("/remote/offers/rent/", {
        "offer_ids": [offer["id"]], "max_price_per_proof": "0.01", "disk_gb": "250",
        "engine_flavour": "cuzk-upstream", "image": "magik6k/curio-cuzk:latest", "env": env,
        "onstart": "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"})
    creates = [body for method, _, body, _ in fake_vast.requests if method == "PUT"]
    if len(creates) == before:
        return response, None
    sent = dict(creates[-1]["env"])
    sent.pop("VASTMGR_CALLHOME_SECRET")
    sent.pop("MIN_RATE")
    return response, sent


def dialog_env(client: Client) -> str:
    page = client.get("/remote/offers/").content.decode()
    return TEXTAREA.search(page).group(1)


async def test_the_env_is_stored_encrypted_shown_masked_and_reaches_vast_as_typed(
        market, fake_host, caplog):
    fake_vast = market
    caplog.set_level(logging.DEBUG)
    client, user = await sync_to_async(staff_client)()

    response, sent = await sync_to_async(rent_upstream)(
        client, fake_vast, f"PAVAIL={PAVAIL}\n# the relay\nPAVAIL_SERVER={SERVER}\n")
    assert response.status_code == 302
    assert sent == {"PAVAIL": PAVAIL, "PAVAIL_SERVER": SERVER}
    # At rest: no table holds either value in plain text; the user's Secret holds them.
    assert await sync_to_async(rows_holding)(PAVAIL) == []
    assert await sync_to_async(rows_holding)(SERVER) == []
    pref = await RentPreference.objects.aget(user=user)
    assert await sync_to_async(pref.env)() == {"PAVAIL": PAVAIL, "PAVAIL_SERVER": SERVER}
    # Neither in a log record (the Events were checked with every table above).
    assert PAVAIL not in caplog.text and SERVER not in caplog.text

    # The dialog shows the names with masked values; the page source holds neither value.
    page = (await sync_to_async(client.get)("/remote/offers/")).content.decode()
    assert PAVAIL not in page and SERVER not in page
    shown = TEXTAREA.search(page).group(1)
    assert shown == f"PAVAIL={ENV_MASK}\nPAVAIL_SERVER={ENV_MASK}"

    # Sent back unchanged, the masked lines keep the stored values.
    response, sent = await sync_to_async(rent_upstream)(client, fake_vast, shown)
    assert response.status_code == 302
    assert sent == {"PAVAIL": PAVAIL, "PAVAIL_SERVER": SERVER}

    # One value replaced, one line deleted: exactly that is sent and remembered.
    response, sent = await sync_to_async(rent_upstream)(client, fake_vast, "PAVAIL=rotated-1")
    assert sent == {"PAVAIL": "rotated-1"}
    assert await sync_to_async(dialog_env)(client) == f"PAVAIL={ENV_MASK}"
    assert await sync_to_async(rows_holding)("rotated-1") == []

    # A masked line with nothing stored under its name is refused with the reason.
    response, sent = await sync_to_async(rent_upstream)(
        client, fake_vast, f"PAVAIL={ENV_MASK}\nPAVAIL_SERVER={ENV_MASK}")
    assert response.status_code == 400 and sent is None
    assert "PAVAIL_SERVER has no stored value to keep" in response.content.decode()

    # Cleared: nothing is sent, nothing is stored.
    response, sent = await sync_to_async(rent_upstream)(client, fake_vast, "")
    assert response.status_code == 302 and sent == {}
    assert not await Secret.objects.filter(name__startswith="rent_env:").aexists()
    assert await sync_to_async(dialog_env)(client) == ""

    # A deleted user's env secret goes with its preference.
    await sync_to_async(rent_upstream)(client, fake_vast, "PAVAIL=again")
    assert await Secret.objects.filter(name__startswith="rent_env:").acount() == 1
    await user.adelete()
    assert not await Secret.objects.filter(name__startswith="rent_env:").aexists()


async def test_the_settings_env_is_offered_masked_and_sent_when_kept(market, fake_host, settings):
    fake_vast = market
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake_vast.url,
                                             upstream_env=f"PAVAIL={PAVAIL}\nPAVAIL_SERVER={SERVER}")
    client, _ = await sync_to_async(staff_client)()
    page = (await sync_to_async(client.get)("/remote/offers/")).content.decode()
    assert PAVAIL not in page and SERVER not in page
    shown = TEXTAREA.search(page).group(1)
    assert shown == f"PAVAIL={ENV_MASK}\nPAVAIL_SERVER={ENV_MASK}"
    response, sent = await sync_to_async(rent_upstream)(client, fake_vast, shown)
    assert response.status_code == 302 and sent == {"PAVAIL": PAVAIL, "PAVAIL_SERVER": SERVER}
    assert await sync_to_async(rows_holding)(PAVAIL) == []


def test_the_migration_moves_plain_env_rows_into_secrets():
    before, after = ("remote", "0004_rent_upstream_worker"), ("remote", "0005_rent_env_in_secrets")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    user = old.get_model("auth", "User").objects.create(username="ops")
    other = old.get_model("auth", "User").objects.create(username="viewer")
    preferences = old.get_model("remote", "RentPreference").objects
    preferences.create(user=user, max_price_per_proof="0.01", disk_gb=250, image="img",
                       env=f"PAVAIL={PAVAIL}\n# relay\nPAVAIL_SERVER={SERVER}")
    preferences.create(user=other, max_price_per_proof="0.01", disk_gb=250)
    try:
        MigrationExecutor(connection).migrate([after])
        # The models of today read today's tables: the migrations after this one applied too.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert rows_holding(PAVAIL) == [] and rows_holding(SERVER) == []
        assert RentPreference.objects.get(user_id=user.pk).env() == \
            {"PAVAIL": PAVAIL, "PAVAIL_SERVER": SERVER}
        assert RentPreference.objects.get(user_id=other.pk).env() == {}
        assert list(Secret.objects.filter(name__startswith="rent_env:")
                    .values_list("name", flat=True)) == [f"rent_env:{user.pk}"]
        # Reversible: back in the column, the Secret gone.
        executor = MigrationExecutor(connection)
        executor.migrate([before])
        back = executor.loader.project_state([before]).apps
        assert back.get_model("remote", "RentPreference").objects.get(user_id=user.pk).env == \
            f"PAVAIL={PAVAIL}\nPAVAIL_SERVER={SERVER}"
        assert not Secret.objects.filter(name__startswith="rent_env:").exists()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
