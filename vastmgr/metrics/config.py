"""The metrics' settings, read from the environment by settings.py (no Django imports here)."""

import os
from typing import TypeVar

from cuzk_engine.vocabulary import KINDS
from vastmgr.lib.errors import SettingsError

# How long each kind of proof may wait in the dashboard's queue before it misses its purpose:
# a WinningPoSt must be in the block it is for (one 30 s epoch); a WindowPoSt deadline is
# 30 minutes; sealing proofs tolerate hours. Override with VASTMGR_BACKLOG_BUDGET_<KIND>_S.
DEFAULT_BACKLOG_BUDGET_S = {
    "winning-post": 20.0,
    "window-post": 900.0,
    "snap-update": 3600.0,
    "porep-c2": 3600.0,
}


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise SettingsError(f"{name}={raw!r} must be above 0")
    return value


Default = TypeVar("Default", float, None)


def env_positive(name: str, default: Default) -> float | Default:
    raw = os.environ.get(name, "").strip()
    return _positive(name, raw) if raw else default


def backlog_budgets() -> dict[str, float]:
    budgets = {}
    for kind in KINDS:
        name = f"VASTMGR_BACKLOG_BUDGET_{kind.upper().replace('-', '_')}_S"
        budgets[kind] = env_positive(name, DEFAULT_BACKLOG_BUDGET_S[kind])
    return budgets
