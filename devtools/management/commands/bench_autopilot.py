"""`manage.py bench_autopilot`: one simulated day (sim.py), the autopilot against a fixed fleet
sized for the peak and a queue-length threshold scaler on the same trace and market, with the
perfect-foresight lower bound. Prints JSON, then a short table."""

import json
import time

from django.core.management.base import BaseCommand

from devtools import autopilot_day as sim

URGENT = ("winning-post", "window-post")


class Command(BaseCommand):
    help = "Simulate a day of proving: the autopilot against two baselines and a lower bound"

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, action="append",
                            help="world seed (repeat for several days; default 7)")

    def handle(self, *args, seed: list[int] | None, **options):
        reports = []
        for one in seed or [7]:
            started = time.monotonic()
            report = sim.compare(one)
            report.pop("_runs")
            report["seconds"] = round(time.monotonic() - started, 2)
            reports.append(report)
        self.stdout.write(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
        for report in reports:
            self.stdout.write(_table(report))


def _table(report: dict) -> str:
    lines = [(f"\nseed {report['seed']}: {report['jobs']} proofs, {report['offers']} offers, "
             f"lower bound ${report['lower_bound_dollars']:.2f}"),
             (f"{'policy':<22}{'$':>8}{'$/proof':>10}{'missed PoSt':>12}{'missed all':>11}"
             f"{'peak':>6}{'mean':>7}{'peak $/h':>10}")]
    for r in report["results"]:
        urgent = sum(r["missed"].get(k, 0) for k in URGENT)
        lines.append(f"{r['policy']:<22}{r['dollars']:>8.2f}{r['dollars_per_proof']:>10.5f}"
                     f"{urgent:>12}{sum(r['missed'].values()):>11}{r['peak_hosts']:>6}"
                     f"{r['mean_hosts']:>7.2f}{r['peak_dollars_per_hour']:>10.3f}")
    return "\n".join(lines)
