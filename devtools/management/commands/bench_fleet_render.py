"""`manage.py bench_fleet_render`: the fleet controller's render step alone, in CPU seconds.

`bench_fanout` measures the whole path (engines, controller, daphne, viewers) in wall-clock
time, which a shared machine's load moves a lot. This measures the part of the controller's
tick that grows with the pages watched: `FleetController._render` for `--machines` machines
whose every status changes every tick (the load generator's snapshots), with `--pages` pages
of the fleet table watched (default: all, so every machine is on somebody's screen) or one.
It reports CPU (process time, not wall time) per tick and per machine change, rows rendered per
tick and bytes per tick. Nothing is sent and no engine runs: it needs only the database (a
throw-away SQLite file in a temporary data dir when run as below).

    VASTMGR_DATA_DIR=$(mktemp -d) python manage.py bench_fleet_render --machines 1000
"""

import json
import math
import re
import statistics
import time
from collections import Counter

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from devtools.loadgen import _snapshot
from vastmgr.controller.hosts import WatchedMachine
from vastmgr.controller.service import FleetController
from vastmgr.controller.watcher import MachineLive
from vastmgr.fleet.liveness import seen_at
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.front import fragments, viewers
from vastmgr.front.fleet_table import FleetTableForm

PREFIX = "render-bench-"
ROW_ID = re.compile(r'id="host-(\d+)-row"')


class Command(BaseCommand):
    help = "The fleet controller's render step: CPU per tick and per changed machine."

    def add_arguments(self, parser):
        parser.add_argument("--machines", type=int, default=1000)
        parser.add_argument("--pages", type=int, default=0,
                            help="fleet pages watched (default: all of them)")
        parser.add_argument("--ticks", type=int, default=20)

    def handle(self, *args, machines, pages, ticks, **options):
        if min(machines, ticks) < 1 or pages < 0:
            raise CommandError("--machines and --ticks must be >= 1, --pages >= 0")
        call_command("migrate", interactive=False, verbosity=0)
        Machine.objects.filter(name__startswith=PREFIX).delete()
        rows = [Machine.objects.create(name=f"{PREFIX}{i:05}", provider="local",
                                       host="127.0.0.1", engine_port=1024 + i)
                for i in range(machines)]
        try:
            result = self.measure(rows, pages or math.ceil(machines / FleetTableForm.PER_PAGE),
                                  ticks)
        finally:
            Machine.objects.filter(pk__in=[m.pk for m in rows]).delete()
        self.stdout.write(json.dumps(result, indent=1))
        self.stdout.write(
            f"{result['machines']} machines, {result['pages_watched']} pages watched "
            f"({result['machines_watched']} distinct machines), every machine changed every "
            f"tick: render {result['cpu_ms_per_tick']['median']} ms CPU a tick (median of "
            f"{ticks}), {result['cpu_ms_per_machine_change']} ms per machine change; "
            f"{result['rows_rendered_per_tick']} rows rendered a tick, at most "
            f"{result['most_renders_of_one_row_in_a_tick']} of one row")

    def measure(self, machines: list[Machine], pages: int, ticks: int) -> dict:
        controller = FleetController()
        controller.machines = {m.pk: m for m in Machine.objects.filter(
            pk__in=[m.pk for m in machines]).select_related("remote")}
        # Watched here (so this controller pushes their rows), by no watcher: the statuses
        # below stand for what the engines sent.
        controller.hosts = {pk: WatchedMachine(MachineLive(pk)) for pk in controller.machines}
        groups = {viewers.fleet_group() + f".bench{page}": f"page={page}"
                  for page in range(1, pages + 1)}
        renders: Counter = Counter()
        row = fragments.render_fleet_row

        def counted(view):
            renders[view.machine.pk] += 1
            return row(view)

        fragments.render_fleet_row = counted
        cpu, sizes, rendered, most, watched = [], [], [], 0, set()
        try:
            for tick in range(ticks + 1):
                now = time.time()
                statuses = {pk: MachineStatus(
                    pk=pk, machine=machine, connected=True, via="stream", interval=1.0,
                    seq=tick + 1, snapshot=_snapshot(index, tick + 1), error="",
                    updated=seen_at(now), snapshot_at=seen_at(now))
                    for index, (pk, machine) in enumerate(controller.machines.items())}
                for machine in controller.machines.values():
                    machine.last_seen = seen_at(now)
                renders.clear()
                started = time.process_time()
                messages = controller._render(groups, set(groups) if tick == 0 else set(),
                                              set(statuses), set(), statuses, now)
                spent = time.process_time() - started
                if tick == 0:  # every page new: sent whole, the rows known from then on
                    watched = {int(pk) for _, html in messages
                               for pk in fragments_row_ids(html)}
                    continue
                cpu.append(spent)
                sizes.append(sum(len(html) for _, html in messages))
                rendered.append(sum(renders.values()))
                most = max(most, max(renders.values(), default=0))
        finally:
            fragments.render_fleet_row = row
        median = statistics.median(cpu)
        return {
            "machines": len(machines), "pages_watched": pages, "machines_watched": len(watched),
            "ticks": ticks,
            "cpu_ms_per_tick": {"median": round(median * 1000, 1),
                                "max": round(max(cpu) * 1000, 1)},
            "cpu_ms_per_machine_change": round(median * 1000 / len(machines), 3),
            "rows_rendered_per_tick": round(statistics.median(rendered)),
            "most_renders_of_one_row_in_a_tick": most,
            "kilobytes_per_tick": round(statistics.median(sizes) / 1000),
        }


def fragments_row_ids(html: str) -> list[str]:
    return ROW_ID.findall(html)
