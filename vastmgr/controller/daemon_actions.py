"""What the controller asks of an upstream cuzk daemon through its gRPC API, beyond watching it:
SRS preload and evict (operator actions), and benchmark proofs.

Upstream answers some calls without doing anything (`EvictSRS`, `CancelProof`: "not yet
implemented" in service.rs); those answers are recorded as given, with what they mean.
"""

from __future__ import annotations

from vastmgr.fleet.models import MachineAction
from vastmgr.lib.errors import TransportError
from vastmgr.remote.cuzk_grpc.client import CuzkClient

# Loading a 32 GiB SRS from disk takes minutes; the call blocks until it is loaded.
PRELOAD_TIMEOUT_S = 900.0


async def srs_action(daemon: CuzkClient, action: str, circuit_id: str) -> tuple[str, str]:
    """(what happened, error): one of them is empty."""
    try:
        if action == MachineAction.Action.PRELOAD:
            loaded = await daemon.preload_srs(circuit_id, timeout=PRELOAD_TIMEOUT_S)
            if loaded.already_loaded:
                return "already loaded (PreloadSRS)", ""
            return f"preloaded in {loaded.load_time_ms / 1000:.1f} s (PreloadSRS)", ""
        evicted = await daemon.evict_srs(circuit_id)
    except TransportError as exc:
        return "", str(exc)
    if not evicted.was_loaded and not evicted.freed_bytes:
        return "", ("the daemon answered was_loaded=false, freed 0 bytes: EvictSRS is not "
                    "implemented upstream, so nothing was evicted (restart the daemon to free it)")
    return f"evicted, {evicted.freed_bytes} bytes freed (EvictSRS)", ""
