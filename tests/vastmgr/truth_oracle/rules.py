"""The oracle's judgement, apart from any browser: rules over what a page showed (an extract of
its DOM, read between two wall-clock instants) and the engine's states around that moment.

A shown value is true when the engine was in that state at some moment of the window
[read started - PUSH_LATENCY, read ended]: a push may take up to PUSH_LATENCY to reach the page,
and nothing older is allowed. The state in force when the window opens counts too (the last one
polled before it). Running clocks are judged the same way at the moment of the read: the engine's
clock extrapolated to the read, less at most PUSH_LATENCY (a value it showed in the window), never
ahead; so a clock frozen between pushes fails once it is more than PUSH_LATENCY behind.

The engine is polled, not streamed, so a state it held between two polls is never seen: a
partition that went from pending to synth_done in 100 ms was synthesizing in between. What lies
between two consecutive states is therefore allowed too: the phases between them in a partition's
(or a job's) forward order, and the numbers between two consecutive values of a figure.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from cuzk_engine.vocabulary import IN_FLIGHT_PHASES, SETTLED_PHASES, TERMINAL_STATUSES

PUSH_LATENCY = 2.0
# A clock shown to 0.1 s, read between two polls: this much either way is noise.
CLOCK_SLACK = 0.3
# A job none of whose partitions reached these has not been touched by a device.
STARTED_PHASES = frozenset({"gpu", "finalizing", "done"})
# The forward orders a partition and a job move through (restarts aside).
PARTITION_ORDER = ("pending", "synthesizing", "synth_done", "gpu", "finalizing", "done")
JOB_ORDER = ("queued", "generating_parameters", "loading_parameters", "pending", "synthesizing",
             "waiting", "running")
# The dashboard's own states of a job the engine has not admitted yet, and the two ends it can
# come to without an engine: failed before reaching one (no engine could take it), cancelled
# while queued.
NOT_ON_ENGINE = frozenset({"queued", "dispatched"})
ENDED_OFF_ENGINE = frozenset({"failed", "cancelled"})


@dataclass(frozen=True)
class EngineState:
    """The engine at one moment: its /status (None when it did not answer) and the records of
    the jobs followed (GET /v1/proofs/<id>), by job id, as last fetched."""

    at: float
    snapshot: Mapping[str, Any] | None
    records: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The request's start and end: the engine took the snapshot somewhere in between (a busy
    # engine may take a second to answer). A bare moment when not given.
    started: float | None = None
    answered: float | None = None
    # The engine's last word on the jobs it ended so far (see History.ended).
    ended: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def earliest(self) -> float:
        return self.at if self.started is None else self.started

    @property
    def latest(self) -> float:
        return self.at if self.answered is None else self.answered

    def pipeline(self, job: str) -> Mapping[str, Any] | None:
        if self.snapshot is None:
            return None
        for p in self.snapshot.get("pipelines", ()):
            if p["job_id"] == job or (job and p["job_id"].startswith(job)):
                return p
        return None

    def record(self, job: str) -> Mapping[str, Any] | None:
        record = self.records.get(job)
        if record is None and job:
            record = next((r for j, r in self.records.items() if j.startswith(job)), None)
        return record


class History:
    """Engine states polled about ten times a second, kept for `keep` seconds."""

    def __init__(self, keep: float = 30.0):
        self.keep = keep
        self.states: deque[EngineState] = deque()
        # What the engine's status stream carried, by seq: the snapshots a page can name that
        # lasted less than a poll. Only the current engine's (cleared when its seq restarts).
        self.streamed: dict[int, EngineState] = {}
        # The engine's last word on each job it ended (from a poll, a record or the stream): it
        # stands after an engine restart forgets the job, which may come before the poller
        # fetched the record (a job done just before a kill -9).
        self.ended: dict[str, Mapping[str, Any]] = {}
        self.lock = threading.Lock()

    def _remember_ended(self, snapshot: Mapping[str, Any] | None,
                        records: Mapping[str, Mapping[str, Any]]) -> None:
        for p in (snapshot or {}).get("pipelines", ()):
            if p.get("status") in TERMINAL_STATUSES:
                self.ended[p["job_id"]] = {"status": p["status"],
                                           "partition_states": p.get("partitions")}
        for job, record in records.items():
            if record.get("status") in TERMINAL_STATUSES:
                self.ended[job] = record

    def add(self, state: EngineState) -> None:
        with self.lock:
            self._remember_ended(state.snapshot, state.records)
            state = replace(state, ended=dict(self.ended))
            self.states.append(state)
            while self.states and self.states[0].at < state.at - self.keep:
                self.states.popleft()

    def add_streamed(self, received: float, snapshot: Mapping[str, Any]) -> None:
        """A snapshot from the status stream, judged with the job records last polled."""
        seq = snapshot.get("seq", 0)
        with self.lock:
            if self.streamed and seq < max(self.streamed):
                self.streamed.clear()  # a restarted engine counts from the start again
            for old in [s for s, state in self.streamed.items()
                        if state.at < received - self.keep]:
                del self.streamed[old]
            self._remember_ended(snapshot, {})
            records = self.states[-1].records if self.states else {}
            self.streamed[seq] = EngineState(received, snapshot, records, ended=dict(self.ended))

    def named(self, seq: int | None, before: float, after: float) -> EngineState | None:
        """The streamed snapshot with this seq, if the stream carried it and it may have been
        in force in [before - PUSH_LATENCY, after]: received by the read's end, and no later
        one received before the window opened."""
        with self.lock:
            state = None if seq is None else self.streamed.get(seq)
            if state is None or state.at > after:
                return None
            superseded = any(s > seq and later.at < before - PUSH_LATENCY
                             for s, later in self.streamed.items())
            return None if superseded else state

    def latest(self) -> float:
        """When the last state's request started: states from after a read exist once this is
        past the read."""
        with self.lock:
            return self.states[-1].earliest if self.states else float("-inf")

    def window(self, before: float, after: float, seq: int | None = None) -> list[EngineState]:
        """The states that may have been taken in [before - PUSH_LATENCY, after], the one in
        force at its start, and the first one polled after it: the engine may have entered that
        state before the read ended (a push can beat the next poll). With the seq a view names,
        the streamed snapshot of that seq too, in time order, when it may have been in force."""
        start = before - PUSH_LATENCY
        named = self.named(seq, before, after)
        with self.lock:
            states = list(self.states)
        inside = [s for s in states if s.latest >= start and s.earliest <= after]
        earlier = [s for s in states if s.latest < start]
        later = [s for s in states if s.earliest > after]
        window = earlier[-1:] + inside + later[:1]
        if named is not None:  # in time order: the rules read consecutive states
            window = sorted([*window, named], key=lambda state: state.at)
        return window


def behind(view: Mapping[str, Any], states: list[EngineState]) -> float | None:
    """How long the engine had been past the snapshot a host panel shows (its seq) when it was
    read: 0 when it shows the latest; None when it shows no seq or the window cannot tell."""
    shown = view.get("seq")
    if shown is None:
        return None
    newer = [s.at for s in states if s.snapshot is not None and s.snapshot.get("seq", -1) > shown
             and s.snapshot.get("seq", 0) - shown < 1000]  # not a restarted engine's counter
    if not newer:
        return 0.0 if any(s.snapshot and s.snapshot.get("seq") == shown for s in states) else None
    return max(view["read_at"] - min(newer), 0.0)


@dataclass
class Violation:
    rule: str
    page: str
    what: str
    shown: object
    engine: object
    screenshot: str = ""
    context: str = ""  # when it was read and which engine states the window held

    def __str__(self) -> str:
        return (f"[{self.rule}] {self.page}: {self.what}: shown {self.shown!r}, engine in the "
                f"window {self.engine!r}" + (f" (screenshot {self.screenshot})"
                                             if self.screenshot else "")
                + (f"\n    {self.context}" if self.context else ""))


def describe_window(view: Mapping[str, Any], before: float, after: float,
                    states: list[EngineState]) -> str:
    """The read and its window, to tell a lie from a gap in what the oracle knew."""
    held = ", ".join(f"seq {s.snapshot.get('seq') if s.snapshot else None} "
                     f"@{s.earliest - before:+.2f}..{s.latest - before:+.2f}"
                     for s in states)
    return (f"read {time.strftime('%H:%M:%S', time.localtime(before))} over "
            f"{after - before:.2f} s, naming seq {view.get('seq')}; window (s from the read's "
            f"start): {held}")


@dataclass
class Verdict:
    checked: int = 0
    violations: list[Violation] = field(default_factory=list)

    def check(self, ok: bool, rule: str, page: str, what: str, shown: object,
              engine: Callable[[], object]) -> None:
        """Count one check; on a lie record it (`engine` is described only then)."""
        self.checked += 1
        if not ok:
            self.violations.append(Violation(rule, page, what, shown, engine()))


# ---- what the engine says, per state -----------------------------------------------------------

def partition_phases(state: EngineState, job: str, index: int,
                     ended: bool = False) -> set[str] | None:
    """The phases partition `index` of `job` may show in this state; None when the engine did
    not answer (nothing can be judged from it). `ended`: the page shows the job over, so a job
    the engine no longer knows (a restart forgot it) may show how its partitions ended."""
    if state.snapshot is None:
        return None
    pipeline = state.pipeline(job)
    if pipeline is not None:
        for p in pipeline["partitions"]:
            if p["index"] == index:
                return {p["state"]}
        return set()
    record = state.record(job)
    if record is not None and record.get("status") in TERMINAL_STATUSES:
        partitions = _final_partitions(record)
        if partitions is not None:
            return {p["state"] for p in partitions if p.get("index") == index}
        return {"done"} if record["status"] == "done" else set(SETTLED_PHASES)
    # Not on the engine (not dispatched yet, or lost by an engine restart): nothing in flight.
    return {"pending"} | (set(SETTLED_PHASES) if ended else set())


def job_labels(state: EngineState, job: str) -> set[str] | None:
    """The words a page may use for the job as a whole in this state."""
    if state.snapshot is None:
        return None
    pipeline = state.pipeline(job)
    if pipeline is not None:
        status = pipeline["status"]
        # The engine's phase when it reports one: "running" while parameters are generated,
        # or "cancelled" while partitions still hold a device, is not what it said.
        phase = pipeline.get("phase") or status
        labels = {phase}
        if phase == "queued":
            labels |= NOT_ON_ENGINE
        if phase == "running":
            labels.add(_before_a_device(pipeline["partitions"]))
        return labels
    record = state.record(job)
    if record is not None:
        status = record.get("status")
        return {status} | (NOT_ON_ENGINE if status == "queued" else set())
    # Not on the engine: not dispatched yet, or forgotten by an engine restart, which may have
    # come after the job ended there (its result kept, or lost and the job queued again).
    last_word = state.ended.get(job)
    return NOT_ON_ENGINE | ENDED_OFF_ENGINE | ({last_word["status"]} if last_word else set())


def _before_a_device(partitions: list[Mapping[str, Any]]) -> str:
    """A running job in finer words: `waiting` (for a device) only while synthesized partitions
    wait and none has reached a device; before that `synthesizing` or `pending`."""
    states = {p["state"] for p in partitions}
    if states & STARTED_PHASES:
        return "running"
    if "synth_done" in states:
        return "waiting"
    return "synthesizing" if "synthesizing" in states else "pending"


def settled(state: EngineState, job: str) -> bool:
    """The job is over on the engine and none of its partitions is in flight."""
    pipeline = state.pipeline(job) if state.snapshot is not None else None
    if pipeline is not None:
        return pipeline["status"] in TERMINAL_STATUSES and not any(
            p["state"] in IN_FLIGHT_PHASES for p in pipeline["partitions"])
    record = state.record(job)
    if record is None or record.get("status") not in TERMINAL_STATUSES:
        return False
    return not any(p["state"] in IN_FLIGHT_PHASES for p in _final_partitions(record) or ())


def _final_partitions(record: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The partitions' states an ended job's record carries (None from an engine too old)."""
    partitions = record.get("partition_states")
    return partitions if isinstance(partitions, list) else None


