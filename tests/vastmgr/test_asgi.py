"""The ASGI router serves http through Django and websockets through Channels, login-checked."""

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from vastmgr.asgi import application
from vastmgr.front.consumers import CLOSE_FORBIDDEN

pytestmark = pytest.mark.django_db(transaction=True)


async def test_http_is_served_by_django():
    response = await HttpCommunicator(
        application, "GET", "/accounts/login/", headers=[(b"host", b"127.0.0.1")]
    ).get_response()
    assert response["status"] == 200
    assert b"Log in" in response["body"]


def session_cookie_for(username: str) -> bytes:
    user = get_user_model().objects.create_user(username, password="pw-for-tests-1")
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_anonymous_websocket_is_closed_with_4403():
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")])
    connected, _ = await ws.connect()
    assert connected  # the handshake completes so that the browser can read the close code
    assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}


async def test_foreign_origin_websocket_is_refused():
    cookie = await database_sync_to_async(session_cookie_for)("op")
    ws = WebsocketCommunicator(application, "/ws/fleet/",
                               headers=[(b"origin", b"http://evil.example"), (b"host", b"127.0.0.1"),
                                        (b"cookie", cookie)])
    connected, _ = await ws.connect()
    assert not connected


async def test_logged_in_websocket_receives_fleet_fragments():
    cookie = await database_sync_to_async(session_cookie_for)("op")
    ws = WebsocketCommunicator(application, "/ws/fleet/",
                               headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)])
    connected, _ = await ws.connect()
    assert connected
    assert 'id="fleet-rows"' in await ws.receive_from(timeout=5)  # the full state comes first
    await get_channel_layer().group_send("fleet", {"type": "fragment", "html": '<div id="x">1</div>'})
    assert await ws.receive_from(timeout=2) == '<div id="x">1</div>'
    await ws.disconnect()
