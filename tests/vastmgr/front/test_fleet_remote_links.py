"""The fleet page leads to the remote-machines app: Offers, Add machine (staff), machine pages."""

import pytest
from django.utils import timezone

from tests.conftest import REPO
from vastmgr.fleet.models import Machine, MachineStatus

pytestmark = pytest.mark.django_db


def fleet_machine(name: str, provider: str) -> Machine:
    machine = Machine.objects.create(name=name, provider=provider, host="127.0.0.1",
                                     last_seen=timezone.now())
    MachineStatus.objects.create(machine=machine, connected=True, interval=1, snapshot={"seq": 1})
    return machine


def test_offers_nav_and_old_url_lead_to_the_vast_offers_page(admin_client):
    fleet = admin_client.get("/").content.decode()
    assert '<a href="/remote/offers/"' in fleet
    response = admin_client.get("/offers/")
    assert response.status_code == 301 and response["Location"] == "/remote/offers/"
    offers = admin_client.get("/remote/offers/").content.decode()
    assert "Vast.ai offers" in offers and 'aria-current="page">Offers' in offers


def test_remote_rows_link_their_machine_page_and_the_local_row_does_not(admin_client):
    local = fleet_machine("local", "local")
    remote = fleet_machine("gpu-ssh", "ssh")
    for html in (admin_client.get("/").content.decode(),
                 admin_client.get("/fragments/fleet/").content.decode()):
        assert f'href="/remote/machines/{remote.pk}/"' in html
        assert f'href="/remote/machines/{local.pk}/"' not in html
    assert admin_client.get(f"/remote/machines/{remote.pk}/").status_code == 200


def test_add_host_is_offered_to_staff_only(admin_client, client, django_user_model):
    assert 'href="/remote/machines/add/"' in admin_client.get("/").content.decode()
    client.force_login(django_user_model.objects.create_user("viewer", password="pw-viewer-1"))
    assert 'href="/remote/machines/add/"' not in client.get("/").content.decode()
    assert client.get("/remote/machines/add/").status_code == 403  # our page: only staff


def test_live_pages_show_the_connection_badge_and_static_pages_hide_it(admin_client):
    assert ">connecting…</span>" in admin_client.get("/").content.decode()
    # A static page's badge is empty, and the stylesheet hides "page updates" around it.
    assert 'id="connection-badge" class="badge badge-idle"></span>' in \
        admin_client.get("/events/").content.decode()
    css = (REPO / "static" / "vastmgr" / "app.css").read_text()
    assert ".page-updates:has(#connection-badge:empty) { display:none; }" in css