def host_figures(snapshot: Mapping[str, Any]) -> dict[str, int]:
    pipelines = snapshot.get("pipelines", [])
    workers = snapshot.get("gpu_workers", [])
    counters = snapshot.get("counters", {})
    unfinished = [p for p in pipelines if p["status"] not in TERMINAL_STATUSES]
    return {
        "synthesis_active": snapshot["synthesis"]["active"],
        "done": counters.get("total_completed"),
        "failed": counters.get("total_failed"),
        "cancelled": counters.get("total_cancelled"),
        "not_started": counters.get("queue_depth"),
        "memory_used_bytes": snapshot["memory"]["used_bytes"],
        "busy_workers": sum(w["state"] == "proving" for w in workers),
        "idle_workers": sum(w["state"] == "idle" for w in workers),
        "waiting_jobs": sum(not STARTED_PHASES.intersection(q["state"] for q in p["partitions"])
                            for p in unfinished),
        "parts_ready": sum(q["state"] == "synth_done" for p in pipelines
                           for q in p["partitions"]),
    }


def worker(state: EngineState, worker_id: int) -> Mapping[str, Any] | None:
    if state.snapshot is None:
        return None
    return next((w for w in state.snapshot.get("gpu_workers", [])
                 if w["worker_id"] == worker_id), None)


