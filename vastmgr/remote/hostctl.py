"""Start, stop and inspect the engine on a remote host; run there by the host's Python.

The dashboard sends this file's source over SSH (`python -c SOURCE ...`), so it works before
and after any install and whatever the login shell is. Standard library only, Python >= 3.8.
Every sub-command prints one JSON object on stdout and exits 0 when it did what it says.

start:  refuses while anything listens on the engine port; starts the engine in its own session
        (so its process group holds the engine and its synthesis pool), stdio on the log file,
        and returns at once with the engine's own pid, which it also writes to engine.pid.
stop:   SIGTERM to the engine alone (it drains: running proofs finish and its pool shuts down
        cleanly), waits up to --grace seconds, then SIGTERM and SIGKILL to whatever is left of
        its process group; reports stopped only when no process of the group is left and the
        port is free.
status: whether the engine of engine.pid is alive and whether the port is in use.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def port_in_use(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: sockets in TIME_WAIT do not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def group_members(pgid):
    """Live (not zombie) processes of process group `pgid`, as 'pid command' strings."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            members.append(f"{entry} {command[:120]}")
    return members


def leader_alive(pid):
    return any(member.split()[0] == str(pid) for member in group_members(pid))


def read_pid(pid_file):
    try:
        with open(pid_file) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def start(args):
    if port_in_use(args.port):
        return {"started": False, "error": f"port {args.port} is still in use on the host"}
    env = dict(os.environ, CUZK_INSTANCE_ID=args.instance)
    with open(os.path.join(args.base, "engine.log"), "ab") as log, \
            open(os.devnull, "rb") as devnull:
        engine = subprocess.Popen(
            [os.path.join(args.base, "venv", "bin", "python"), "-m", "cuzk_engine", "serve",
             "--config", os.path.join(args.base, "engine.toml")],
            cwd=args.base, env=env, stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
    with open(args.pid_file + ".tmp", "w") as handle:
        handle.write(f"{engine.pid}\n")
    os.replace(args.pid_file + ".tmp", args.pid_file)
    return {"started": True, "pid": engine.pid}


def stop(args):
    pid = read_pid(args.pid_file)
    escalated = False
    if pid is not None:
        def members():
            return group_members(pid)

        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if not wait_until(lambda: not leader_alive(pid), args.grace):
            escalated = True
        if members():
            # The drain is over (or took too long): nothing of this engine may outlive it.
            signal_group(pid, signal.SIGTERM)
            if not wait_until(lambda: not members(), 3):
                escalated = True
                signal_group(pid, signal.SIGKILL)
                wait_until(lambda: not members(), 5)
        remaining = members()
    else:
        remaining = []
    port_busy = not wait_until(lambda: not port_in_use(args.port), 5)
    stopped = not remaining and not port_busy
    if stopped and pid is not None:
        os.unlink(args.pid_file)
    return {"stopped": stopped, "pid": pid, "escalated": escalated, "remaining": remaining,
            "port_in_use": port_busy}


def status(args):
    pid = read_pid(args.pid_file)
    return {"pid": pid, "alive": pid is not None and leader_alive(pid), "port_in_use": port_in_use(args.port)}


def main(argv):
    parser = argparse.ArgumentParser(prog="hostctl")
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--base", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--instance", default="")
    parser.add_argument("--grace", type=float, default=60.0)
    args = parser.parse_args(argv)
    args.pid_file = os.path.join(args.base, "engine.pid")
    result = {"start": start, "stop": stop, "status": status}[args.command](args)
    print(json.dumps(result))
    return 0 if result.get("started", result.get("stopped", True)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
