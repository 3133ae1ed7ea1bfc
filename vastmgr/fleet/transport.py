"""How the controller reaches a machine's engine API.

A transport turns a Machine row into a base URL and bearer token the controller can talk to.
Local engines are reached directly; other providers (an SSH tunnel for rented hosts) register
their own factory with `register_transport`, keyed by `Machine.provider`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

from vastmgr.lib.errors import TransportError


@dataclass(frozen=True)
class EngineEndpoint:
    base_url: str
    token: str | None = None

    def __repr__(self) -> str:
        # The token must never reach a log line.
        return f"EngineEndpoint({self.base_url!r}, token={'set' if self.token else 'none'})"


class EngineTransport(abc.ABC):
    """Opens (and later closes) the path to one machine's engine API."""

    @abc.abstractmethod
    async def connect(self) -> EngineEndpoint:
        """Return where the engine API answers now; raise TransportError when it cannot."""

    async def close(self) -> None:
        """Release whatever `connect` opened (a tunnel, a subprocess); idempotent."""


class LocalTransport(EngineTransport):
    """An engine reachable directly over TCP (the local engine, or one on a trusted network)."""

    def __init__(self, host: str, port: int, token: str = ""):
        self.host = host or "127.0.0.1"
        self.port = port
        self.token = token or None

    @classmethod
    def for_machine(cls, machine) -> LocalTransport:
        return cls(machine.host, machine.engine_port, machine.engine_token)

    async def connect(self) -> EngineEndpoint:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return EngineEndpoint(f"http://{host}:{self.port}", self.token)


TransportFactory = Callable[[object], EngineTransport]
_FACTORIES: dict[str, TransportFactory] = {"local": LocalTransport.for_machine}


def register_transport(provider: str, factory: TransportFactory) -> None:
    """Make machines of `provider` reachable; `factory(machine)` returns a fresh transport."""
    _FACTORIES[provider] = factory


def transport_for(machine) -> EngineTransport:
    try:
        factory = _FACTORIES[machine.provider]
    except KeyError:
        raise TransportError(
            f"no engine transport for provider {machine.provider!r} "
            f"(known: {', '.join(sorted(_FACTORIES))})"
        ) from None
    return factory(machine)
