"""`/metrics` (the fleet) and `/metrics/engines` (every engine, relayed with a `host` label).

Both are open to Prometheus without a login, but restricted: with VASTMGR_METRICS_TOKEN set,
a request must carry `Authorization: Bearer <token>`; without it, only a direct connection from
the dashboard's own loopback is answered (not one forwarded by a proxy, which the
`X-Forwarded-For` header tells), so nothing leaks through nginx.
"""

import hmac
import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from vastmgr.metrics.exposition import engines_exposition, fleet_exposition


def _allowed(request: HttpRequest) -> bool:
    token = settings.VASTMGR_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    if "X-Forwarded-For" in request.headers:
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _answer(request: HttpRequest, body: Callable[[], bytes]) -> HttpResponse:
    if not _allowed(request):
        return HttpResponse("metrics need VASTMGR_METRICS_TOKEN as a bearer token (or a "
                            "direct loopback connection when no token is set)\n", status=403,
                            content_type="text/plain")
    return HttpResponse(body(), content_type=CONTENT_TYPE_LATEST)


@login_not_required
@require_GET
def fleet_metrics(request: HttpRequest) -> HttpResponse:
    return _answer(request, fleet_exposition)


@login_not_required
@require_GET
def engine_metrics(request: HttpRequest) -> HttpResponse:
    return _answer(request, engines_exposition)
