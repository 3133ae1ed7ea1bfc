"""`manage.py machines add|list|remove`: register machines the controller reaches directly, for
scripting (e.g. a fleet of Curio cuzk daemons on a LAN).

`add` takes the engine's URL: `http://host:port` (our engine, or an upstream daemon's status
server), or, for a Curio cuzk daemon (`--flavour cuzk-upstream`), its gRPC address
`grpc://host:port` or `unix:///path/to/cuzk.sock` (with `--status-url http://host:port` when its
status server is on). Hosts must be loopback or a private network: neither the gRPC API nor the
status server has auth, so they must not be reached across the Internet; remote hosts are added
as SSH hosts from the dashboard and reached through a tunnel. The machine starts as `running`:
its daemon is already there, nothing is provisioned.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.fleet.transport import UNIX_SCHEME, DaemonAddress
from vastmgr.front.readmodel import load_machines
from vastmgr.proofs.models import ProofJob

DEFAULT_PORT = Machine._meta.get_field("engine_port").default
DIRECT = (Machine.Provider.LOCAL,)


def parse_engine_url(url: str) -> tuple[str, int]:
    """(host, port) of `http://host[:port][/]`, or CommandError saying what is wrong."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise CommandError(f"bad --engine-url {url!r}: {exc}") from None
    if parts.scheme != "http":
        raise CommandError(f"bad --engine-url {url!r}: it must start with http:// (engines and "
                           "upstream status servers speak plain HTTP)")
    if not parts.hostname:
        raise CommandError(f"bad --engine-url {url!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise CommandError(f"bad --engine-url {url!r}: give only http://host:port (the status "
                           "path is known)")
    if port == 0:
        raise CommandError(f"bad --engine-url {url!r}: port 0")
    host = parts.hostname
    if not _reachable_directly(host):
        raise CommandError(f"bad --engine-url {url!r}: {host} is not a loopback or private "
                           "address; add a remote host as an SSH host on the dashboard, so its "
                           "engine is reached through a tunnel and never exposed")
    return host, port or DEFAULT_PORT


def parse_daemon_url(url: str) -> DaemonAddress:
    """A cuzk daemon's gRPC address, or CommandError saying what is wrong."""
    try:
        address = DaemonAddress.parse(url)
    except ValueError as exc:
        raise CommandError(f"bad --engine-url {exc}") from None
    if address.scheme != UNIX_SCHEME and not _reachable_directly(address.host):
        raise CommandError(f"bad --engine-url {url!r}: {address.host} is not a loopback or "
                           "private address; add a remote host as an SSH host on the dashboard, "
                           "so its daemon is reached through a tunnel and never exposed")
    return address


def _reachable_directly(host: str) -> bool:
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise CommandError(f"bad --engine-url: cannot resolve {host!r} ({exc.strerror})") from None
    return all(_private(address) for address in addresses)


def _private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.is_loopback or ip.is_private or ip.is_link_local


def endpoint(machine: Machine) -> str:
    if machine.speaks_grpc:
        where = "" if machine.provider in DIRECT else f"{machine.provider} tunnel to "
        status = (f" + status :{machine.engine_port}" if machine.status_server
                  else " (status server off)")
        return f"{where}{machine.engine_url}{status}"
    if machine.provider not in DIRECT:
        return f"{machine.provider} tunnel to {machine.host or '?'}:{machine.engine_port}"
    host = f"[{machine.host}]" if ":" in machine.host else machine.host
    return f"http://{host}:{machine.engine_port}"


class Command(BaseCommand):
    help = "Add, list or remove machines the fleet controller watches."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="register a machine reached directly by URL")
        add.add_argument("--name", required=True)
        add.add_argument("--engine-url", required=True,
                         help="http://host:port of the engine or upstream status server; for "
                              "cuzk-upstream also grpc://host:port or unix:///path/cuzk.sock")
        add.add_argument("--status-url", default="",
                         help="with a gRPC --engine-url: http://host:port of the daemon's status "
                              "server, when status_listen is set (off by default)")
        add.add_argument("--flavour", choices=Machine.Flavour.values,
                         default=Machine.Flavour.CUZK_ENGINE)
        add.add_argument("--token", default="", help="bearer token of our engine's API")
        sub.add_parser("list", help="every machine that is not killed")
        remove = sub.add_parser("remove", help="forget a machine added here")
        remove.add_argument("name")

    def handle(self, *args, action, **options):
        getattr(self, f"handle_{action}")(**options)

    def handle_add(self, *, name, engine_url, flavour, token, status_url, **options):
        name = name.strip()
        if not name or len(name) > Machine.NAME_MAX_LENGTH:
            raise CommandError(f"--name must be 1 to {Machine.NAME_MAX_LENGTH} characters")
        grpc_url = ""
        if engine_url.strip().startswith(("grpc:", "unix:")):
            if flavour != Machine.Flavour.CUZK_UPSTREAM:
                raise CommandError("a grpc:// or unix:// --engine-url is a Curio cuzk daemon's: "
                                   "add it with --flavour cuzk-upstream")
            address = parse_daemon_url(engine_url)
            grpc_url = address.url
            host, port = (parse_engine_url(status_url) if status_url
                          else (address.host or "127.0.0.1", 0))
        elif status_url:
            raise CommandError("--status-url goes with a grpc:// or unix:// --engine-url")
        else:
            host, port = parse_engine_url(engine_url)
        with transaction.atomic():
            if Machine.objects.filter(name=name).exists():
                raise CommandError(f"a machine named {name!r} already exists "
                                   "(`machines remove` it first, or pick another name)")
            machine = Machine.objects.create(name=name, provider=Machine.Provider.LOCAL,
                                             host=host, engine_port=port, engine_token=token,
                                             engine_flavour=flavour, engine_url=grpc_url)
            Event.record("lifecycle", f"{name}: added by the machines command ({flavour} at "
                                      f"{endpoint(machine)})", machine=machine)
            machine.transition(Machine.State.RUNNING, reason="its daemon is already running")
        self.stdout.write(f"added {name}: {flavour} at {endpoint(machine)}")

    def handle_list(self, **options):
        hosts = load_machines(timezone.now().timestamp())
        rows = [("name", "flavour", "engine", "state", "connection", "last seen")]
        for h in hosts:
            m = h.machine
            rows.append((m.name, m.engine_flavour, endpoint(m),
                         m.state + ("" if m.enabled else " (disabled)"), h.connection,
                         "never" if h.seen_ago is None else f"{h.seen_ago} s ago"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())

    def handle_remove(self, *, name, **options):
        machine = Machine.objects.filter(name=name).first()
        if machine is None:
            raise CommandError(f"no machine named {name!r}")
        if machine.provider not in DIRECT:
            raise CommandError(f"{name} is a {machine.provider} machine: destroy it from its "
                               "machine page, which stops its engine and ends billing")
        in_flight = ProofJob.objects.in_flight().filter(machine=machine).count()
        if in_flight:
            raise CommandError(f"{name} has {in_flight} proof(s) in flight; wait for them or "
                               "cancel them first")
        with transaction.atomic():
            Event.record("lifecycle", f"{name}: removed by the machines command "
                                      f"({machine.engine_flavour} at {endpoint(machine)})")
            machine.delete()
        self.stdout.write(f"removed {name}")
