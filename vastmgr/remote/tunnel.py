"""The fleet controller's transport for ssh and vast machines: the engine API through a tunnel.

The engine on a remote host listens on its loopback only; the controller reaches it through a
local port forwarded over the machine's one SSH link, so the engine is never exposed. A machine
with no engine yet (registered, or provisioning before its engine was configured) is not
watched at all: there is nothing to reach, and trying would be a login every retry.
"""

from vastmgr.fleet.models import Machine
from vastmgr.fleet.transport import UNIX_SCHEME, DaemonAddress, EngineEndpoint, EngineTransport
from vastmgr.lib.errors import SSHError, TransportError
from vastmgr.remote.ssh import Backoff, LinkPool

# One pool for the controller process: every transport of a machine shares its SSH link, and
# with it the link's backoff for a host that keeps failing.
shared_pool = LinkPool(backoff=Backoff.from_env())


def has_engine(machine: Machine) -> bool:
    """Whether provisioning has configured an engine there (it writes the token before it
    starts the engine), or the machine runs someone else's (an upstream daemon)."""
    if machine.is_upstream:
        # Added by hand: its address is known. Rented: once Vast has given it one.
        return bool(machine.host)
    return machine.state != Machine.State.REGISTERED and bool(machine.engine_token)


class SSHTunnelTransport(EngineTransport):
    def __init__(self, machine, pool: LinkPool | None = None):
        self.machine_id = machine.pk
        self.pool = pool or shared_pool

    @classmethod
    def for_machine(cls, machine) -> "SSHTunnelTransport":
        if machine.is_upstream and not has_engine(machine):
            raise TransportError("no address yet: its cuzk status is watched once the provider "
                                 "gives it one")
        if not has_engine(machine):
            raise TransportError(f"no engine yet ({machine.state}): not watched until "
                                 "provisioning configures one")
        return cls(machine)

    async def connect(self) -> EngineEndpoint:
        # Read the port and token on every connect: provisioning may rewrite them.
        try:
            machine = await Machine.objects.aget(pk=self.machine_id)
        except Machine.DoesNotExist:
            raise TransportError(f"machine {self.machine_id} no longer exists") from None
        try:
            port = await self.pool.get(self.machine_id).tunnel(machine.engine_port)
        except SSHError as exc:
            raise TransportError(str(exc)) from None
        return EngineEndpoint(f"http://127.0.0.1:{port}", machine.engine_token or None)

    async def grpc_target(self, address: DaemonAddress) -> str:
        """A local port forwarded over the machine's SSH link to the daemon's socket path or
        TCP address on the machine."""
        link = self.pool.get(self.machine_id)
        try:
            if address.scheme == UNIX_SCHEME:
                port = await link.tunnel_to_path(address.path)
            else:
                port = await link.tunnel(address.port, address.host)
        except SSHError as exc:
            raise TransportError(str(exc)) from None
        return f"127.0.0.1:{port}"

    async def close(self) -> None:
        # The watcher stops for good (the machine was killed, disabled or leased elsewhere):
        # its connection goes too. An engine that does not answer is no reason to log in
        # again: the link, its tunnel and its outage record stay while the watcher retries.
        await self.pool.drop(self.machine_id)
