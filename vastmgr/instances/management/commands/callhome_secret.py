"""Issue a deployment secret for an instance deployed by hand (rentals get theirs in their
environment): printed once, stored only as a hash."""

from django.core.management.base import BaseCommand, CommandError

from vastmgr.fleet.models import Machine
from vastmgr.instances.models import SECRET_ENV, DeploySecret


class Command(BaseCommand):
    help = "Print a new call-home secret (set it as VASTMGR_CALLHOME_SECRET on the instance)."

    def add_arguments(self, parser):
        parser.add_argument("--machine", help="the machine (by name) the instance will be")
        parser.add_argument("--note", default="", help="what it is for (shown to operators)")

    def handle(self, *args, machine, note, **options):
        bound = None
        if machine:
            bound = Machine.objects.filter(name=machine).exclude(
                state=Machine.State.KILLED).first()
            if bound is None:
                raise CommandError(f"no live machine is named {machine!r}")
        secret = DeploySecret.issue(machine=bound, note=note or "issued by hand")
        self.stdout.write(f"{SECRET_ENV}={secret}")
