"""SSH to remote machines: one kept-alive connection per machine, host keys pinned on first contact.

Host keys follow trust-on-first-use: the key a host presents on its first successful contact is
stored on the Machine, and every later connection accepts only that key. A different key is
refused (an Event says so, with both fingerprints) until an operator clears the pin. The engine
listens on the host's loopback only; `MachineLink.tunnel()` forwards a local port to it.
"""

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncssh
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import HostKeyChanged, SecretUnavailable, SSHAuthFailed, SSHError
from vastmgr.remote.models import RemoteMachine, Secret

log = logging.getLogger(__name__)

# A connection that hears nothing for (COUNT_MAX + 1) * INTERVAL = 20 s is dropped and made
# again: a host that stopped answering without closing (a half-open connection, a blackholed
# link) is found in 20 s instead of a minute, while a link that flaps for 10 s (its TCP
# retransmissions resume a few seconds after it is back) keeps its connection and costs no login
# (tests/vastmgr/remote/test_netfaults.py measures both).
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT_MAX = 3
CONNECT_TIMEOUT_S = 15
# On first contact ask for the ED25519 key first: it is the fingerprint `ssh` shows users.
HOST_KEY_PREFERENCE = ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                       "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]


@dataclass(frozen=True)
class SSHTarget:
    machine_id: int
    name: str
    host: str
    port: int
    username: str
    client_key: asyncssh.SSHKey
    pinned_key: str

    @property
    def address(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"


def fingerprint(openssh_public_key: str) -> str:
    return asyncssh.import_public_key(openssh_public_key).get_fingerprint()


def load_target(machine: Machine) -> SSHTarget:
    """Everything needed to connect, read from the database (sync: call it off the event loop)."""
    if not machine.host:
        raise SSHError(f"{machine.name}: no SSH host is set")
    remote = RemoteMachine.for_machine(machine)
    try:
        if remote.key_file:
            key = asyncssh.read_private_key(Path(remote.key_file).expanduser())
        else:
            key = asyncssh.import_private_key(Secret.reveal(remote.ssh_key_secret_name))
    except SecretUnavailable as exc:
        raise SSHError(f"{machine.name}: no usable SSH private key ({exc})") from None
    except (OSError, asyncssh.KeyImportError) as exc:
        # The message of a key import error names the problem, never the key bytes.
        raise SSHError(f"{machine.name}: the SSH private key cannot be loaded: {exc}") from None
    return SSHTarget(machine.pk, machine.name, machine.host, machine.ssh_port, machine.ssh_user,
                     key, machine.ssh_host_key.strip())


def _pin(machine_id: int, public_key: str) -> None:
    machine = Machine.objects.get(pk=machine_id)
    if machine.ssh_host_key.strip():
        return
    machine.ssh_host_key = public_key
    machine.save(update_fields=["ssh_host_key", "updated"])
    Event.record("ssh", f"{machine.name}: host key pinned on first contact "
                        f"({fingerprint(public_key)})", machine=machine)


def _record_failure(machine_id: int, message: str, kind: str) -> None:
    """One Event per outage, however many processes (controller, dashboard, automation) find
    the host down: the first to write the message into last_error records it."""
    machine = Machine.objects.filter(pk=machine_id).first()
    if machine is None:
        return
    first = RemoteMachine.objects.filter(machine=machine).exclude(
        last_error__startswith=message).update(last_error=message)
    if first or not RemoteMachine.objects.filter(machine=machine).exists():
        Event.record(kind, message, machine=machine, level=Event.Level.ERROR)


def _record_next_attempt(machine_id: int, message: str) -> None:
    RemoteMachine.objects.filter(machine_id=machine_id).update(last_error=message)


def _record_recovery(machine_id: int, attempts: int, seconds: float) -> None:
    """One Event when the host is back: by the first process to clear last_error."""
    machine = Machine.objects.filter(pk=machine_id).first()
    if machine is None:
        return
    if RemoteMachine.objects.filter(machine=machine).exclude(last_error="").update(last_error=""):
        Event.record("ssh", f"{machine.name}: SSH connection back after {attempts} failed "
                            f"attempt(s) over {seconds:.0f} s", machine=machine,
                     data={"attempts": attempts, "seconds": round(seconds, 1),
                           Event.RECOVERS: True})


async def _presented_key(target: SSHTarget) -> str:
    key = await asyncio.wait_for(
        asyncssh.get_server_host_key(target.host, target.port, config=None), CONNECT_TIMEOUT_S)
    return key.export_public_key().decode().strip() if key else ""


async def open_connection(target: SSHTarget, *, refused_message: str = ""
                          ) -> asyncssh.SSHClientConnection:
    """Connect once; pin the host key if none is pinned; refuse a key that differs from the pin.
    Failures are raised, not recorded: MachineLink records one Event per outage.

    Naming the key a host presents instead of the pinned one costs a second connection; a link
    that already did gives its message as `refused_message`, so a retry is one connection."""
    # No known_hosts: the first key is pinned below. A pin is the only key accepted.
    known_hosts: tuple[list[asyncssh.SSHKey], list[Any], list[Any]] | None = None
    key_algs: Sequence[str] = HOST_KEY_PREFERENCE
    if target.pinned_key:
        try:
            pinned = asyncssh.import_public_key(target.pinned_key)
        except asyncssh.KeyImportError:
            raise HostKeyChanged(f"{target.name}: the pinned host key is unreadable; clear it "
                                 "and reconnect to pin again") from None
        known_hosts, key_algs = ([pinned], [], []), ()
    try:
        conn = await asyncio.wait_for(asyncssh.connect(
            target.host, target.port, username=target.username, client_keys=[target.client_key],
            known_hosts=known_hosts, server_host_key_algs=key_algs, agent_path=None, config=None, preferred_auth="publickey",
            keepalive_interval=KEEPALIVE_INTERVAL_S, keepalive_count_max=KEEPALIVE_COUNT_MAX,
        ), CONNECT_TIMEOUT_S)
    except asyncssh.HostKeyNotVerifiable:
        if refused_message:
            raise HostKeyChanged(refused_message) from None
        try:
            presented = fingerprint(await _presented_key(target))
        except (TimeoutError, OSError, asyncssh.Error):
            presented = "unknown"
        message = (f"{target.name}: host key changed at {target.address}: pinned "
                   f"{fingerprint(target.pinned_key)}, presented {presented}. Connection "
                   "refused; clear the pinned key only if the host was really reinstalled")
        raise HostKeyChanged(message) from None
    except asyncssh.PermissionDenied:
        message = f"{target.name}: SSH authentication failed for {target.address} (key rejected)"
        raise SSHAuthFailed(message) from None
    except (TimeoutError, OSError, asyncssh.Error) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or \
            type(exc).__name__
        message = f"{target.name}: cannot connect to {target.address}: {reason}"
        raise SSHError(message) from None
    if not target.pinned_key:
        host_key = conn.get_server_host_key()
        assert host_key is not None, "only GSS key exchange has no host key; it is never offered"
        await sync_to_async(_pin)(target.machine_id, host_key.export_public_key().decode().strip())
    return conn


@dataclass
class Backoff:
    """How a link retries a host that keeps failing: exponential, with jitter, so many hosts that
    fail together retry apart.

    `attempts` connects are tried within one call (a page's second try after a short wait).
    Once a call has failed them all, the link waits before it tries the host again, whoever
    asks: the n-th wait in a row is drawn from [d/2, d] with d = initial_s * factor**(n-1),
    capped at maximum_s. With the defaults a host that stays down is tried at about 0, 2, 6,
    14, 30, 62, 126, 254, 510 s...: 9 logins or connects in its first 10 minutes, one every
    5 minutes after that.
    """

    initial_s: float = 2.0
    maximum_s: float = 300.0
    factor: float = 2.0
    attempts: int = 1

    @classmethod
    def from_env(cls) -> "Backoff":
        """The defaults, or VASTMGR_SSH_RETRY_MIN_S / VASTMGR_SSH_RETRY_MAX_S (the first and
        the longest wait, in seconds)."""
        try:
            initial = float(os.environ.get("VASTMGR_SSH_RETRY_MIN_S", cls.initial_s))
            maximum = float(os.environ.get("VASTMGR_SSH_RETRY_MAX_S", cls.maximum_s))
        except ValueError as exc:
            raise ImproperlyConfigured(f"VASTMGR_SSH_RETRY_MIN_S/MAX_S: {exc}") from None
        if not 0 < initial <= maximum:
            raise ImproperlyConfigured("VASTMGR_SSH_RETRY_MIN_S must be > 0 and at most "
                                       "VASTMGR_SSH_RETRY_MAX_S")
        return cls(initial_s=initial, maximum_s=maximum)

    def delays(self):
        """The waits between the attempts of one call."""
        for n in range(1, self.attempts):
            yield self.wait(n)

    def wait(self, failures: int) -> float:
        """The wait after `failures` failed calls in a row (>= 1)."""
        delay = min(self.initial_s * self.factor ** (failures - 1), self.maximum_s)
        return random.uniform(delay / 2, delay)


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class MachineLink:
    """The one SSH connection to one machine: reconnects with backoff, carries tunnels and commands.

    Every user of the link (the controller's tunnel and its retries, pages, actions) shares the
    connection, and with it the backoff: after a failed call, calls until the next attempt time
    fail at once with the last error and that time, without touching the host. An operator's
    explicit action may ask for an attempt now (`retry_now`).

    An outage is one error Event (its first failure, or a different failure later) and one
    Event when the connection is back, with the number of failed attempts; the machine's
    last_error is cleared then.
    """

    def __init__(self, machine_id: int, *, backoff: Backoff | None = None,
                 sleep: Callable[[float], Awaitable] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.machine_id = machine_id
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self._clock = clock
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._tunnels: dict[int | str, asyncssh.SSHListener] = {}  # remote port or socket path
        # (since, attempts, last message, whether it was a changed host key)
        self._outage: tuple[float, int, str, bool] | None = None
        self.failed_calls = 0  # calls in a row that found the host unreachable
        self.next_attempt: float | None = None  # on self._clock; None: try at once
        self.attempts = 0  # connects tried since the link was made (logins, when they work)

    async def _target(self) -> SSHTarget:
        machine = await Machine.objects.aget(pk=self.machine_id)
        return await sync_to_async(load_target)(machine)

    def retry_now(self) -> None:
        """The next call connects at once, whatever the backoff said (an operator pressed a
        button for this host)."""
        self.next_attempt = None

    def unreachable_reason(self) -> str | None:
        """Why the machine cannot be reached now (the last connect failure) while no
        connection is open; None when connected or never tried."""
        if self._conn is not None and not self._conn.is_closed():
            return None
        return self._outage[2] if self._outage else None

    def waiting(self) -> float:
        """Seconds until the next attempt; 0 when a call may connect now."""
        if self.next_attempt is None:
            return 0.0
        return max(0.0, self.next_attempt - self._clock())

    async def connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._tunnels.clear()
            if wait := self.waiting():
                raise self._backing_off(wait)
            delays = self.backoff.delays()
            while True:
                self.attempts += 1
                refused = self._outage[2] if self._outage and self._outage[3] else ""
                try:
                    self._conn = await open_connection(await self._target(),
                                                       refused_message=refused)
                except SSHError as exc:
                    await self._failed(exc)
                    delay = next(delays, None)
                    # A refused key or a changed host key is not fixed by trying again now.
                    if delay is None or isinstance(exc, HostKeyChanged | SSHAuthFailed):
                        self.failed_calls += 1
                        wait = self.backoff.wait(self.failed_calls)
                        self.next_attempt = self._clock() + wait
                        await sync_to_async(_record_next_attempt)(
                            self.machine_id, self._with_next_attempt(str(exc), wait))
                        raise
                    await self._sleep(delay)
                    continue
                self.failed_calls, self.next_attempt = 0, None
                if self._outage is not None:
                    since, attempts, _, _ = self._outage
                    self._outage = None
                    await sync_to_async(_record_recovery)(self.machine_id, attempts,
                                                          time.monotonic() - since)
                return self._conn

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """The connection, for one operation. A connection that drops during it (keepalives
        unanswered, a reset) raises SSHError, as one that cannot be opened does, so every
        caller (a page, an action, the tunnel) handles one error; the next call connects
        again."""
        conn = await self.connection()
        try:
            yield conn
        except (asyncssh.ChannelOpenError, asyncssh.DisconnectError) as exc:
            if not conn.is_closed():
                raise  # the host refused this channel: the connection itself is fine
            raise SSHError(f"SSH connection lost: {exc.reason}") from None

    def _backing_off(self, wait: float) -> SSHError:
        return SSHError(self._with_next_attempt(self._outage[2] if self._outage else
                                                "unreachable", wait))

    @staticmethod
    def _with_next_attempt(message: str, wait: float) -> str:
        at = datetime.now(UTC) + timedelta(seconds=wait)
        return f"{message}; next attempt at {at:%H:%M:%S} UTC"

    async def _failed(self, exc: SSHError) -> None:
        message = str(exc)
        since, attempts, last, _ = self._outage or (time.monotonic(), 0, "", False)
        self._outage = (since, attempts + 1, message, isinstance(exc, HostKeyChanged))
        if message != last:
            kind = "ssh_host_key" if isinstance(exc, HostKeyChanged) else "ssh"
            await sync_to_async(_record_failure)(self.machine_id, message, kind)

    async def tunnel(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """A local port on 127.0.0.1 that reaches remote_host:remote_port as the machine sees
        it (its own loopback unless told otherwise)."""
        key = remote_port if remote_host == "127.0.0.1" else f"{remote_host}:{remote_port}"
        async with self._connected() as conn:
            listener = self._tunnels.get(key)
            if listener is None:
                listener = await conn.forward_local_port("127.0.0.1", 0, remote_host,
                                                         remote_port)
                self._tunnels[key] = listener
        return listener.get_port()

    async def tunnel_to_path(self, remote_path: str) -> int:
        """A local port on 127.0.0.1 that reaches the unix socket `remote_path` on the machine
        (Curio's cuzk daemon listens on unix:///run/curio/cuzk.sock by default)."""
        async with self._connected() as conn:
            listener = self._tunnels.get(remote_path)
            if listener is None:
                listener = await conn.forward_local_port_to_path("127.0.0.1", 0, remote_path)
                self._tunnels[remote_path] = listener
        return listener.get_port()

    async def can_forward(self, remote_port: int) -> bool:
        """False when the server refuses TCP forwarding (AllowTcpForwarding no); a closed
        port on the host is fine: it only means no engine listens yet."""
        async with self._connected() as conn:
            try:
                _reader, writer = await conn.open_connection("127.0.0.1", remote_port)
            except asyncssh.ChannelOpenError as exc:
                if conn.is_closed():
                    raise
                return exc.code != asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
        writer.close()
        return True

    async def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        try:
            async with self._connected() as conn:
                result = await conn.run(command, check=False, timeout=timeout)
        except asyncssh.TimeoutError as exc:
            return CommandResult(command, 124, str(exc.stdout or ""),
                                 f"timed out after {timeout} s")
        status = result.exit_status if result.exit_status is not None else 255
        return CommandResult(command, status, str(result.stdout or ""), str(result.stderr or ""))

    async def stream(self, command: str, on_line: Callable[[str, str], Awaitable[None]], *,
                     timeout: float | None = None) -> int:
        """Run `command`, calling on_line(stream_name, line) as output arrives; return its status."""
        async with self._connected() as conn, \
                conn.create_process(command, stderr=asyncssh.STDOUT) as process:
            async def pump() -> int | None:
                while line := await process.stdout.readline():
                    await on_line("stdout", line.rstrip("\n"))
                return (await process.wait()).exit_status
            try:
                status = await asyncio.wait_for(pump(), timeout)
            except TimeoutError:
                process.terminate()
                await on_line("stderr", f"timed out after {timeout} s")
                return 124
        return status if status is not None else 255

    async def sftp(self) -> asyncssh.SFTPClient:
        async with self._connected() as conn:
            return await conn.start_sftp_client()

    async def close(self) -> None:
        async with self._lock:
            for listener in self._tunnels.values():
                listener.close()
            self._tunnels.clear()
            if self._conn is not None:
                self._conn.close()
                await self._conn.wait_closed()
                self._conn = None


class LinkPool:
    """One MachineLink per machine id, shared by the controller, provisioning and commands."""

    def __init__(self, **link_options):
        self._links: dict[int, MachineLink] = {}
        self._options = link_options

    def get(self, machine_id: int) -> MachineLink:
        link = self._links.get(machine_id)
        if link is None:
            link = self._links[machine_id] = MachineLink(machine_id, **self._options)
        return link

    async def drop(self, machine_id: int) -> None:
        link = self._links.pop(machine_id, None)
        if link is not None:
            await link.close()

    async def close(self) -> None:
        for machine_id in list(self._links):
            await self.drop(machine_id)
