"""Settings of the remote app, read from the environment (Django settings may override them).

Minutes everywhere, because that is how operators think about host timeouts.
"""

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import TypeVar

from django.conf import settings

from cuzk_engine.vocabulary import KINDS, PROFILES
from vastmgr.lib.errors import SettingsError

DEFAULT_VAST_URL = "https://console.vast.ai"

# How long a machine may sit in a state before the automation kills it (the original
# vast-manager used 90 min for fetching parameters and 45 min for the benchmark).
DEFAULT_STATE_TIMEOUTS_MIN = {
    "registered": 30.0,
    "provisioning": 90.0,
    "params_ready": 45.0,
    "benchmarked": 30.0,
}


# What vast-manager rented: Curio's cuzk image, whose entrypoint fetches parameters,
# benchmarks and calls home (flavour cuzk-upstream). The env holds no default: vast-manager's
# PAVAIL secret and server are each operator's own (VASTMGR_UPSTREAM_ENV).
DEFAULT_UPSTREAM_IMAGE = "magik6k/curio-cuzk:latest"
DEFAULT_UPSTREAM_ONSTART = "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(text: str, reserved: tuple[str, ...] = ()) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped) as a dict. A malformed line, a
    repeated name or one of `reserved` is a ValueError naming the line."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not ENV_NAME.fullmatch(name):
            raise ValueError(f"line {number}: expected NAME=value, where NAME is letters, "
                             "digits and _ (not starting with a digit)")
        if name in env:
            raise ValueError(f"line {number}: {name} is set twice")
        if name in reserved:
            raise ValueError(f"line {number}: {name} is set by vastmgr itself")
        env[name] = value.strip()
    return env


def format_env(env: dict[str, str]) -> str:
    """The NAME=value lines parse_env reads back as `env`."""
    return "\n".join(f"{name}={value}" for name, value in env.items())


Default = TypeVar("Default", float, None)


def _env_float(name: str, default: Default) -> float | Default:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise SettingsError(f"{name}={raw!r} must not be negative")
    return value


def _env_choice(name: str, default: str, choices) -> str:
    value = os.environ.get(name, "").strip() or default
    if value not in choices:
        raise SettingsError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def _env_args(name: str) -> tuple[str, ...]:
    raw = os.environ.get(name, "")
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a shell-quoted argument list ({exc})") from None


def _env_lines(name: str) -> str:
    """Shell-quoted NAME=value words as the rent dialog's lines, checked."""
    lines = "\n".join(_env_args(name))
    try:
        parse_env(lines)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None
    return lines


@dataclass(frozen=True)
class RemoteSettings:
    vast_url: str = DEFAULT_VAST_URL
    state_timeouts_min: dict = field(default_factory=lambda: dict(DEFAULT_STATE_TIMEOUTS_MIN))
    min_bench_rate: float = 50.0
    auto_destroy_idle_min: float | None = None
    alert_webhook_url: str = ""
    # The signing secret of Vast's notification webhook (shown once when it is created in
    # Vast's console or API); empty: the receiving route answers 404.
    vast_webhook_secret: str = field(default="", repr=False)
    offline_alert_min: float = 5.0
    # A rented instance that stopped running (exited, offline, unknown...) is destroyed after
    # this long: it keeps billing for its disk and rarely comes back.
    vast_down_grace_min: float = 10.0
    # Extra `pip install` arguments for provisioning: a private index, or an offline host's
    # `--no-index --find-links DIR`.
    provision_pip_args: tuple[str, ...] = ()
    # The interpreter on hosts that builds the engine's venv (Python >= 3.11 with venv).
    remote_python: str = "python3"
    # The benchmark that gates a new host: `bench_proofs` verified proofs of this kind and
    # profile, in proofs per hour against min_bench_rate. porep-c2 is the heaviest kind, so a
    # slow host shows as one.
    bench_kind: str = "porep-c2"
    bench_profile: str = "small"
    bench_proofs: int = 2
    # The rent dialog's defaults for an upstream cuzk worker (each user's last choice wins).
    upstream_image: str = DEFAULT_UPSTREAM_IMAGE
    upstream_env: str = ""  # KEY=VALUE lines
    upstream_onstart: str = DEFAULT_UPSTREAM_ONSTART

    @classmethod
    def load(cls) -> "RemoteSettings":
        override = getattr(settings, "VASTMGR_REMOTE", None)
        if override is not None:
            return override
        timeouts = {
            state: _env_float(f"VASTMGR_TIMEOUT_{state.upper()}_MIN", default)
            for state, default in DEFAULT_STATE_TIMEOUTS_MIN.items()
        }
        url = os.environ.get("VAST_URL", DEFAULT_VAST_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"VAST_URL must start with http:// or https:// (got {url!r})")
        webhook = os.environ.get("VASTMGR_ALERT_WEBHOOK_URL", "").strip()
        if webhook and not webhook.startswith(("http://", "https://")):
            raise SettingsError("VASTMGR_ALERT_WEBHOOK_URL must start with http:// or https://")
        return cls(
            vast_url=url,
            state_timeouts_min=timeouts,
            min_bench_rate=_env_float("VASTMGR_MIN_BENCH_RATE", 50.0),
            auto_destroy_idle_min=_env_float("VASTMGR_AUTO_DESTROY_IDLE_MIN", None),
            alert_webhook_url=webhook,
            vast_webhook_secret=os.environ.get("VASTMGR_VAST_WEBHOOK_SECRET", "").strip(),
            offline_alert_min=_env_float("VASTMGR_OFFLINE_ALERT_MIN", 5.0),
            vast_down_grace_min=_env_float("VASTMGR_VAST_DOWN_GRACE_MIN", 10.0),
            provision_pip_args=_env_args("VASTMGR_PROVISION_PIP_ARGS"),
            remote_python=os.environ.get("VASTMGR_REMOTE_PYTHON", "").strip() or "python3",
            bench_kind=_env_choice("VASTMGR_BENCH_KIND", "porep-c2", KINDS),
            bench_profile=_env_choice("VASTMGR_BENCH_PROFILE", "small", PROFILES),
            bench_proofs=max(1, int(_env_float("VASTMGR_BENCH_PROOFS", 2))),
            upstream_image=os.environ.get("VASTMGR_UPSTREAM_IMAGE", "").strip()
            or DEFAULT_UPSTREAM_IMAGE,
            upstream_env=_env_lines("VASTMGR_UPSTREAM_ENV"),
            upstream_onstart=os.environ.get("VASTMGR_UPSTREAM_ONSTART", "").strip()
            or DEFAULT_UPSTREAM_ONSTART,
        )