# ---- reading what a page shows -------------------------------------------------------------------

SIZE = re.compile(r"([\d.,]+)\s*(bytes|byte|B|KB|kB|KiB|MB|MiB|GB|GiB|TB|TiB)\b")
UNITS = {"bytes": 1, "byte": 1, "B": 1, "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9,
         "TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_size(text: str) -> tuple[float, float] | None:
    """(bytes, tolerance) of a size as shown, e.g. "21.5 GiB": the tolerance is half the last
    digit shown, so a value in decimal units labelled binary (or the reverse) does not pass."""
    m = SIZE.search(text.replace("\xa0", " "))
    if m is None:
        return None
    digits = m.group(1).replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    unit = UNITS[m.group(2)]
    return float(digits) * unit, 0.5 * 10 ** -decimals * unit + 1


# ---- the rules -----------------------------------------------------------------------------------

def _union(states: Iterable[EngineState], values: Callable[[EngineState], set | None],
           order: tuple[str, ...] = ()):
    """Every value the states allow, with what lies between two consecutive ones in `order`,
    and whether any state could be judged at all."""
    allowed: set = set()
    judged = False
    previous: set | None = None
    for state in states:
        got = values(state)
        if got is None:
            continue
        judged = True
        allowed |= got
        if previous is not None:
            allowed |= _between(previous, got, order)
        previous = got
    return allowed, judged


def _between(before: set, after: set, order: tuple[str, ...]) -> set:
    """The values of `order` strictly between a value in `before` and a later one in `after`."""
    rank = {value: i for i, value in enumerate(order)}
    found: set = set()
    for a in before & rank.keys():
        for b in after & rank.keys():
            found.update(order[rank[a] + 1:rank[b]])
    return found


def check_cells(view: Mapping[str, Any], states: list[EngineState], verdict: Verdict) -> None:
    """Every partition cell shows a phase its partition was in; a settled job shows none in
    flight (reported apart: the issue's worst lie)."""
    ended = view.get("status") in TERMINAL_STATUSES
    judged_states = _states_of_shown_seq(view, states)
    if judged_states is None:
        return
    states = judged_states
    for job, cells in _shown_jobs(view):
        for cell in cells:
            allowed, judged = _union(states, lambda s, j=job, c=cell: partition_phases(
                s, j, c["index"], ended), PARTITION_ORDER)
            if not judged:
                continue
            rule = "partition_phase"
            if cell["phase"] in IN_FLIGHT_PHASES and all(
                    settled(s, job) for s in states if s.snapshot is not None):
                rule = "settled_job_in_flight"
            verdict.check(cell["phase"] in allowed, rule, view["page"],
                          f"job {job} P{cell['index']}", cell["phase"],
                          lambda a=allowed: sorted(a))


def check_job_phase(view: Mapping[str, Any], states: list[EngineState], verdict: Verdict) -> None:
    """Waiting vs loading vs running: the job's label is a phase the engine reported."""
    for job, label in _shown_labels(view):
        allowed, judged = _union(states, lambda s, j=job: job_labels(s, j), JOB_ORDER)
        if judged and label is not None:
            verdict.check(label in allowed, "job_phase", view["page"], f"job {job}", label,
                          lambda a=allowed: sorted(a))


def check_workers(view: Mapping[str, Any], states: list[EngineState], verdict: Verdict) -> None:
    """Each worker card: its state, job and partition were the engine's; its running clocks
    show a value the engine's clocks had in the window (extrapolated to the read)."""
    at = view["read_at"]
    for shown in view.get("workers", ()):
        engine = [(s, w) for s in states if (w := worker(s, shown["worker"])) is not None]
        if not engine:
            continue
        described = [_describe_worker(w) for _, w in engine]
        verdict.check(_describe_worker(shown) in described, "worker_state", view["page"],
                      f"worker {shown['worker']}", _describe_worker(shown),
                      lambda d=described: sorted(set(d)))
        for key, engine_key in (("busy_s", "busy_secs"), ("busy_total_s", "busy_total_secs")):
            value = shown.get(key)
            if value is None:
                continue
            # The current pickup's clock is judged against that pickup only.
            same = [(s, w) for s, w in engine if key == "busy_total_s"
                    or _describe_worker(w) == _describe_worker(shown)]
            expected = [_clock(s, w, engine_key, at) for s, w in same]
            expected = [e for e in expected if e is not None]
            if not expected:
                continue
            verdict.check(any(e - PUSH_LATENCY - CLOCK_SLACK <= value <= e + CLOCK_SLACK
                              for e in expected),
                          "worker_clock", view["page"], f"worker {shown['worker']} {key}", value,
                          lambda ex=expected: f"{min(ex):.2f}..{max(ex):.2f} s at the read")


def check_figures(view: Mapping[str, Any], states: list[EngineState], verdict: Verdict) -> None:
    """Counters, queue, synthesis, memory, workers busy/idle, waiting work: each figure shown
    equals the engine's in some state of the window."""
    judged = _states_of_shown_seq(view, states)
    if judged is None:
        return
    engine = [host_figures(s.snapshot) for s in judged if s.snapshot is not None]
    if not engine:
        return
    for name, shown in view.get("figures", {}).items():
        if shown is None:
            continue
        if name == "memory_used":
            parsed = parse_size(shown)
            if parsed is None:
                continue
            value, tolerance = parsed
            values = [f["memory_used_bytes"] for f in engine]
            verdict.check(_within(value, values, tolerance), "figures", view["page"],
                          "memory used", shown, lambda v=values: sorted(set(v)))
            continue
        values = [f[name] for f in engine]
        verdict.check(_within(shown, values), "figures", view["page"], name, shown,
                      lambda v=values: sorted(set(v)))


def _states_of_shown_seq(view: Mapping[str, Any],
                         states: list[EngineState]) -> list[EngineState] | None:
    """The states a view's figures are judged against. A view that names the engine snapshot it
    shows (its seq) is judged against that snapshot when it was polled; when that seq fell
    between two polls (a state that lasted less than a poll: the controller's stream saw it,
    the poller did not) nothing polled can judge it, so None. Otherwise the whole window."""
    shown = view.get("seq")
    polled = [s for s in states if s.snapshot is not None]
    if shown is None or not polled:
        return states
    exact = [s for s in polled if s.snapshot.get("seq") == shown]
    if exact:
        return exact
    seqs = [s.snapshot.get("seq", 0) for s in polled]
    return None if min(seqs) < shown < max(seqs) + 1000 else states


def _within(shown: float, values: list, tolerance: float = 0.0) -> bool:
    """`shown` is one of the consecutive `values`, or lies between two consecutive ones."""
    pairs = list(pairwise(values)) if len(values) > 1 else [(values[0], values[0])]
    return any(min(a, b) - tolerance <= shown <= max(a, b) + tolerance for a, b in pairs
               if a is not None and b is not None)


def check_stale(view: Mapping[str, Any], states: list[EngineState], verdict: Verdict) -> None:
    """A page that shows a host's data while its engine did not answer for the whole window
    must say that the data is old."""
    if not states or view.get("status") in TERMINAL_STATUSES:
        return  # an ended proof's page shows its result, not the host's live state
    down = all(s.snapshot is None for s in states)
    verdict.check(not down or view.get("stale", False), "stale_label", view["page"],
                  "host data without an age", "live",
                  lambda: "not answering through the window")


def check_frozen_clocks(view: Mapping[str, Any], verdict: Verdict) -> None:
    """A page that labels a host's data as old runs none of its clocks (busy times, phase
    durations, SRS "last used", uptime, ETA): nobody knows whether the engine is still at it.
    Each stopped clock says how old it is ("as of N s ago")."""
    clocks = view.get("clocks") or {}
    if not view.get("stale") or view.get("status") in TERMINAL_STATUSES:
        return
    verdict.check(not clocks.get("running"), "frozen_clock", view["page"],
                  "clocks running on data that is not live", clocks.get("running"),
                  lambda: "every clock stopped at the snapshot")
    verdict.check(not clocks.get("unlabelled"), "frozen_clock", view["page"],
                  "stopped clocks without their age", clocks.get("unlabelled"),
                  lambda: "each says 'as of N s ago'")


RULES: dict[str, Callable[[Mapping[str, Any], list[EngineState], Verdict], None]] = {
    "cells": check_cells,
    "job_phase": check_job_phase,
    "workers": check_workers,
    "figures": check_figures,
    "stale": check_stale,
}
RULE_NAMES = ("partition_phase", "settled_job_in_flight", "job_phase", "worker_state",
              "worker_clock", "figures", "stale_label", "frozen_clock", "http")


def judge(view: Mapping[str, Any], states: list[EngineState]) -> Verdict:
    """Every rule over one DOM extract. A view marked stale (the page labels its data as old)
    is judged only on that label and on its clocks standing still."""
    verdict = Verdict()
    verdict.check(not view.get("traceback"), "http", view["page"], "page text", "a traceback",
                  lambda: "no traceback on any page")
    check_stale(view, states, verdict)
    if view.get("stale"):
        check_frozen_clocks(view, verdict)
        return verdict
    for name, rule in RULES.items():
        if name != "stale":
            rule(view, states, verdict)
    return verdict


def check_response(url: str, status: int, body: str) -> Violation | None:
    """No answer of the stack is a 5xx or carries a traceback."""
    if status >= 500 or "Traceback (most recent call last)" in body:
        return Violation("http", url, "response", status, "a 2xx-4xx answer without a traceback")
    return None


# ---- helpers ---------------------------------------------------------------------------------

def _shown_jobs(view: Mapping[str, Any]) -> list[tuple[str, list[dict]]]:
    if view["kind"] == "proof":
        return [(view["job"], view.get("cells", []))]
    return [(p["job"], p.get("cells", [])) for p in view.get("pipelines", ())]


def _shown_labels(view: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    if view["kind"] == "proof":
        return [(view["job"], view.get("phase"))]
    return [(p["job"], p.get("phase")) for p in view.get("pipelines", ())]


def _describe_worker(w: Mapping[str, Any]) -> tuple:
    job = w.get("current_job", w.get("job"))
    partition = w.get("current_partition", w.get("partition"))
    if w["state"] != "proving":
        return (w["state"],)
    return (w["state"], (job or "")[:8], partition)


def _clock(state: EngineState, w: Mapping[str, Any], key: str, at: float) -> float | None:
    value = w.get(key)
    if value is None:
        return None
    proving = w["state"] == "proving"
    # From the earliest moment the snapshot may have been taken: a page is never judged ahead
    # of the engine because the engine was slow to answer.
    return value + (max(at - state.earliest, 0.0) if proving else 0.0)
