"""The oracle's moving parts on the real stack: a poller that keeps the engine's recent states,
a sampler that reads pages and judges them against those states, and the summary.

The poller runs in a thread (GET /status about ten times a second, and the records of the jobs
it has seen, GET /v1/proofs/<id>); a second thread records the engine's status stream, as the
controller receives it, so that a page naming a snapshot shorter than a poll can still be judged
against it. The browser is driven from the test's thread only (Playwright's sync API is not
thread-safe).
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from cuzk_engine.vocabulary import TERMINAL_STATUSES

from . import dom, rules

POLL_EVERY = 0.1
STREAM_RETRY = 0.2
RECORD_EVERY = 0.5  # per unfinished job: records change rarely, /status carries the detail
SCREENSHOTS_PER_RULE = 3


def get_json(url: str, timeout: float = 1.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


class EnginePoller(threading.Thread):
    """Keeps `history`: the engine's /status, polled until `stop()`, with the job records a
    RecordFetcher keeps beside it. The records are fetched in their own thread so that a slow
    answer about a job (an engine busy generating parameters) never stretches the gap between
    two polls: a read is judged only against states polled after it."""

    def __init__(self, engine_url: str, history: rules.History):
        super().__init__(name="engine-poller", daemon=True)
        self.engine_url = engine_url
        self.history = history
        self.fetcher = RecordFetcher(engine_url)
        self.polls = 0
        self.answer_times: list[float] = []  # seconds each /status took
        self.longest_gap = 0.0  # seconds between the starts of two polls
        self.halt = threading.Event()

    def run(self) -> None:
        self.fetcher.start()
        previous = None
        while not self.halt.is_set():
            started = time.time()
            if previous is not None:
                self.longest_gap = max(self.longest_gap, started - previous)
            previous = started
            snapshot = get_json(self.engine_url + "/status")
            answered = time.time()
            self.answer_times.append(answered - started)
            if snapshot is not None:
                self.fetcher.listed(snapshot)
            self.history.add(rules.EngineState((started + answered) / 2, snapshot,
                                               self.fetcher.records(), started, answered))
            self.polls += 1
            self.halt.wait(max(POLL_EVERY - (time.time() - started), 0.0))
        self.fetcher.stop()

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


class RecordFetcher(threading.Thread):
    """The records (GET /v1/proofs/<id>) of every job the engine listed: an unfinished one every
    RECORD_EVERY, a final one once more when its pipeline leaves the list (the engine's last
    word)."""

    def __init__(self, engine_url: str):
        super().__init__(name="engine-records", daemon=True)
        self.engine_url = engine_url
        self.lock = threading.Lock()
        self._records: dict[str, dict] = {}
        self._listed: dict[str, str] = {}  # job id -> status, in the last /status
        self.jobs: set[str] = set()  # every job id seen on the engine
        self.fetched: dict[str, float] = {}
        self.halt = threading.Event()

    def listed(self, snapshot: dict) -> None:
        with self.lock:
            self._listed = {p["job_id"]: p["status"] for p in snapshot.get("pipelines", [])}
            self.jobs.update(self._listed)

    def records(self) -> dict[str, dict]:
        with self.lock:
            return dict(self._records)

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.time()
            with self.lock:
                listed, jobs, records = dict(self._listed), set(self.jobs), dict(self._records)
            for job in jobs:
                record = records.get(job)
                final = record is not None and record.get("status") in TERMINAL_STATUSES
                if final and job not in listed and self.fetched.get(job, 0) > 0:
                    continue
                if started - self.fetched.get(job, 0) < RECORD_EVERY and job in listed:
                    continue
                got = get_json(f"{self.engine_url}/v1/proofs/{job}")
                self.fetched[job] = started if job in listed else 1.0
                with self.lock:
                    if got is None:
                        self._records.pop(job, None)  # forgotten (an engine restart)
                    else:
                        self._records[job] = got
            self.halt.wait(max(POLL_EVERY - (time.time() - started), 0.0))

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


class StreamRecorder(threading.Thread):
    """Keeps every snapshot the engine's /v1/status/stream sends in `history`, reconnecting
    (every STREAM_RETRY) while the engine is down, until `stop()`."""

    def __init__(self, engine_url: str, history: rules.History):
        super().__init__(name="engine-stream", daemon=True)
        self.url = engine_url + "/v1/status/stream"
        self.history = history
        self.received = 0
        self.halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._record())

    async def _record(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self.halt.is_set():
                try:
                    async with session.ws_connect(self.url, heartbeat=5.0) as ws:
                        while not self.halt.is_set():
                            try:
                                message = await ws.receive(timeout=STREAM_RETRY)
                            except TimeoutError:
                                continue  # quiet: nothing changed
                            if message.type != aiohttp.WSMsgType.TEXT:
                                break
                            self.history.add_streamed(time.time(), json.loads(message.data))
                            self.received += 1
                except (aiohttp.ClientError, OSError):
                    pass  # the engine is down (the scenario kills it): try again shortly
                await asyncio.sleep(STREAM_RETRY)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


@dataclass
class Summary:
    samples: collections.Counter = field(default_factory=collections.Counter)
    checked: int = 0
    violations: list[rules.Violation] = field(default_factory=list)
    responses: int = 0
    engine_polls: int = 0
    streamed: int = 0  # snapshots the status stream carried
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    behind: list[float] = field(default_factory=list)  # host panel reads: seconds behind
    answer_times: list[float] = field(default_factory=list)  # the engine's /status, seconds
    longest_poll_gap: float = 0.0  # seconds between two polls' starts
    unjudged: int = 0  # reads with no engine state polled after them in time

    def per_rule(self) -> dict[str, int]:
        counts = dict.fromkeys(rules.RULE_NAMES, 0)
        for v in self.violations:
            counts[v.rule] = counts.get(v.rule, 0) + 1
        return counts

    def text(self) -> str:
        head = (f"truth oracle: {sum(self.samples.values())} samples "
                f"({', '.join(f'{k} {v}' for k, v in sorted(self.samples.items()))}) over "
                f"{self.seconds:.0f} s, {self.checked} cells checked, {self.engine_polls} "
                f"engine snapshots polled and {self.streamed} streamed, {self.responses} HTTP "
                f"responses")
        lag = sorted(self.behind)
        if lag:
            head += (f"; the host panel was behind the engine by p50 {lag[len(lag) // 2]:.2f} s, "
                     f"p99 {lag[int(0.99 * (len(lag) - 1))]:.2f} s, max {lag[-1]:.2f} s "
                     f"({len(lag)} reads)")
        if self.answer_times:
            answers = sorted(self.answer_times)
            head += (f"; /status answered in p50 {answers[len(answers) // 2] * 1000:.0f} ms, "
                     f"max {answers[-1] * 1000:.0f} ms, polls at most "
                     f"{self.longest_poll_gap:.2f} s apart; {self.unjudged} reads unjudged "
                     f"(no state polled after them in time)")
        lines = [head, "scenario: " + "; ".join(self.events),
                 "violations per rule: " + ", ".join(f"{k} {v}" for k, v in
                                                    self.per_rule().items())]
        lines += [str(v) for v in self.violations]
        return "\n".join(lines)


class Sampler:
    """Reads pages, waits for the engine states just after the read, judges."""

    def __init__(self, history: rules.History, summary: Summary, out: Path):
        self.history = history
        self.summary = summary
        self.out = out
        self.shots: collections.Counter = collections.Counter()
        self.pending: list = []

    def sample(self, targets: list[tuple[object, dict]]) -> list[rules.Violation]:
        """Read every (page, what) in turn, then judge each read against the engine states
        around it, once the poller has a state from after the last read."""
        reads = []
        for page, arg in targets:
            before = time.time()
            try:
                view = page.evaluate(dom.EXTRACT, arg)
            except Exception as exc:  # a page in the middle of a navigation
                if "navigat" in str(exc) or "context was destroyed" in str(exc):
                    continue
                raise
            view["read_at"] = after = time.time()
            if not view.get("missing"):
                reads.append((page, view, before, after))
        if not reads:
            return []
        last = max(after for _, _, _, after in reads)
        deadline = last + 5.0  # a busy engine may take seconds to answer
        while self.history.latest() < last and time.time() < deadline:
            time.sleep(0.02)
        found = []
        for page, view, before, after in reads:
            if self.history.latest() <= after:
                # No state polled after the read: what the page may have got ahead of the
                # last poll cannot be told from a lie. Counted, and bounded by the test.
                self.summary.unjudged += 1
                continue
            window = self.history.window(before, after, view.get("seq"))
            verdict = rules.judge(view, window)
            if (lag := rules.behind(view, window)) is not None:
                self.summary.behind.append(lag)
            self.summary.samples[view["kind"]] += 1
            self.summary.checked += verdict.checked
            for violation in verdict.violations:
                violation.context = rules.describe_window(view, before, after, window)
                self.attach_screenshot(page, violation)
            found += verdict.violations
        self.summary.violations.extend(found)
        return found

    def attach_screenshot(self, page, violation: rules.Violation) -> None:
        key = (violation.rule, violation.page)
        self.shots[key] += 1
        if self.shots[key] > SCREENSHOTS_PER_RULE:
            violation.screenshot = "(not taken: enough of this rule already)"
            return
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{violation.rule}-{violation.page.replace(' ', '-')}-{self.shots[key]}.png"
        page.screenshot(path=str(path))
        violation.screenshot = str(path)

    def response(self, response) -> None:
        """Called by Playwright for every answer a page got; judged later in `drain`, since
        a sync-API event handler must not call back into the browser."""
        self.pending.append(response)

    def drain(self) -> None:
        """No answer is a 5xx or carries a traceback."""
        pending, self.pending = self.pending, []
        for response in pending:
            self.summary.responses += 1
            body = ""
            if response.status >= 500 or "text/html" in (
                    response.headers.get("content-type") or ""):
                try:
                    body = response.text()
                except Exception:  # noqa: BLE001 - a body that is gone (redirect, navigation)
                    body = ""
            violation = rules.check_response(response.url, response.status, body)
            if violation is not None:
                self.summary.violations.append(violation)
