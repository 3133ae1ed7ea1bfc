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


def why_not(machine: Machine, action: str) -> str:
    """Why `action` cannot be done to `machine` now; '' when it can."""
    if machine.state == State.KILLED:
        return "destroyed"
    if machine.provider == Machine.Provider.LOCAL:
        return "a local engine without SSH"
    if machine.is_upstream and action != "test":
        return "runs Curio's cuzk daemon, which vastmgr only watches"
    if action == "test":
        return ""
    if machine.state in _BUSY:
        return "provisioning is in progress"
    never_provisioned = "not provisioned yet: Provision it first"
    if action == "provision":
        return ""
    if action == "stop":
        return {State.REGISTERED: never_provisioned,
                State.STOPPED: "the engine is already stopped"}.get(machine.state, "")
    if action == "start":
        return "" if machine.state == State.STOPPED else {
            State.REGISTERED: never_provisioned}.get(machine.state, "the engine is running")
    if action == "restart":
        return {State.REGISTERED: never_provisioned,
                State.STOPPED: "the engine is stopped: Start it"}.get(machine.state, "")
    if action == "upgrade":
        return never_provisioned if machine.state == State.REGISTERED else ""
    return f"unknown action {action!r}"


def offered(machine: Machine) -> list[tuple[str, str, str]]:
    """(action, label, why not or '') for each button of the machine page."""
    return [(action, LABELS[action], why_not(machine, action)) for action in ACTIONS]
