"""The fleet controller's transport for ssh and vast machines: the engine API through a tunnel.

The engine on a remote host listens on its loopback only; the controller reaches it through a
local port forwarded over the machine's one SSH link, so the engine is never exposed.
"""

from vastmgr.errors import SSHError, TransportError
from vastmgr.fleet.controller.transport import EngineEndpoint, EngineTransport
from vastmgr.fleet.models import Machine

from .ssh import Backoff, LinkPool

# One pool for the controller process: every transport of a machine shares its SSH link. One
# connect attempt per call: the watcher's own backoff paces the retries.
shared_pool = LinkPool(backoff=Backoff(attempts=1))


class SSHTunnelTransport(EngineTransport):
    def __init__(self, machine, pool: LinkPool | None = None):
        self.machine_id = machine.pk
        self.pool = pool or shared_pool

    @classmethod
    def for_machine(cls, machine) -> "SSHTunnelTransport":
        return cls(machine)

    async def connect(self) -> EngineEndpoint:
        # Read the port and token on every connect: the controller starts watching a host as
        # soon as it is added, and provisioning writes the engine's token only later.
        try:
            machine = await Machine.objects.aget(pk=self.machine_id)
        except Machine.DoesNotExist:
            raise TransportError(f"machine {self.machine_id} no longer exists") from None
        try:
            port = await self.pool.get(self.machine_id).tunnel(machine.engine_port)
        except SSHError as exc:
            raise TransportError(str(exc)) from None
        return EngineEndpoint(f"http://127.0.0.1:{port}", machine.engine_token or None)

    async def close(self) -> None:
        # The link stays in the pool: it remembers an outage, so a host that stays down is
        # one Event, not one per retry.
        await self.pool.get(self.machine_id).close()
