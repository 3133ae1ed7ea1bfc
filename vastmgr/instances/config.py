"""Settings of the call-home listener, read from the environment (Django settings may override)."""

import os
from dataclasses import dataclass

from django.conf import settings

from vastmgr.lib.errors import SettingsError

AUTH_REQUIRED = "required"
AUTH_COMPAT = "compat"
DEFAULT_PORT = 1235  # vast-manager's --listen :1235, so old images find the same port


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


@dataclass(frozen=True)
class CallHomeSettings:
    # `required`: every call presents a deployment secret (Authorization: Bearer <secret>).
    # `compat`: calls without one are accepted, as vast-manager did, for images built for it;
    # a wrong secret is refused in both modes, and so is a missing one for an instance that
    # registered with a secret.
    auth: str = AUTH_REQUIRED
    # Requests per second per client address, and the burst allowed above that rate.
    rate_per_s: float = 20.0
    burst: float = 200.0

    @classmethod
    def load(cls) -> "CallHomeSettings":
        override = getattr(settings, "VASTMGR_CALLHOME", None)
        if override is not None:
            return override
        auth = os.environ.get("VASTMGR_CALLHOME_AUTH", "").strip() or AUTH_REQUIRED
        if auth not in (AUTH_REQUIRED, AUTH_COMPAT):
            raise SettingsError(f"VASTMGR_CALLHOME_AUTH={auth!r} is not one of "
                                f"{AUTH_REQUIRED}, {AUTH_COMPAT}")
        return cls(auth=auth, rate_per_s=_env_number("VASTMGR_CALLHOME_RATE_PER_S", 20.0),
                   burst=_env_number("VASTMGR_CALLHOME_BURST", 200.0))
