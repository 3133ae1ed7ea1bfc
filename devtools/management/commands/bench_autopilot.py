"""`manage.py bench_autopilot`: one simulated day (devtools/autopilot_day.py) per seed: the
autopilot with interruptible capacity (once per preemption rate), the autopilot on demand only,
a fixed fleet sized for the peak and a queue-length threshold scaler on the same trace and
market, with the perfect-foresight lower bounds. Prints JSON, then a short table."""

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
        parser.add_argument("--preemption-rate", type=float, action="append",
                            dest="preemption_rate",
                            help="chance per hour that an interruptible instance is outbid "
                                 "(repeat for several; default 0.1)")

    def handle(self, *args, seed: list[int] | None, preemption_rate: list[float] | None,
               **options):
        rates = tuple(preemption_rate or [0.1])
        if any(not 0 <= rate <= 60 for rate in rates):
            self.stderr.write("--preemption-rate is a chance per hour, 0 to 60")
            raise SystemExit(2)
        reports = []
        for one in seed or [7]:
            started = time.monotonic()
            report = sim.compare(one, preemption_rates=rates)
            report.pop("_runs")
            report["seconds"] = round(time.monotonic() - started, 2)
            reports.append(report)
        self.stdout.write(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
        for report in reports:
            self.stdout.write(_table(report))


def _table(report: dict) -> str:
    lines = [(f"\nseed {report['seed']}: {report['jobs']} proofs, {report['offers']} offers, "
              f"lower bound ${report['lower_bound_dollars']:.2f} on demand, "
              f"${report['lower_bound_bids_dollars']:.2f} at minimum bids"),
             (f"{'policy':<30}{'$':>8}{'$/proof':>10}{'missed PoSt':>12}{'missed all':>11}"
              f"{'peak':>6}{'mean':>7}{'peak $/h':>10}{'outbid':>7}")]
    rows = [(r["policy"], r) for r in report["results"]] + [
        (f"autopilot @ {r['preemption_rate']:g}/h", r)
        for r in report["autopilot_by_preemption_rate"]]
    for name, r in rows:
        urgent = sum(r["missed"].get(k, 0) for k in URGENT)
        lines.append(f"{name:<30}{r['dollars']:>8.2f}{r['dollars_per_proof']:>10.5f}"
                     f"{urgent:>12}{sum(r['missed'].values()):>11}{r['peak_hosts']:>6}"
                     f"{r['mean_hosts']:>7.2f}{r['peak_dollars_per_hour']:>10.3f}"
                     f"{r['preemptions']:>7}")
    return "\n".join(lines)
