"""ASGI entry point: Django for http, Channels consumers for websockets (login and origin checked: same scheme, host and port)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vastmgr.settings")

from django.core.asgi import get_asgi_application

# Django must be set up before anything imports models (the routing below does).
django_http = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

from vastmgr.front.consumers import SameOriginValidator
from vastmgr.routing import websocket_urlpatterns

application = ProtocolTypeRouter(
    {
        "http": django_http,
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
