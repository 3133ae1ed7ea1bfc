"""Reading the environment into settings values, with one clear error line per bad variable."""

import json
import os
import secrets
import sys
from pathlib import Path

import dj_database_url

from vastmgr.lib.errors import SettingsError

TRUTHY = {"1", "true", "yes", "on"}
FALSY = {"0", "false", "no", "off", ""}


def env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUTHY:
        return True
    if value in FALSY:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# Written by `manage.py up` into the checkout's default data directory while it runs with
# another one: what a command started beside it without VASTMGR_DATA_DIR reads.
STACK_RECORD = "running-stack.json"


def data_dir(base_dir: Path) -> Path:
    """VASTMGR_DATA_DIR, else, for a management command (not `up`), the data directory of a
    stack that `./dev up` runs from this checkout (the command works on the stack's data, and
    says so), else the checkout's var/. Other programs that load the settings (pytest, mypy)
    never follow a stack: their data must not move with what happens to run."""
    chosen = os.environ.get("VASTMGR_DATA_DIR")
    beside = not chosen and _management_command() not in (None, "up")
    path = Path(chosen) if chosen else (beside and running_stack_dir(base_dir / "var")) \
        or base_dir / "var"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"VASTMGR_DATA_DIR={str(path)!r} cannot be created: {exc.strerror}")
    return path


def running_stack_dir(default: Path) -> Path | None:
    """The data directory of the stack recorded in `default` (None: no stack runs with
    another one). A stack on DATABASE_URL is not followed without it: refused, naming both."""
    try:
        record = json.loads((default / STACK_RECORD).read_text())
        pid, stack_dir = int(record["pid"]), Path(record["data_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid() or not _alive(pid) or stack_dir == default:
        return None
    if record.get("database_url") and not os.environ.get("DATABASE_URL"):
        raise SettingsError(
            f"a stack started by ./dev up (pid {pid}) runs on DATABASE_URL with data "
            f"directory {stack_dir}; this command has no DATABASE_URL and would use {default}: "
            "set DATABASE_URL (and VASTMGR_DATA_DIR) as the stack has them")
    print(f"vastmgr: using the data directory of the stack ./dev up runs (pid {pid}): "
          f"{stack_dir}, not {default} (set VASTMGR_DATA_DIR to choose)", file=sys.stderr)
    return stack_dir


def record_running_stack(default: Path, data: Path) -> Path | None:
    """`up` running with a data directory other than the checkout's `default`: leave word
    there for the commands run beside it; returns the record, to remove at the end."""
    if data.resolve() == default.resolve():
        return None
    default.mkdir(parents=True, exist_ok=True)
    record = default / STACK_RECORD
    record.write_text(json.dumps({"pid": os.getpid(), "data_dir": str(data.resolve()),
                                  "database_url": bool(os.environ.get("DATABASE_URL"))}))
    return record


def forget_running_stack(record: Path) -> None:
    """`up` is stopping: its word goes, unless a later stack's replaced it."""
    try:
        if json.loads(record.read_text()).get("pid") == os.getpid():
            record.unlink()
    except (OSError, ValueError):
        pass


def _management_command() -> str | None:
    """The `manage.py` command this process runs (None: not manage.py)."""
    if Path(sys.argv[0]).name != "manage.py" or len(sys.argv) < 2:
        return None
    return sys.argv[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def secret_key(data: Path) -> str:
    """SECRET_KEY from the environment, else one generated once and kept in the data dir."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    key_file = data / "secret_key"
    if key_file.exists():
        return key_file.read_text().strip()
    key = secrets.token_urlsafe(50)
    tmp = key_file.with_suffix(".tmp")
    tmp.write_text(key)
    tmp.chmod(0o600)
    tmp.replace(key_file)
    return key


# IMMEDIATE: a transaction takes the write lock when it begins and waits its turn for it
# (see `database`).
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}


def database(data: Path) -> dj_database_url.DBConfig:
    url = os.environ.get("DATABASE_URL")
    if not url:
        # Tests get a file too, not SQLite's shared in-memory database: there a write from one
        # thread fails at once ("table is locked") where the file waits its turn, as it does
        # for the dashboard, the controller and the automation sharing var/vastmgr.sqlite3.
        # IMMEDIATE: a transaction takes the write lock when it begins and waits its turn
        # for it. A deferred one that reads and then writes fails at once with "database is
        # locked" when another process wrote in between (SQLite cannot wait there): renting
        # an offer, and Cancel, 500'd so while the automation, the controller or the call-home
        # listener wrote.
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(data / "vastmgr.sqlite3"),
                "OPTIONS": dict(SQLITE_OPTIONS),
                "TEST": {"NAME": str(data / "test-vastmgr.sqlite3")}}
    try:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except (ValueError, KeyError) as exc:
        raise SettingsError(f"DATABASE_URL is malformed: {exc}") from None
    if not config.get("ENGINE") or not config.get("NAME"):
        raise SettingsError("DATABASE_URL is malformed: it names no database engine or database")
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # A SQLite file named by the URL waits its turn like the default one.
        config["OPTIONS"] = {**SQLITE_OPTIONS, **config.get("OPTIONS", {})}
    return config


REDIS_READ_TIMEOUT = 30.0


def channel_layers() -> dict:
    url = os.environ.get("REDIS_URL")
    if not url:
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(f"REDIS_URL must start with redis://, rediss:// or unix:// (got {url!r})")
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis waits for messages with a 5 s blocking pop; redis-py >= 8 also
            # defaults its socket read timeout to 5 s, which fires first and kills every idle
            # websocket consumer (close 1011). Reads may take longer than the pop, never forever.
            "CONFIG": {"hosts": [{"address": url, "socket_timeout": REDIS_READ_TIMEOUT}],
                       "capacity": 1000, "expiry": 30},
        }
    }
