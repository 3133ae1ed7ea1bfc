"""Default locations the engine and the one-shot commands share. Kept apart from
`cuzk_engine.config`, so that a `prove` process finds its parameter cache without importing
the engine's configuration."""

from __future__ import annotations

import os
from pathlib import Path


def default_param_cache() -> Path:
    env = os.environ.get("CUZK_PARAM_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "cuzk_engine" / "params"
