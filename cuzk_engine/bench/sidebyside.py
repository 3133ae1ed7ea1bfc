"""Whole-process proving time side by side: `python -m cuzk_engine prove` against a peer command
(e.g. snarkjs groth16 prove on a circuit of the same domain), as separate processes.

Each side runs once to warm the page cache, then `pairs` times alternately, so both see the
same machine load; each run reports its wall time and the peak RSS of its process tree's
largest member (wait4's ru_maxrss). With `with_arkworks`, a third side proves with
CUZK_NATIVE_MSM=0: this project with the arkworks MSMs, the previous version's prover.
Parameters are generated beforehand and not timed (both sides prove with cached keys).
"""

from __future__ import annotations

import datetime
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from cuzk_engine.native.msm import DISABLE_ENV


@dataclass
class Side:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None


def _run(side: Side) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of one run; raises when the command fails."""
    with tempfile.TemporaryDirectory(prefix="cuzk-side-") as tmp:
        argv = [a.replace("{tmp}", tmp) for a in side.argv]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=side.env, cwd=side.cwd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        if proc.returncode != 0:
            raise RuntimeError(f"{side.name} failed ({proc.returncode}): {stderr[-500:]}")
    return wall, usage.ru_maxrss


def sides(kind: str, profile: str, peer: str | None, peer_cwd: str | None,
          with_arkworks: bool) -> list[Side]:
    ours = [sys.executable, "-m", "cuzk_engine", "prove", "--kind", kind, "--profile", profile,
            "--seed", "1", "--out", "{tmp}/out"]
    env = dict(os.environ)
    out = [Side("cuzk_engine", ours, {**env, DISABLE_ENV: "1"})]
    if with_arkworks:
        out.append(Side("cuzk_engine (arkworks MSMs)", ours, {**env, DISABLE_ENV: "0"}))
    if peer:
        out.append(Side("peer", shlex.split(peer), env, peer_cwd))
    return out


def run_side_by_side(kind: str, profile: str, pairs: int, peer: str | None = None,
                     peer_cwd: str | None = None, with_arkworks: bool = False) -> dict:
    subprocess.run([sys.executable, "-m", "cuzk_engine", "setup", "--kind", kind, "--profile",
                    profile], check=True, stdout=subprocess.DEVNULL)
    runners = sides(kind, profile, peer, peer_cwd, with_arkworks)
    for side in runners:
        _run(side)  # warm-up, not counted
    samples: dict[str, list[tuple[float, int]]] = {s.name: [] for s in runners}
    for _ in range(pairs):
        for side in runners:
            samples[side.name].append(_run(side))
    medians = {name: statistics.median(w for w, _ in runs) for name, runs in samples.items()}
    ours_median = medians[runners[0].name]
    rows = [{
        "side": side.name, "command": shlex.join(side.argv),
        "wall_s": [round(w, 3) for w, _ in samples[side.name]],
        "median_s": round(medians[side.name], 3),
        "peak_rss_mib": round(max(r for _, r in samples[side.name]) / 1024, 1),
        "ours_over_this": round(ours_median / medians[side.name], 3),
    } for side in runners]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kind": kind, "profile": profile, "pairs": pairs, "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()], "results": rows,
    }


def table(report: dict) -> str:
    lines = ["| side | median_s | peak_rss_mib | ours_over_this |", "|---|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['side']} | {r['median_s']} | {r['peak_rss_mib']} | "
                     f"{r['ours_over_this']} |")
    return "\n".join(lines)
