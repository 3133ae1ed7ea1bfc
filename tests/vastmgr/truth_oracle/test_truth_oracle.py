"""The truth oracle on the real stack: `manage.py up` (daphne, fleet controller, automation and a
local engine as processes, a fresh parameter cache), an operator in headless Chromium proving all
four kinds (tiny, and a small one: parameters generated on first use), cancelling a proof while
its partitions are on the device, retrying it, queueing a backlog and killing the engine (the
supervisor restarts it) — while the fleet row, the host panel and two proof pages, each in its
own tab, are read several times a second and every shown value is held against the engine's
states just before and after the read (`rules`). Every violation is printed with both values
and a screenshot under test-output/truth-oracle/; any fails the test.

TRUTH_ORACLE_SECONDS sets how long the operator keeps starting rounds of the scenario (default
60 s: one round, which takes longer than that, and the test about 2–3 minutes here; a longer run
repeats the scenario with new seeds); the sampling goes on until every proof has ended.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from cuzk_engine.vocabulary import TERMINAL_STATUSES
from tests.conftest import REPO, free_port
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import log_in, running_stack
from tests.vastmgr.served.test_faults import cmdline

from . import oracle, rules

pytestmark = [*test_browser.pytestmark, pytest.mark.slow]
browser = test_browser.browser

SECONDS = float(os.environ.get("TRUTH_ORACLE_SECONDS", "60"))
SETTLE_CAP = 150.0  # after the operator stops: every proof must end within this
STEP_TIMEOUT = 90.0
OUT = REPO / "test-output" / "truth-oracle"
DESKTOP = {"width": 1400, "height": 1000}

Step = tuple[str, Callable[[], bool], float]  # (what we wait for, until, at most seconds)


class Operator:
    """Works in its own tab as a person would, and steers the proof tabs to what it works on."""

    def __init__(self, page, fleet, stack: str, machine: int, history: rules.History,
                 engine_port: int, summary: oracle.Summary, proof_tabs: list):
        self.page = page
        self.fleet = fleet  # the fleet tab, read to see the host live
        self.stack = stack
        self.machine = machine
        self.history = history
        self.engine_port = engine_port
        self.summary = summary
        self.proof_tabs = proof_tabs  # [focus, previous focus]
        self.watching: list[str | None] = [None, None]
        self.done: set[str] = set()

    def event(self, text: str) -> None:
        self.summary.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    # ---- what the engine says now ----------------------------------------------------------

    def now(self) -> rules.EngineState | None:
        with self.history.lock:
            return self.history.states[-1] if self.history.states else None

    def pipeline(self, job: str):
        state = self.now()
        return state.pipeline(job) if state else None

    def on_device(self, job: str) -> bool:
        """The device has started on the job and has partitions left to prove: a partition
        may spend less than a poll on the device of an idle machine, so one on it now is not
        required."""
        p = self.pipeline(job)
        return p is not None and p["status"] == "running" \
            and any(q["state"] in ("gpu", "finalizing", "done") for q in p["partitions"]) \
            and any(q["state"] not in ("finalizing", "done") for q in p["partitions"])

    def any_on_device(self) -> bool:
        state = self.now()
        return bool(state and state.snapshot and any(
            w["state"] == "proving" for w in state.snapshot["gpu_workers"]))

    def engine_status(self, job: str) -> str | None:
        p = self.pipeline(job)
        if p is not None:
            return p["status"]
        state = self.now()
        record = state.record(job) if state else None
        return record.get("status") if record else None

    def engine_down(self) -> bool:
        state = self.now()
        return state is not None and state.snapshot is None

    def engine_up(self) -> bool:
        state = self.now()
        return state is not None and state.snapshot is not None

    def host_live(self) -> bool:
        row = self.fleet.locator(f"#host-{self.machine}-row")
        return row.count() == 1 and row.get_attribute("data-conn") == "live"

    def saw_phase(self, phase: str) -> bool:
        with self.history.lock:
            return any(s.snapshot and any(p.get("phase") == phase
                                          for p in s.snapshot["pipelines"])
                       for s in self.history.states)

    # ---- acting in the browser ---------------------------------------------------------------

    def submit(self, kind: str, profile: str, seed: int, count: int = 1) -> str | None:
        page = self.page
        page.goto(f"{self.stack}/proofs/new/")
        page.select_option("#id_machine", label="local")
        page.select_option("#id_kind", kind)
        page.select_option("#id_profile", profile)
        page.fill("#id_seed", str(seed))
        page.fill("#id_count", str(count))
        page.locator("form.proof-form").get_by_role("button", name="Start").click()
        page.wait_for_load_state("load")
        self.event(f"submitted {count} × {kind}/{profile}")
        if count == 1:
            page.wait_for_url(f"{self.stack}/proofs/*/")
            return page.url.rstrip("/").rsplit("/", 1)[1]
        return None

    def cancel(self, job: str) -> None:
        self.press(job, "Cancel")
        self.page.wait_for_load_state("load")
        self.event(f"cancelled {job[:8]} with partitions on the device")

    def retry(self, job: str) -> str:
        self.press(job, "Retry")
        self.page.wait_for_url(lambda url: "/proofs/" in url and job not in url)
        retried = self.page.url.rstrip("/").rsplit("/", 1)[1]
        self.event(f"retried {job[:8]} as {retried[:8]}")
        return retried

    def press(self, job: str, button: str) -> None:
        """A button of the proof's panel, once it shows. Pushes replace the panel several
        times a second, so the click is dispatched at once rather than after Playwright's
        wait for an element that stays put."""
        self.page.goto(f"{self.stack}/proofs/{job}/")
        locator = self.page.locator(f"#proof-{job}").get_by_role("button", name=button)
        locator.wait_for(state="visible", timeout=10_000)
        locator.dispatch_event("click")

    def focus(self, job: str | None) -> None:
        """The first proof tab opens `job`; the second keeps the one it showed before."""
        if job is None or job == self.watching[0]:
            return
        self.proof_tabs.reverse()
        self.watching.reverse()
        self.proof_tabs[0].goto(f"{self.stack}/proofs/{job}/")
        self.watching[0] = job

    def kill_engine(self) -> None:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                line = cmdline(int(entry))
                if "cuzk_engine" in line and f"127.0.0.1:{self.engine_port}" in line:
                    os.kill(int(entry), signal.SIGKILL)
                    self.event(f"killed the engine (pid {entry}) with work on the device")
                    return
        raise AssertionError("no engine process to kill")

    def all_proofs_ended(self) -> bool:
        self.page.goto(f"{self.stack}/proofs/?status=queued")
        if self.page.locator("#proof-rows tr[id^=job-]").count():
            return False
        for status in ("dispatched", "running"):
            self.page.goto(f"{self.stack}/proofs/?status={status}")
            if self.page.locator("#proof-rows tr[id^=job-]").count():
                return False
        return True

    # ---- the scenario ------------------------------------------------------------------------

    def script(self, seconds: float) -> Iterator[Step]:
        """The scenario, again and again (new seeds; the parameters are in hand after the first
        round) until `seconds` have passed."""
        started = time.time()
        for round_number in itertools.count():
            if round_number:
                if time.time() - started > seconds:
                    return
                self.event(f"round {round_number + 1}")
            yield from self.round(100 * round_number)

    def round(self, seeds: int) -> Iterator[Step]:
        first = self.submit("winning-post", "tiny", seeds + 1)
        self.focus(first)
        yield ("parameters generated on first use", lambda: self.saw_phase(
            "generating_parameters") or self.engine_status(first) in TERMINAL_STATUSES, 60)
        if not seeds and self.saw_phase("generating_parameters"):
            self.event("the engine generating parameters on first use")
        snap = self.submit("snap-update", "tiny", seeds + 2)
        self.focus(snap)
        assert snap is not None
        yield ("the snap-update proof on the device", lambda: self.on_device(snap), STEP_TIMEOUT)
        self.cancel(snap)
        yield ("the cancel settled", lambda: self.engine_status(snap) == "cancelled", 30)
        until = time.time() + 4  # the settled page is read a few more seconds
        yield ("the cancelled page read a while", lambda: time.time() > until, 10)
        self.focus(self.retry(snap))
        self.submit("porep-c2", "tiny", seeds + 10, count=3)
        self.submit("window-post", "tiny", seeds + 20, count=2)
        self.event("a backlog of 5 queued at once")
        yield ("work on the device", self.any_on_device, STEP_TIMEOUT)
        self.kill_engine()
        yield ("the engine gone", self.engine_down, 10)
        yield ("the engine restarted by the supervisor", self.engine_up, 60)
        self.event("the engine answers again")
        # As a person would: the next proof once the fleet page shows the host live again
        # (before that the dashboard refuses it: no engine could take it).
        yield ("the host live on the fleet page", self.host_live, 60)
        small = self.submit("winning-post", "small", seeds + 30)
        self.focus(small)
        # Its parameters are generated first: about a minute here, more on a busy machine.
        yield ("the small proof ended", lambda: self.engine_status(small) in TERMINAL_STATUSES,
               2 * STEP_TIMEOUT)


def local_machine(page, stack: str) -> int:
    page.goto(f"{stack}/")
    row = page.locator("tr[id^=host-][id$=-row]", has=page.get_by_role("link", name="local"))
    row.wait_for(timeout=30_000)
    return int((row.get_attribute("id") or "").split("-")[1])


def test_every_screen_agrees_with_the_engine(tmp_path, clean_env, browser):
    shutil.rmtree(OUT, ignore_errors=True)  # no screenshot of an earlier run left to mislead
    params = tmp_path / "params"  # empty: every kind's parameters are generated on first use
    params.mkdir()
    engine_port = free_port()
    history = rules.History()
    summary = oracle.Summary()
    sampler = oracle.Sampler(history, summary, OUT)
    poller = oracle.EnginePoller(f"http://127.0.0.1:{engine_port}", history)
    stream = oracle.StreamRecorder(f"http://127.0.0.1:{engine_port}", history)
    with running_stack(tmp_path, clean_env, params, engine_port=engine_port) as stack:
        context = browser.new_context(viewport=DESKTOP)
        context.on("response", sampler.response)
        operator_tab = context.new_page()
        log_in(operator_tab, stack)
        machine = local_machine(operator_tab, stack)
        fleet, host = context.new_page(), context.new_page()
        fleet.goto(f"{stack}/")
        host.goto(f"{stack}/machines/{machine}/")
        proof_tabs = [context.new_page(), context.new_page()]
        poller.start()
        stream.start()
        op = Operator(operator_tab, fleet, stack, machine, history, engine_port, summary,
                      proof_tabs)
        started = time.time()
        try:
            steps = op.script(SECONDS)
            waiting: Step | None = next(steps)
            waited_from = next_look = time.time()
            while True:
                targets = [(fleet, {"kind": "fleet", "host": machine}),
                           (host, {"kind": "host", "host": machine})]
                targets += [(tab, {"kind": "proof", "job": job})
                            for tab, job in zip(op.proof_tabs, op.watching) if job]
                sampler.sample(targets)
                sampler.drain()
                elapsed = time.time() - started
                if waiting is not None:
                    what, until, limit = waiting
                    timed_out = time.time() - waited_from > limit
                    if until() or timed_out:
                        if timed_out:
                            op.event(f"gave up waiting for {what}")
                        waiting = next(steps, None)
                        waited_from = time.time()
                elif elapsed > SECONDS and time.time() > next_look:
                    if op.all_proofs_ended():
                        break
                    next_look = time.time() + 3
                if elapsed > SECONDS + SETTLE_CAP:
                    op.event("stopped: proofs still unfinished")
                    break
        finally:
            poller.stop()
            stream.stop()
            summary.seconds = time.time() - started
            summary.engine_polls = poller.polls
            summary.streamed = stream.received
            summary.answer_times = poller.answer_times
            summary.longest_poll_gap = poller.longest_gap
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / "summary.txt").write_text(summary.text() + "\n")
            print("\n" + summary.text())
            context.close()
    events = " ".join(summary.events)
    for needed in ("generating parameters", "cancelled", "retried", "backlog",
                   "killed the engine", "answers again", "winning-post/small"):
        assert needed in events, f"the scenario did not get to: {needed}\n{summary.text()}"
    assert "gave up" not in events and "stopped" not in events, summary.text()
    assert not summary.violations, summary.text()
    judged = sum(summary.samples.values())
    assert summary.unjudged <= max(3, judged // 50), f"too many reads unjudged\n{summary.text()}"
