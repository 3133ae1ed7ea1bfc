"""How the controller reaches a machine's engine API.

A transport turns a Machine row into a base URL and bearer token the controller can talk to, or,
for an upstream cuzk daemon's gRPC API, into a target grpc can dial (`DaemonAddress`).
Local engines are reached directly; other providers (an SSH tunnel for rented hosts) register
their own factory with `register_transport`, keyed by `Machine.provider`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from vastmgr.lib.errors import TransportError

UNIX_SCHEME, TCP_SCHEME = "unix", "grpc"


@dataclass(frozen=True)
class EngineEndpoint:
    base_url: str
    token: str | None = None

    def __repr__(self) -> str:
        # The token must never reach a log line.
        return f"EngineEndpoint({self.base_url!r}, token={'set' if self.token else 'none'})"


@dataclass(frozen=True)
class DaemonAddress:
    """Where a cuzk daemon listens: a TCP host and port, or a unix socket path."""

    scheme: str  # UNIX_SCHEME or TCP_SCHEME
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, url: str) -> DaemonAddress:
        """`grpc://HOST:PORT` or `unix:///absolute/path`; ValueError says what is wrong."""
        url = url.strip()
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{url!r}: {exc}") from None
        if parts.scheme == UNIX_SCHEME:
            if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
                raise ValueError(f"{url!r}: a unix socket is unix:///absolute/path/to/cuzk.sock")
            return cls(UNIX_SCHEME, path=parts.path)
        if parts.scheme == TCP_SCHEME:
            if not parts.hostname or not port:
                raise ValueError(f"{url!r}: give grpc://HOST:PORT (Curio's docs use port 9820)")
            if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
                raise ValueError(f"{url!r}: give only grpc://HOST:PORT")
            return cls(TCP_SCHEME, host=parts.hostname, port=port)
        raise ValueError(f"{url!r}: a cuzk daemon is grpc://HOST:PORT or unix:///path "
                         "(its API is gRPC without TLS)")

    @property
    def url(self) -> str:
        if self.scheme == UNIX_SCHEME:
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"grpc://{host}:{self.port}"

    @property
    def target(self) -> str:
        """The address as grpc dials it (here, not through SSH)."""
        if self.scheme == UNIX_SCHEME:
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class EngineTransport(abc.ABC):
    """Opens (and later closes) the path to one machine's engine API."""

    @abc.abstractmethod
    async def connect(self) -> EngineEndpoint:
        """Return where the engine API answers now; raise TransportError when it cannot."""

    async def close(self) -> None:
        """Release whatever `connect` opened (a tunnel, a subprocess); idempotent."""

    async def grpc_target(self, address: DaemonAddress) -> str:
        """Where gRPC dials to reach `address` (a daemon's address as seen on the machine):
        the address itself here; a forwarded local port for a machine behind SSH."""
        return address.target


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
