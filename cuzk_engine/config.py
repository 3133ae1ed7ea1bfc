"""Engine configuration: a TOML file on top of defaults, validated strictly.

cuzk silently ignored unknown keys and fell back to 50 GiB on an unparsable size; here every
unknown key and every malformed value is an error that names the offending key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cuzk_engine.errors import ConfigError
from cuzk_engine.paths import default_param_cache
from cuzk_engine.vocabulary import DEFAULT_PRIORITIES, KINDS, PRIORITIES

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(value: int | str, key: str = "size") -> int:
    """Parse ``12GiB``, ``512 MB`` or a plain byte count into bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like '12GiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: size must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a size like '12GiB', got {value!r}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"{key}: cannot parse size {value!r} (use e.g. '12GiB', '512MiB', '1000')")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(value: float | str, key: str = "duration") -> float:
    """Parse ``5m``, ``30s``, ``250ms`` or a number of seconds into seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like '30s', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{key}: duration must not be negative, got {value}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a duration like '30s', got {value!r}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if not m:
        raise ConfigError(f"{key}: cannot parse duration {value!r} (use e.g. '250ms', '30s', '5m')")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]


def parse_listen(value: str, key: str = "daemon.listen") -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:9821``) and check the port range."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected 'host:port', got {value!r}")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\s]+):(\d+)", value.strip())
    if not m:
        raise ConfigError(f"{key}: expected 'host:port' (IPv6 as '[::1]:9821'), got {value!r}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ConfigError(f"{key}: port {port} out of range")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # here, as tomllib in load_config: ~10 ms of every `prove` start otherwise

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class MemoryConfig:
    total_budget: int | None = None  # None = auto (MemTotal - safety_margin)
    safety_margin: int = 2 * 1024**3
    eviction_min_idle: float = 300.0

    def resolve_total(self) -> int:
        if self.total_budget is not None:
            return self.total_budget
        return max(detect_memory_total() - self.safety_margin, 256 * 1024**2)


@dataclass
class PipelineConfig:
    enabled: bool = True
    split_prove: bool = True
    self_verify: bool = True


@dataclass
class DaemonConfig:
    listen: str = "127.0.0.1:9821"
    token: str | None = None
    stream_interval: float = 0.25
    # After a drain, how long to wait for clients to fetch the results of jobs that ended during
    # it (finished, or cancelled by the shutdown), so a controller learns each one's outcome.
    drain_linger: float = 5.0

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]


@dataclass
class StatusConfig:
    retention: float = 30.0  # how long a finished job stays in /status pipelines
    result_retention: float = 3600.0  # how long GET /v1/proofs/{id} still answers


@dataclass
class EngineConfig:
    devices: list[str] = field(default_factory=lambda: ["auto"])
    gpu_workers_per_device: int = 2
    synthesis_workers: int = 0  # 0 = number of CPUs
    msm_threads: int = 0  # threads per CPU MSM call; 0 = CUZK_MSM_THREADS, else cores / provers
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    param_cache: Path = field(default_factory=default_param_cache)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    priorities: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PRIORITIES))

    def resolved_synthesis_workers(self) -> int:
        return self.synthesis_workers or (os.cpu_count() or 1)

    def resolved_msm_threads(self, provers: int) -> int:
        """Threads each CPU MSM call spreads over, when `provers` workers may run one at once
        (device workers on the CPU backend, or finalizers running the G2 MSM): the configured
        count, else CUZK_MSM_THREADS, else the cores shared among the provers. Every prover
        already runs several MSMs side by side (prove_start's A, B and L beside H, the G2 MSM
        beside them), so a per-call share of the cores keeps the threads near the core count
        and leaves the synthesis processes their turn on the CPU."""
        if self.msm_threads:
            return self.msm_threads
        from cuzk_engine.native.msm import configured_threads

        return configured_threads() or max(1, (os.cpu_count() or 1) // max(1, provers))

    def check_daemon_security(self) -> None:
        """Refuse to serve beyond loopback without a bearer token."""
        if not is_loopback(self.daemon.host) and not self.daemon.token:
            raise ConfigError(
                f"daemon.listen = {self.daemon.listen!r} is not a loopback address: "
                "set daemon.token so the API requires a bearer token"
            )


def detect_memory_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return pages * os.sysconf("SC_PAGE_SIZE") if pages > 0 else 8 * 1024**3


_SCHEMA: dict[str, set[str]] = {
    "": {"devices", "gpus", "synthesis", "cpu", "memory", "pipeline", "srs", "daemon", "status",
         "priorities"},
    "gpus": {"devices", "gpu_workers_per_device"},
    "synthesis": {"workers"},
    "cpu": {"msm_threads"},
    "memory": {"total_budget", "safety_margin", "eviction_min_idle"},
    "pipeline": {"enabled", "split_prove", "self_verify"},
    "srs": {"param_cache"},
    "daemon": {"listen", "token", "stream_interval", "drain_linger"},
    "status": {"retention", "result_retention"},
}


def _expect(value, kind, key):
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    return value


def _int_between(value, key: str, low: int, high: int, low_means: str = "") -> int:
    """An integer in [low, high]; `low_means` says what the lowest value asks for."""
    n = _expect(value, int, key)
    if not low <= n <= high:
        lowest = f"{low} ({low_means})" if low_means else str(low)
        raise ConfigError(f"{key} must be {lowest}..{high}, got {n}")
    return n


def config_from_dict(data: dict) -> EngineConfig:
    """Build a validated config from parsed TOML (or an equivalent dict)."""
    for section, allowed in _SCHEMA.items():
        table = data if section == "" else data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{section}] must be a table")
        for k in table:
            if section == "priorities":
                continue
            if k not in allowed:
                where = f"{section}.{k}" if section else k
                raise ConfigError(f"unknown configuration key {where!r}")

    cfg = EngineConfig()
    gpus = data.get("gpus", {})
    if "devices" in data and "devices" in gpus:
        raise ConfigError("devices is set both at top level and in [gpus]; keep one")
    devices = data.get("devices", gpus.get("devices"))
    if devices is not None:
        if isinstance(devices, str):
            devices = [devices]
        if not isinstance(devices, list) or not devices:
            raise ConfigError("gpus.devices: expected 'auto', 'cpu' or a list like ['cuda:0']")
        for d in devices:
            if not isinstance(d, (str, int)) or not re.fullmatch(
                r"auto|cpu|cuda(:\d+)?|\d+", str(d)
            ):
                raise ConfigError(f"gpus.devices: unknown device {d!r} (use auto, cpu, cuda:N)")
        cfg.devices = [f"cuda:{d}" if re.fullmatch(r"\d+", str(d)) else str(d) for d in devices]
    if "gpu_workers_per_device" in gpus:
        cfg.gpu_workers_per_device = _int_between(
            gpus["gpu_workers_per_device"], "gpus.gpu_workers_per_device", 1, 64)

    synth = data.get("synthesis", {})
    if "workers" in synth:
        cfg.synthesis_workers = _int_between(synth["workers"], "synthesis.workers", 0, 1024,
                                             "all CPUs")
    cpu = data.get("cpu", {})
    if "msm_threads" in cpu:
        cfg.msm_threads = _int_between(cpu["msm_threads"], "cpu.msm_threads", 0, 1024,
                                       "automatic")

    mem = data.get("memory", {})
    if "total_budget" in mem:
        v = mem["total_budget"]
        cfg.memory.total_budget = None if v == "auto" else parse_size(v, "memory.total_budget")
        if cfg.memory.total_budget == 0:
            raise ConfigError("memory.total_budget must be 'auto' or a positive size")
    if "safety_margin" in mem:
        cfg.memory.safety_margin = parse_size(mem["safety_margin"], "memory.safety_margin")
    if "eviction_min_idle" in mem:
        cfg.memory.eviction_min_idle = parse_duration(
            mem["eviction_min_idle"], "memory.eviction_min_idle"
        )

    pipe = data.get("pipeline", {})
    for k in ("enabled", "split_prove", "self_verify"):
        if k in pipe:
            setattr(cfg.pipeline, k, _expect(pipe[k], bool, f"pipeline.{k}"))

    srs = data.get("srs", {})
    if "param_cache" in srs:
        cfg.param_cache = Path(_expect(srs["param_cache"], str, "srs.param_cache")).expanduser()

    daemon = data.get("daemon", {})
    if "listen" in daemon:
        parse_listen(daemon["listen"])
        cfg.daemon.listen = daemon["listen"]
    if "token" in daemon:
        token = _expect(daemon["token"], str, "daemon.token")
        cfg.daemon.token = token or None
    if "stream_interval" in daemon:
        cfg.daemon.stream_interval = parse_duration(daemon["stream_interval"],
                                                    "daemon.stream_interval")
    if "drain_linger" in daemon:
        cfg.daemon.drain_linger = parse_duration(daemon["drain_linger"], "daemon.drain_linger")

    status = data.get("status", {})
    for k in ("retention", "result_retention"):
        if k in status:
            setattr(cfg.status, k, parse_duration(status[k], f"status.{k}"))

    prios = data.get("priorities", {})
    if not isinstance(prios, dict):
        raise ConfigError("[priorities] must be a table of kind = priority")
    for kind, prio in prios.items():
        if kind not in KINDS:
            raise ConfigError(
                f"unknown configuration key 'priorities.{kind}' "
                f"(kinds: {', '.join(KINDS)})"
            )
        if prio not in PRIORITIES:
            raise ConfigError(f"priorities.{kind}: expected one of {PRIORITIES}, got {prio!r}")
        cfg.priorities[kind] = prio
    return cfg


def load_config(path: str | Path | None) -> EngineConfig:
    """Load a TOML file; ``None`` means defaults. A missing named file is an error."""
    if path is None:
        return EngineConfig()
    import tomllib

    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None
    return config_from_dict(data)
