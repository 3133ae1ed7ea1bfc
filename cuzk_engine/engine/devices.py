"""Proving devices: one lock each, held only around prove_start's device work."""

from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass, field
from typing import Any

from cuzk_engine.engine.stages import Stages
from cuzk_engine.engine.status import DeviceInfo


@dataclass
class Device:
    ordinal: int
    name: str  # "cpu" or "cuda:<n>"
    backend: Any
    description: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> DeviceInfo:
        kind = "cuda" if self.name.startswith("cuda") else "cpu"
        return DeviceInfo(self.ordinal, self.name, kind, self.description)


def _cpu_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU backend: {model}, {os.cpu_count()} logical cores"


def _cuda_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy, no driver or no device all mean "no GPUs"
        return 0


def _cuda_description(ordinal: int) -> str:
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(ordinal)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"CUDA device {ordinal}: {name}, {props['totalGlobalMem'] / 1024**3:.1f} GiB"
    except Exception:  # noqa: BLE001 - description only; the backend itself reports real errors
        return f"CUDA device {ordinal}"


def open_devices(names: list[str], stages: Stages) -> list[Device]:
    """Resolve config device names; ``auto`` = every usable CUDA GPU, else one CPU device."""
    wanted: list[str] = []
    for n in names:
        if n == "auto":
            backend = stages.select_backend("auto")
            if getattr(backend, "name", "cpu").startswith("cuda"):
                wanted += [f"cuda:{i}" for i in range(max(_cuda_count(), 1))]
            else:
                wanted.append("cpu")
        elif n == "cuda":
            wanted.append("cuda:0")
        else:
            wanted.append(n)
    devices = []
    for ordinal, name in enumerate(dict.fromkeys(wanted)):
        backend = stages.select_backend(name)
        desc = _cpu_description() if name == "cpu" else _cuda_description(int(name.split(":")[1]))
        devices.append(Device(ordinal, name, backend, desc))
    return devices
