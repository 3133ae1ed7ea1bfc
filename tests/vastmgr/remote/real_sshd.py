"""The real OpenSSH server on loopback, for a throwaway Unix user whose login shell is bash.

It is what a rented host runs: /usr/sbin/sshd from Debian's openssh-server, its own ED25519 and
RSA host keys, key-only authentication, TCP forwarding allowed. The user is created for the
test (we run as root in CI) and removed afterwards with every process it still has.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import eventually
from vastmgr.remote.provision import copy_wheel_sources

SSHD = Path("/usr/sbin/sshd")
REPO_ROOT = Path(__file__).resolve().parents[3]


def _others_can_reach(path: Path) -> bool:
    """Whether another user can traverse to `path` (every parent directory is o+x)."""
    return all(parent.stat().st_mode & 0o001 for parent in path.resolve().parents)


def host_python() -> str | None:
    """A Python of this interpreter's version that the throwaway user can run (the engine's
    compiled dependencies are linked from ours, so the minor version must match)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(f"/usr/bin/python{version}"),
                      Path(getattr(sys, "_base_executable", sys.executable)).resolve()):
        if candidate.exists() and _others_can_reach(candidate) and \
                candidate.stat().st_mode & 0o001:
            return str(candidate)
    return None


def unavailable_reason() -> str:
    """Why the real-sshd tests cannot run here, or '' when they can."""
    if host_python() is None:
        return (f"no Python {sys.version_info.major}.{sys.version_info.minor} that another "
                "user can run (Debian: apt-get install python3 python3-venv)")
    if not SSHD.exists():
        return f"{SSHD} is missing (Debian: apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "needs root to create the throwaway host user (useradd) and run sshd"
    if not shutil.which("useradd") or not shutil.which("ssh-keygen"):
        return "useradd or ssh-keygen is missing"
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def engine_site_packages(into: Path) -> Path:
    """A site-packages holding only the engine's dependencies (pyproject's base
    `dependencies` and what they require), linked from this interpreter's: the host has no
    network, and an engine that imports anything else fails here as on a lean GPU host."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    pending = [Requirement(line).name for line in project["dependencies"]]
    seen: set[str] = set()
    into.mkdir(parents=True, exist_ok=True)
    while pending:
        name = pending.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
        root = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, target = root / top, into / top
            if not source.exists() or target.exists() or top in {"..", "__pycache__"} \
                    or top.endswith(".pth"):
                continue
            if _others_can_reach(source):
                target.symlink_to(source)
            elif source.is_dir():  # a venv under /root, say: the host user needs a copy
                shutil.copytree(source, target)
            else:
                shutil.copy(source, target)
    return into


def copy_sources(into: Path) -> Path:
    """A copy of what goes into the project's wheel, to edit as a new release would."""
    into.mkdir(parents=True, exist_ok=True)
    copy_wheel_sources(REPO_ROOT, into)
    return into


@dataclass
class RealSSHD:
    root: Path
    client_public_key: str
    user: str = field(default_factory=lambda: f"vmt{secrets.token_hex(3)}")
    port: int = 0
    process: subprocess.Popen | None = None
    config: dict = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid

    def host_public_key(self, kind: str = "ed25519") -> str:
        """In OpenSSH's one-line form without the comment."""
        return " ".join((self.root / f"ssh_host_{kind}_key.pub").read_text().split()[:2])

    def create_user(self) -> None:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", self.user],
                       check=True)
        # A '!' password means "locked" to sshd without PAM; '*' is "no password" only.
        subprocess.run(["usermod", "-p", "*", self.user], check=True)
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text(self.client_public_key + "\n")
        (ssh_dir / "authorized_keys").chmod(0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, self.uid, self.uid)

    def new_host_keys(self) -> None:
        for kind, extra in (("ed25519", []), ("rsa", ["-b", "2048"])):
            key = self.root / f"ssh_host_{kind}_key"
            key.unlink(missing_ok=True)
            Path(f"{key}.pub").unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-f", str(key)],
                           check=True)

    def write_config(self, *, allow_tcp_forwarding: bool = True, env: dict | None = None) -> Path:
        config = self.root / "sshd_config"
        lines = [
            f"Port {self.port}", "ListenAddress 127.0.0.1",
            f"HostKey {self.root}/ssh_host_ed25519_key", f"HostKey {self.root}/ssh_host_rsa_key",
            f"PidFile {self.root}/sshd.pid", "AuthorizedKeysFile .ssh/authorized_keys",
            "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin no", "UsePAM no",
            f"AllowUsers {self.user}",
            f"AllowTcpForwarding {'yes' if allow_tcp_forwarding else 'no'}",
            "Subsystem sftp internal-sftp", "MaxStartups 50:30:100", "LogLevel VERBOSE",
        ]
        if env:
            lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()))
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self, **config) -> None:
        """Start sshd (again, on the same port, with the config of the first start unless
        another is given)."""
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
        self.port = self.port or _free_port()
        self.config = config or self.config
        path = self.write_config(**self.config)
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - sshd writes it until stop()
        self.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(path)],
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on {self.port}: {self.log()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def user_processes(self) -> list[str]:
        """The user's live processes (zombies excluded), as 'pid command'."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid != self.uid:
                    continue
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state in {"Z", "X"}:
                    continue
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                found.append(f"{entry} {command.decode(errors='replace')[:150]}")
        return found

    def drop_sessions(self) -> None:
        """Cut every SSH connection of the user, as a network outage would."""
        for process in self.user_processes():
            if process.split(" ", 1)[1].startswith("sshd:"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(process.split()[0]), signal.SIGKILL)

    def kill_processes(self) -> None:
        """Every process of the user killed, as a host that stops does."""
        def none_left() -> bool:
            # A process may start another between the listing and the kill: kill until none is.
            for process in self.user_processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(process.split()[0]), signal.SIGKILL)
            return not self.user_processes()

        eventually(none_left, 10, f"every process of {self.user} killed", every=0.05)

    def remove_user(self) -> None:
        self.kill_processes()
        subprocess.run(["userdel", "--remove", self.user], check=False,
                       stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def real_sshd(client_public_key: str, **config):
    root = Path(tempfile.mkdtemp(prefix="vastmgr-sshd-"))
    root.chmod(0o755)
    server = RealSSHD(root, client_public_key)
    server.create_user()
    try:
        server.new_host_keys()
        lean = engine_site_packages(root / "engine-site-packages")
        server.start(env={"PYTHONPATH": str(lean), **config.pop("env", {})}, **config)
        yield server
    finally:
        server.stop()
        server.remove_user()
        shutil.rmtree(root, ignore_errors=True)

