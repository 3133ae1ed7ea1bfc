"""Recovery times of `manage.py up` under each fault, on an idle stack (own ports and data dir).

    PYTHONPATH=. python scripts/fault_recovery.py [--json]

Prints JSON, then a table: for each fault, the seconds until the stack serves again (what
"serves" means is in the table), plus how long an idle Ctrl-C takes and how soon nothing is left
after kill -9 of `up`. Uses the fault suite's stack harness.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import eventually
from tests.vastmgr.served.test_faults import Stack

TIMEOUT = 120


def dashboard_answers(stack: Stack) -> bool:
    try:
        with urllib.request.urlopen(stack.url + "/accounts/login/", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def host_written_since(stack: Stack, since: datetime, new_engine: bool = False) -> bool:
    """The controller wrote the local host's live status after `since` (it is watching), from
    an engine started after `since` when `new_engine`."""
    rows = stack.query("SELECT s.updated, s.snapshot FROM fleet_machinestatus s JOIN fleet_machine m"
                       " ON m.id = s.machine_id WHERE m.name = 'local' AND s.connected")
    if not rows:
        return False
    updated = datetime.fromisoformat(rows[0][0]).replace(tzinfo=UTC)
    snapshot = json.loads(rows[0][1] or "{}")
    fresh = (not new_engine
             or snapshot.get("uptime_secs", 1e9) < (datetime.now(UTC) - since).total_seconds())
    return updated > since and snapshot.get("accepting") is True and fresh


def measure(stack: Stack, fault: str, serves: str, inject, recovered) -> dict:
    eventually(stack.live, TIMEOUT, "the stack is not live")
    since = datetime.now(UTC)
    started = time.monotonic()
    inject()
    eventually(lambda: recovered(since), TIMEOUT, f"{fault}: no recovery", every=0.05)
    return {"fault": fault, "serves_again": serves,
            "seconds": round(time.monotonic() - started, 2)}


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="fault-recovery-"))
    cache = root / "params"
    cache.mkdir()
    stack = Stack(root, cache)
    started = time.monotonic()
    stack.start()
    results = [{"fault": "cold start of up", "serves_again": "dashboard + engine live",
                "seconds": round(time.monotonic() - started, 2)}]

    def kill(child: str, signum=signal.SIGKILL):
        return lambda: os.kill(stack.children()[child], signum)

    results.append(measure(stack, "kill -9 dashboard", "login page answers",
                           kill("dashboard"), lambda since: dashboard_answers(stack)))
    results.append(measure(stack, "kill -9 controller", "host status written again",
                           kill("controller"), lambda since: host_written_since(stack, since)))
    old = {}

    def kill_automation():
        old["automation"] = stack.children()["automation"]
        kill("automation")()

    results.append(measure(stack, "kill -9 automation", "process running again",
                           kill_automation,
                           lambda since: stack.children().get("automation")
                           not in (None, old["automation"])))
    for fault, signum in (("kill -9 engine", signal.SIGKILL), ("SIGTERM engine", signal.SIGTERM)):
        results.append(measure(stack, fault, "engine live and accepting in the controller",
                               kill("engine", signum),
                               lambda since: host_written_since(stack, since, new_engine=True)))
    eventually(stack.live, TIMEOUT, "the stack is not live")
    results.append({"fault": "Ctrl-C of up (idle)", "serves_again": "everything stopped",
                    "seconds": round(stack.ctrl_c(), 2)})
    stack.start()
    eventually(stack.live, TIMEOUT, "the stack is not live")
    started = time.monotonic()
    stack.up.kill()
    eventually(lambda: not stack.leftovers(), TIMEOUT, "processes outlived up", every=0.05)
    results.append({"fault": "kill -9 of up", "serves_again": "no process of the stack left",
                    "seconds": round(time.monotonic() - started, 2)})
    started = time.monotonic()
    stack.start()
    results.append({"fault": "rerun right after kill -9 of up", "serves_again":
                    "dashboard + engine live", "seconds": round(time.monotonic() - started, 2)})
    stack.ctrl_c()
    print(json.dumps({"load_average": os.getloadavg(), "results": results}, indent=2))
    print(f"\n{'fault':34} {'seconds':>8}  until")
    for r in results:
        print(f"{r['fault']:34} {r['seconds']:8.2f}  {r['serves_again']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
