"""An in-process SSH server on 127.0.0.1 that plays a remote host.

Commands run as local shell processes inside the host's root directory, SFTP is confined to
that directory, and local port forwards reach 127.0.0.1 only, like an engine bound to loopback.
"""

import asyncio
import os
from pathlib import Path

import asyncssh


class _Server(asyncssh.SSHServer):
    def __init__(self, host: "FakeHost"):
        self.host = host

    def connection_made(self, conn):
        self.host.connections.append(conn)

    def begin_auth(self, username):
        return True

    def public_key_auth_supported(self):
        return True

    def validate_public_key(self, username, key):
        return key.export_public_key() in self.host.authorized

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        return dest_host in {"127.0.0.1", "localhost"}


class FakeHost:
    def __init__(self, root: Path, authorized_public_key: str, *, env: dict | None = None,
                 host_key: asyncssh.SSHKey | None = None):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_key = host_key or asyncssh.generate_private_key("ssh-ed25519")
        self.authorized: set[bytes] = set()
        self.authorize(authorized_public_key)
        self.env = {**os.environ, "HOME": str(root), **(env or {})}
        self.commands: list[str] = []
        self.connections: list = []
        self.server = None
        self.port = 0

    def authorize(self, public_key: str) -> None:
        self.authorized.add(asyncssh.import_public_key(public_key).export_public_key())

    @property
    def public_host_key(self) -> str:
        return self.host_key.export_public_key().decode().strip()

    async def start(self, port: int = 0) -> int:
        self.server = await asyncssh.create_server(
            lambda: _Server(self), "127.0.0.1", port, server_host_keys=[self.host_key],
            process_factory=self._run,
            sftp_factory=lambda chan: asyncssh.SFTPServer(chan, chroot=str(self.root).encode()),
            allow_scp=False, keepalive_interval=0, encoding=None,
        )
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        for conn in self.connections:
            conn.close()
        self.server.close()
        await self.server.wait_closed()

    def drop_connections(self) -> None:
        for conn in self.connections:
            conn.close()
        self.connections.clear()

    async def _run(self, process: asyncssh.SSHServerProcess) -> None:
        self.commands.append(process.command)
        local = await asyncio.create_subprocess_shell(
            process.command, cwd=self.root, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )

        async def pump(source, sink):
            while chunk := await source.read(65536):
                sink.write(chunk)

        await asyncio.gather(pump(local.stdout, process.stdout),
                             pump(local.stderr, process.stderr))
        process.exit(await local.wait())
