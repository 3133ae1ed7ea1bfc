"""Authorization: SRS preload/evict is staff-only (refused with 403, controls not shown to
others, none inside the panel pushed to every viewer); websockets only from our own origin
(scheme, host and port)."""

import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.vastmgr.live_engine import session_cookie
from vastmgr.asgi import application
from vastmgr.fleet.models import Machine, MachineAction, MachineStatus
from vastmgr.front import fragments
from vastmgr.front.consumers import same_origin


@pytest.fixture
def machine(db):
    m = Machine.objects.create(name="gpu-1", provider="local", host="127.0.0.1")
    MachineStatus.objects.create(machine=m, connected=True, interval=1, snapshot={
        "seq": 1, "allocations": {"srs": [{"circuit_id": "winning-post.tiny", "bytes": 1,
                                           "state": "loaded", "evictable": True}]}})
    return m


def logged_in(django_user_model, name, **flags) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_user(name, **flags))
    return client


def test_non_staff_cannot_preload_or_evict_and_sees_no_controls(machine, django_user_model):
    viewer = logged_in(django_user_model, "viewer")
    for action in ("preload", "evict"):
        response = viewer.post(f"/machines/{machine.pk}/srs/",
                               {"action": action, "circuit_id": "winning-post.tiny"})
        assert response.status_code == 403
        assert response.content.decode() == "Only staff can preload or evict SRS on a machine."
    assert not MachineAction.objects.exists()
    page = viewer.get(f"/machines/{machine.pk}/").content.decode()
    assert "winning-post.tiny" in page  # the SRS state is shown to everyone...
    assert "/srs/" not in page and "Preload" not in page  # ...the controls are not


def test_staff_preload_is_queued_from_the_form_outside_the_pushed_panel(machine,
                                                                        django_user_model):
    staff = logged_in(django_user_model, "boss", is_staff=True)
    page = staff.get(f"/machines/{machine.pk}/").content.decode()
    live, rest = page.split('class="live"')[1].split('id="host-srs-form"')
    assert f'<form method="post" action="/machines/{machine.pk}/srs/" class="card srs-form"' in live
    assert live.count("<form") == 1  # the SRS form follows the panel; nothing to post in it
    assert "csrfmiddlewaretoken" in rest
    assert '<option value="winning-post.tiny">' in rest
    response = staff.post(f"/machines/{machine.pk}/srs/",
                          {"action": "evict", "circuit_id": "winning-post.tiny"})
    assert response.status_code == 302
    assert MachineAction.objects.get().action == "evict"


def test_the_pushed_panel_carries_no_form(machine):
    assert "<form" not in fragments.render_machine_panel(machine)


def scope(origin: str | None, host: str | None, scheme: str = "ws") -> dict:
    headers = [(b"origin", origin.encode())] if origin else []
    headers += [(b"host", host.encode())] if host else []
    return {"type": "websocket", "scheme": scheme, "headers": headers}


@pytest.mark.parametrize("origin,host,scheme,allowed", [
    ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", True),
    ("http://localhost", "localhost:80", "ws", True),  # the default port, written or not
    ("https://localhost", "localhost", "wss", True),
    ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws", False),  # another port: another site
    ("http://127.0.0.1", "127.0.0.1:8000", "ws", False),
    ("https://127.0.0.1:8000", "127.0.0.1:8000", "ws", False),  # another scheme
    ("http://evil.example:8000", "127.0.0.1:8000", "ws", False),
    ("http://evil.example", "evil.example", "ws", False),  # a host we do not serve
    ("http://127.0.0.1:99999", "127.0.0.1:99999", "ws", False),  # no such port
    ("null", "127.0.0.1", "ws", False),
    (None, "127.0.0.1", "ws", False),
    ("http://127.0.0.1", None, "ws", False),
])
def test_origin_must_match_scheme_host_and_port(origin, host, scheme, allowed):
    assert same_origin(scope(origin, host, scheme)) is allowed


def test_csrf_trusted_origins_are_accepted(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://dash.example.org"]
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    assert same_origin(scope("https://dash.example.org", "127.0.0.1:8000"))


@pytest.mark.django_db(transaction=True)
async def test_a_socket_from_another_port_of_our_host_is_refused():
    cookie = await database_sync_to_async(session_cookie)()
    for origin, expected in ((b"http://127.0.0.1:8001", False), (b"http://127.0.0.1:8000", True)):
        ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[
            (b"origin", origin), (b"host", b"127.0.0.1:8000"), (b"cookie", cookie)])
        connected, _ = await ws.connect()
        assert connected is expected, origin
        await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/ws/machines/99999999999999999999999/", "/ws/machines/0/",
                                  "/ws/proofs/00000000-0000-0000-0000-000000000000/",
                                  "/null", "/ws/nowhere/", "/"])
async def test_a_socket_for_no_such_object_closes_with_4404(path):
    cookie = await database_sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(application, path, headers=[
        (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)])
    connected, _ = await ws.connect()
    assert connected
    assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}


def test_htmx_posts_carry_the_csrf_token_from_the_body_header(machine, django_user_model):
    """A control in a pushed fragment has no form token; htmx sends the page's token in the
    X-CSRFToken header that base.html sets once on <body>. Without it a post is refused."""
    staff = Client(enforce_csrf_checks=True)
    staff.force_login(django_user_model.objects.create_user("boss", is_staff=True))
    page = staff.get(f"/machines/{machine.pk}/").content.decode()
    token = re.search(r"""<body hx-headers='\{"X-CSRFToken": "([^"]+)"\}'""", page).group(1)
    data = {"action": "preload", "circuit_id": "winning-post.tiny"}
    assert staff.post(f"/machines/{machine.pk}/srs/", data).status_code == 403
    assert staff.post(f"/machines/{machine.pk}/srs/", data, headers={"X-CSRFToken": token,
                                                                  "HX-Request": "true"}
                      ).status_code == 302
    assert MachineAction.objects.count() == 1
