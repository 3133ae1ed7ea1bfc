"""Which actions a machine's state allows, and in words why not: the machine page disables a
button with that reason, and the view refuses a post with it (a stale page, a second tab)."""

from vastmgr.fleet.models import Machine

State = Machine.State

# Action name in the URL → the Provisioner method that does it.
ACTIONS = {"test": "test_connection", "provision": "provision", "stop": "stop",
           "start": "start_engine", "restart": "restart", "upgrade": "upgrade"}
LABELS = {"test": "Test connection", "provision": "Provision", "stop": "Stop engine",
          "start": "Start engine", "restart": "Restart engine", "upgrade": "Upgrade"}
# Actions that run in the background; the others answer the page themselves.
LAUNCHED = ("provision", "stop", "start", "restart", "upgrade")
_BUSY = (State.PROVISIONING, State.PARAMS_READY, State.BENCHMARKED)
_NOT_PROVISIONED = "not provisioned yet: Provision it first"
# A rented instance has no SSH address until Vast assigns one (the automation's next listing).
NO_ADDRESS_YET = "waiting for Vast to give an address (checked once a minute)"
# Action → the states that refuse it, and why; any other state (not busy) allows it.
_REFUSED: dict[str, dict[str, str]] = {
    "test": {}, "provision": {},
    "stop": {State.REGISTERED: _NOT_PROVISIONED, State.STOPPED: "the engine is already stopped"},
    "start": {State.REGISTERED: _NOT_PROVISIONED, State.RUNNING: "the engine is running"},
    "restart": {State.REGISTERED: _NOT_PROVISIONED,
                State.STOPPED: "the engine is stopped: Start it"},
    "upgrade": {State.REGISTERED: _NOT_PROVISIONED},
}


def why_not(machine: Machine, action: str) -> str:
    """Why `action` cannot be done to `machine` now; '' when it can."""
    if action not in _REFUSED:
        return f"unknown action {action!r}"
    if machine.state == State.KILLED:
        return "destroyed"
    if machine.provider == Machine.Provider.LOCAL:
        return "a local engine without SSH"
    if machine.is_upstream and action != "test":
        return "runs Curio's cuzk daemon, which vastmgr only watches"
    if machine.provider == Machine.Provider.VAST and not machine.host:
        return NO_ADDRESS_YET
    if action != "test" and machine.state in _BUSY:
        return "provisioning is in progress"
    return _REFUSED[action].get(machine.state, "")


def offered(machine: Machine) -> list[tuple[str, str, str]]:
    """(action, label, why not or '') for each button of the machine page."""
    return [(action, LABELS[action], why_not(machine, action)) for action in ACTIONS]
