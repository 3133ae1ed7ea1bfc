"""What every call-home route shares: vast-manager's answers (JSON with a trailing newline,
errors as {"error": msg}, a wrong method as plain text), its way of reading a body (Go's
json.Decoder into a struct: unknown fields ignored, null and missing fields zero, a wrong type
refused), plus what it lacked: the deployment secret and a rate limit per client address."""

import functools
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from vastmgr.instances.config import AUTH_REQUIRED, CallHomeSettings
from vastmgr.instances.models import DeploySecret, Instance


class ProtocolError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def answer(payload: Any, status: int = 200) -> HttpResponse:
    # Go's json.Encoder ends every document with a newline.
    return HttpResponse(json.dumps(payload) + "\n", status=status,
                        content_type="application/json")


def error(message: str, status: int) -> HttpResponse:
    return answer({"error": message}, status)


GO_TYPES = {str: "string", float: "number"}


def decode(request: HttpRequest, fields: dict[str, type]) -> dict[str, Any]:
    """The body as Go decodes it into a struct of `fields` (str or float): the first JSON
    value only, an object (or null); absent and null fields are the zero value."""
    text = request.body.decode(errors="replace").lstrip()
    if not text:
        raise ProtocolError("bad request: EOF")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except ValueError as exc:
        raise ProtocolError(f"bad request: {exc}") from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ProtocolError(f"bad request: cannot decode a JSON {type(value).__name__} "
                            "into an object")
    decoded: dict[str, Any] = {}
    for name, kind in fields.items():
        raw = value.get(name)
        if raw is None:
            decoded[name] = kind()
        elif kind is float and isinstance(raw, int | float) and not isinstance(raw, bool):
            decoded[name] = float(raw)
        elif kind is str and isinstance(raw, str):
            decoded[name] = raw
        else:
            raise ProtocolError(f"bad request: {name} must be a {GO_TYPES[kind]}")
    return decoded


class RateLimiter:
    """A token bucket per client address, in this process (the listener is one process)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def wait(self, client: str, rate: float, burst: float) -> float:
        """0 when `client` may go on (one token taken), else the seconds until it may."""
        now = self.clock()
        with self.lock:
            tokens, then = self.buckets.get(client, (burst, now))
            tokens = min(burst, tokens + (now - then) * rate)
            if tokens >= 1:
                self.buckets[client] = (tokens - 1, now)
                if len(self.buckets) > 10_000:  # forget the idle ones: bounded memory
                    self.buckets = {k: v for k, v in self.buckets.items()
                                    if now - v[1] < burst / rate}
                return 0.0
            self.buckets[client] = (tokens, now)
            return (1 - tokens) / rate


limiter = RateLimiter()


def presented_secret(request: HttpRequest) -> DeploySecret | None:
    """The deployment secret the request presents; ProtocolError 401 for a wrong one, or for
    none when the settings require one."""
    header = request.headers.get("Authorization", "")
    if not header:
        if CallHomeSettings.load().auth == AUTH_REQUIRED:
            raise ProtocolError("a deployment secret is required: send Authorization: "
                                "Bearer $VASTMGR_CALLHOME_SECRET", 401)
        return None
    scheme, _, token = header.partition(" ")
    found = DeploySecret.find(token.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise ProtocolError("the deployment secret is not one this manager issued", 401)
    return found


def check_owner(instance: Instance, secret: DeploySecret | None) -> None:
    """An instance that registered with a secret is driven only with that secret."""
    if instance.secret_id is not None and (secret is None or secret.pk != instance.secret_id):
        raise ProtocolError("this instance registered with a deployment secret: present it", 401)


def route(*methods: str):
    """A call-home view: method check, rate limit, the secret (passed on), errors answered."""
    def wrap(view):
        @csrf_exempt
        @login_not_required
        @functools.wraps(view)
        def handle(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                return HttpResponse("method not allowed\n", status=405,
                                    content_type="text/plain; charset=utf-8")
            settings = CallHomeSettings.load()
            wait = limiter.wait(request.META.get("REMOTE_ADDR", ""), settings.rate_per_s,
                                settings.burst)
            if wait:
                response = error(f"too many requests: retry in {math.ceil(wait)} s", 429)
                response["Retry-After"] = str(math.ceil(wait))
                return response
            try:
                return view(request, presented_secret(request), *args, **kwargs)
            except ProtocolError as exc:
                return error(str(exc), exc.status)
        return handle
    return wrap
