"""The fleet oracle: the served stack (`manage.py up`) with the strict Vast fake as the
provider, a real sshd with a provisioned engine behind it beside the local engine, driven over
HTTP as an operator's browser does, plus one Chromium page on the fleet. Every money, GPU-count
and liveness figure is held against what the oracle knows by itself: a ledger computed from
the fake's own billing records (never from our ledger code) and each engine probed directly.

The scenario: a rent from the JSON API and two from the rent dialog's form, the instances
booting, a price change at extension, a stop and a start made on Vast's side, an instance
destroyed outside the product, a kill from the machine page's Destroy button (meanwhile an SSH
machine is added and provisioned over the real sshd); proofs on the local engine and on the
SSH machine, whose engine is restarted from its page with proofs queued on it; the local
engine frozen with SIGSTOP, then thawed; the Chromium page's socket cut (its websocket closed
and its polls refused), then given back. Between the steps it samples the fleet page (cards and
rows), each machine page, `/api/v1/fleet`, `/api/v1/machines`, `/api/dashboard`, `/metrics`
and the autopilot page, and checks:

- $/h and GPUs rented equal the fake's once the automation has listed Vast since the last
  change made there (before that, the product cannot know it: such samples are counted, not
  compared);
- every spend lies between the fake's at the sample's start and at its end, give or take what
  changed on Vast's side before a reconcile saw it (each change's $/h × the time unseen);
- $/proof is that spend over the proofs delivered in 24 h;
- no spend figure ever goes down;
- liveness: an engine that has not answered the oracle for longer than the stale bound is
  `live` on no surface, and one that has answered it throughout the settle time is `live` on
  every surface (in between, the product cannot know yet: counted, not compared);
- clocks: a machine that is not live shows no running clock, and its stopped clocks read the
  same from one sample to the next; the Chromium page, while its socket is cut, says "unknown"
  for every machine and no clock on it moves;
- events: each proof that Restart engine sends back to the queue is one Event, and reaches the
  notification channel once.

It writes a summary (samples, figures checked, disagreements, liveness and clock checks) to
test-output/fleet-oracle/summary.txt, which `.ci/run` prints, and fails on any
disagreement."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import log_in, screenshot
from tests.vastmgr.browser.test_browser_liveness import CLOCKS
from tests.vastmgr.browser.test_browser_proofs import DESKTOP
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache
from tests.vastmgr.notify.receiver import Receiver
from tests.vastmgr.remote.real_sshd import host_python
from tests.vastmgr.remote.served import (
    FakeOnItsLoop,
    Operator,
    last_event,
    machine_id,
    served_stack,
    wait_state,
)
from tests.vastmgr.remote.test_served_remote import all_final, host_form, prove
from tests.vastmgr.served.test_faults import ADMIN, PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), *test_browser.pytestmark]
browser = test_browser.browser

API_KEY = "vast-money-oracle-key-0123456789"
SUMMARY = Path(__file__).resolve().parents[3] / "test-output" / "fleet-oracle" / "summary.txt"
AUTOMATION_INTERVAL_S = 2
# Prices are quantized to $0.0001/h where Vast's are not, and the pages print 4-6 decimals.
RATE_TOLERANCE = 0.0002
# What the product's own actions may trail the fake by (the HTTP call itself), in dollars.
ROUNDING = 0.001
# Liveness: a machine is stale after 3 of its intervals without data (fleet/liveness.py). The
# oracle's own probe of an engine answers within PROBE_TIMEOUT_S or counts as silence; an
# engine silent to it for the stale bound plus NOT_LIVE_SLACK_S is live on no surface, one
# answering it for LIVE_SETTLE_S is live on every surface. The browser hears of it by a push,
# or by its next poll: BROWSER_SLACK_S more.
PROBE_TIMEOUT_S = 3.0
NOT_LIVE_SLACK_S = 5.0
LIVE_SETTLE_S = 10.0
BROWSER_SLACK_S = 10.0
SSH_MACHINE = "gpu-sshd"


@dataclass
class Change:
    """A change of what Vast bills: when it happened, by how much the $/h moved, and when the
    product saw it (its own action's end, or the first Vast listing after it)."""

    happened: float
    rate_delta: float
    seen: float | None = None


@dataclass
class ProbedEngine:
    """An engine as the oracle itself sees it: whether its API answers the oracle, and since
    when (the start of the first probe that found it so)."""

    name: str
    url: str
    token: str = ""
    watched: bool = False  # the product has been told to watch it (it runs), and showed it live
    answering: bool | None = None
    since: float = 0.0

    def probe(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        started = time.time()
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + "/status",
                                                               headers=headers),
                                        timeout=PROBE_TIMEOUT_S) as answer:
                answering = answer.status == 200
        except OSError:  # refused, reset, timed out (a frozen engine accepts, then says nothing)
            answering = False
        if answering != self.answering:
            self.answering, self.since = answering, started

    def expected(self, at: float, stale_bound: float, slack: float = 0.0) -> bool | None:
        """Whether every surface must say it is live at `at` (True), must not (False), or may
        say either because the product cannot know yet (None)."""
        if self.answering is False and at - self.since > stale_bound + NOT_LIVE_SLACK_S + slack:
            return False
        if self.answering and self.watched and at - self.since > LIVE_SETTLE_S + slack:
            return True
        return None


class PageLink:
    """The Chromium page's link to the dashboard, which the test cuts as a network would: its
    websockets closed (and every new one refused) and its polls of fragments refused."""

    SOCKETS = re.compile(r".*/ws/.*")
    POLLS = re.compile(r".*/fragments/.*")

    def __init__(self, page) -> None:
        self.page = page
        self.cut = False
        self.sockets: list = []
        page.route_web_socket(self.SOCKETS, self._socket)

    def _socket(self, socket) -> None:
        if self.cut:
            socket.close(code=1012, reason="cut by the test")
            return
        socket.connect_to_server()
        self.sockets.append(socket)

    @staticmethod
    def _refuse(route) -> None:
        route.abort("internetdisconnected")

    def cut_off(self) -> None:
        self.cut = True
        self.page.route(self.POLLS, self._refuse)
        for socket in self.sockets:
            socket.close(code=1012, reason="cut by the test")
        self.sockets.clear()

    def restore(self) -> None:
        self.cut = False
        self.page.unroute(self.POLLS, self._refuse)


@dataclass
class Oracle:
    stack: object
    operator: Operator
    vast: FakeOnItsLoop
    changes: list[Change] = field(default_factory=list)
    samples: int = 0
    unsettled: int = 0
    checked: int = 0
    disagreements: list[str] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    engines: list[ProbedEngine] = field(default_factory=list)
    page: PageLink | None = None
    liveness_checked: int = 0
    liveness_unsettled: int = 0
    late: int = 0
    shown_live: dict[str, bool] = field(default_factory=dict)
    clocks_checked: int = 0
    stopped_clocks: dict[str, str] = field(default_factory=dict)

    # ---- what changed and whether the product has seen it

    def listed_at(self) -> float | None:
        rows = self.stack.query("SELECT listed_at FROM remote_vastsync")
        if not rows:
            return None
        return datetime.fromisoformat(rows[0][0]).replace(tzinfo=UTC).timestamp()

    def provider_change(self, action, rate_delta: float) -> None:
        """A change made on Vast's side: the product learns of it at its next listing."""
        happened = time.time()
        action()
        self.changes.append(Change(happened, abs(rate_delta)))

    def product_change(self, action, rate_delta: float):
        """A change the product makes itself (a rent, a destroy): seen when its call returns."""
        happened = time.time()
        result = action()
        self.changes.append(Change(happened, abs(rate_delta), time.time()))
        return result

    def sample_until(self, done, timeout: float, what: str) -> None:
        """Sample until `done()` is true; on a timeout, say what the Events say."""
        def sampled():
            self.sample()
            return done()
        eventually(sampled, timeout, what, every=0.2, logs=lambda: "\n".join(
            f"{t} {m}" for t, m in self.stack.query(
                "SELECT time, message FROM fleet_event ORDER BY id DESC LIMIT 40")))

    def mark_seen(self) -> bool:
        listed = self.listed_at()
        for change in self.changes:
            if change.seen is None and listed is not None and listed > change.happened:
                change.seen = listed
        return all(c.seen is not None for c in self.changes)

    def wait_seen(self) -> None:
        """Sample while the automation has not listed Vast since the last change, until it has."""
        def seen():
            if self.mark_seen():
                return True
            self.sample()
            return False
        eventually(seen, 60, "the automation never listed Vast after the change", every=0.5)

    def lag_dollars(self, now: float) -> float:
        return sum(c.rate_delta * ((c.seen or now) - c.happened) / 3600 for c in self.changes)

    # ---- the independent ledger: the fake's own billing records

    def delivered(self) -> int:
        return self.stack.query("SELECT COUNT(*) FROM proofs_proofjob WHERE status = 'done' "
                                "AND finished_at >= datetime('now', '-1 day')")[0][0]

    def fake_ledger(self, at: float) -> dict:
        records = self.vast(self.vast.fake.billing_records, at)
        return {"spend": sum(r["gpu"] + r["disk"] for r in records.values()),
                "dph": sum(r["dph"] for r in records.values()),
                "gpus": sum(r["gpus"] for r in records.values()),
                "machines": {f"vast-{i}": r for i, r in records.items()}}

    # ---- the surfaces

    def read_surfaces(self) -> dict:
        get = self.operator.get
        fleet = get("/").body
        killed = get("/?state=killed").body
        api = json.loads(get("/api/v1/fleet").body)
        dashboard = json.loads(get("/api/dashboard").body)["summary"]
        metrics = get("/metrics").body
        autopilot = get("/autopilot/").body
        machines = {name: get(f"/remote/machines/{pk}/").body
                    for pk, name in self.stack.query(
                        "SELECT id, name FROM fleet_machine WHERE provider = 'vast'")}
        panels = {engine.name: get(f"/machines/{machine_id(self.stack, engine.name)}/").body
                  for engine in self.engines}
        api_machines = {m["name"]: m for m in json.loads(get("/api/v1/machines").body)
                        if m["state"] != "killed"}
        return {"fleet": fleet, "killed": killed, "api": api, "dashboard": dashboard,
                "metrics": metrics, "autopilot": autopilot, "machines": machines,
                "panels": panels, "api_machines": api_machines}

    def sample(self) -> None:
        # Settled: the product has listed Vast since every change, before any surface is read.
        seen_all = self.mark_seen()
        bills_before = self.bills()
        done_before = self.delivered()
        for engine in self.engines:
            engine.probe()
        start = time.time()
        before = self.fake_ledger(start)
        shown = self.read_surfaces()
        on_page = self.read_page()
        end = time.time()
        done = self.delivered()
        self.check_liveness(shown, on_page, start)
        after = self.fake_ledger(end)
        settled = seen_all and before["dph"] == after["dph"]
        self.samples += 1
        self.unsettled += not settled
        slack = self.lag_dollars(end) + ROUNDING
        low, high = before["spend"] - slack, after["spend"] + slack

        fleet, api, dashboard = shown["fleet"], shown["api"], shown["dashboard"]
        spends = {"fleet card": _attr(fleet, 'class="money total-spent" data-amount="([\\d.]+)"'),
                  "/api/v1/fleet": float(api["spent"]),
                  "/api/dashboard": float(dashboard["total_spent"]),
                  "/metrics": _metric(shown["metrics"], "vastmgr_fleet_spent_dollars_total")}
        for surface, value in spends.items():
            self.within(f"spend on {surface}", value, low, high)
        if settled:
            rates = {"fleet card": _attr(fleet, 'class="total-dph" data-dph="([\\d.]+)"'),
                     "/api/v1/fleet": float(api["price_per_hour"]),
                     "/api/dashboard": float(dashboard["total_dph"]),
                     "/metrics": _metric(shown["metrics"], "vastmgr_fleet_cost_dollars_per_hour"),
                     "autopilot page": _attr(shown["autopilot"], 'data-spend="([\\d.]+)"')}
            for surface, value in rates.items():
                self.equal(f"$/h on {surface}", value, after["dph"], RATE_TOLERANCE)
            gpus = {"fleet card": _attr(fleet, 'class="total-gpus" data-gpus="(\\d+)"'),
                    "/api/v1/fleet": float(api["gpus"]),
                    "/api/dashboard": float(dashboard["total_gpus"]),
                    "/metrics": _metric(shown["metrics"], "vastmgr_fleet_gpus_rented")}
            for surface, value in gpus.items():
                self.equal(f"GPUs on {surface}", value, after["gpus"], 0)
        if done_before:  # proofs delivered while the surfaces were read: either count
            per_proof = {"fleet card": _attr(fleet, 'class="total-ppp" data-ppp="([\\d.e-]+)"'),
                         "/api/v1/fleet": float(api["cost_per_proof_24h"] or 0),
                         "/api/dashboard": float(dashboard["avg_price_per_proof"])}
            for surface, value in per_proof.items():
                self.within(f"$/proof on {surface}", value, low / done, high / done_before)
        self.check_bills(fleet, api, bills_before)
        for name, page in shown["machines"].items():
            record = after["machines"].get(name)
            first = before["machines"].get(name)
            if record is None or first is None:
                continue  # rented a moment ago: not on Vast's books yet
            spent = _attr(page, 'class="money-spent" data-spent="([\\d.]+)"')
            self.within(f"spend on {name}'s page", spent, first["gpu"] + first["disk"] - slack,
                        record["gpu"] + record["disk"] + slack)
            row = _row(fleet, name) or _row(shown["killed"], name)
            if row is not None:
                self.within(f"spend on {name}'s row",
                            _attr(row, 'class="money" data-amount="([\\d.]+)"'),
                            first["gpu"] + first["disk"] - slack,
                            record["gpu"] + record["disk"] + slack)
            if settled:
                self.equal(f"$/h on {name}'s page", _attr(page, 'data-dph="([\\d.]+)"'),
                           record["dph"], RATE_TOLERANCE)
                if row is not None:
                    self.equal(f"$/h on {name}'s row", _attr(row, 'data-dph="([\\d.]+)"'),
                               record["dph"], RATE_TOLERANCE)

    # ---- events

    def events_twice(self) -> list[str]:
        """Events that say the same about the same machine within a second: one fact written
        by two paths (the doubles were 50-230 ms apart)."""
        last: dict[tuple, datetime] = {}
        twice = []
        for when, machine, message in self.stack.query(
                "SELECT time, machine_id, message FROM fleet_event ORDER BY time"):
            at = datetime.fromisoformat(when)
            previous = last.get((machine, message))
            if previous is not None and (at - previous).total_seconds() < 1:
                twice.append(f"{when}: {message}")
            last[(machine, message)] = at
        return twice

    # ---- liveness and clocks

    def stale_bound(self, name: str) -> float:
        """Seconds without data after which the machine is stale: 3 of its intervals."""
        rows = self.stack.query("SELECT s.interval FROM fleet_machinestatus s JOIN "
                                "fleet_machine m ON m.id = s.machine_id WHERE m.name = ? "
                                "AND m.state != 'killed'", name)
        return 3 * float(rows[0][0] or 1.0) if rows else 3.0

    def read_page(self) -> dict | None:
        """The Chromium fleet page: each watched machine's row state and clocks."""
        if self.page is None:
            return None
        ids = {e.name: machine_id(self.stack, e.name) for e in self.engines}
        return {name: {"conn": self.page.page.evaluate(
                           "sel => document.querySelector(sel)?.dataset.conn ?? null",
                           f"#host-{pk}-row"),
                       "clocks": self.page.page.evaluate(CLOCKS, [f"#host-{pk}-row .uptime-cell"])}
                for name, pk in ids.items()}

    def check_liveness(self, shown: dict, on_page: dict | None, start: float) -> None:
        for engine in self.engines:
            name = engine.name
            expected = engine.expected(start, self.stale_bound(name))
            row = _row(shown["fleet"], name) or ""
            panel = shown["panels"][name]
            pk = machine_id(self.stack, name)
            says = {"fleet row": _text(row, r'data-conn="(\w+)"'),
                    "machine page": _text(panel, rf'id="host-{pk}-panel"[^>]*data-conn="(\w+)"'),
                    "/api/v1/machines": shown["api_machines"][name]["connection"],
                    "/metrics": {1.0: "live", 0.0: "not live"}.get(_metric(
                        shown["metrics"], f'vastmgr_host_up{{host="{name}"}}'))}
            self.shown_live[name] = all(state == "live" for state in says.values())
            if expected is None:
                self.liveness_unsettled += 1
            else:
                for surface, state in says.items():
                    self.liveness(f"{name} on the {surface}", state, expected)
            if expected is False:
                # Not live: no clock of it runs, and each stopped one reads as it did before.
                for surface, html in (("fleet row", row), ("machine page", panel)):
                    self.clocks(f"{name}'s {surface}", html)
                self.stopped(f"{name}'s uptime on /metrics", str(_metric(
                    shown["metrics"], f'vastmgr_host_engine_uptime_seconds{{host="{name}"}}')))
            else:  # live again: a clock that stops next time starts a new reading
                for key in [k for k in self.stopped_clocks
                            if k.startswith(name) and "cut-off" not in k]:
                    del self.stopped_clocks[key]
            if on_page is None:
                continue
            seen = on_page[name]
            if self.page is not None and not self.page.cut:
                self.stopped_clocks.pop(f"{name} on the cut-off page", None)
            if self.page is not None and self.page.cut:
                self.liveness(f"{name} on the cut-off page", seen["conn"], None)
                self.stopped(f"{name} on the cut-off page",
                             json.dumps([c["text"] for c in seen["clocks"]]))
                continue
            expected = engine.expected(start, self.stale_bound(name), BROWSER_SLACK_S)
            if expected is not None:
                self.liveness(f"{name} on the browser's row", seen["conn"], expected)
            if expected is False:
                self.stopped(f"{name} on the browser's row",
                             json.dumps([c["text"] for c in seen["clocks"]]))
                self.note(all(c["running"] == 0 for c in seen["clocks"]),
                          f"{name} on the browser's row", f"a clock runs: {seen['clocks']}")

    def liveness(self, key: str, state: str | None, expected: bool | None) -> None:
        """`expected` None: the page lost its connection, so the state must read unknown. A
        surface that says less than the truth (not live, where the engine answers) is late,
        not lying (a controller starved of CPU hears its engines late): counted, and the
        scenario waits for every surface to say live before it goes on."""
        self.liveness_checked += 1
        if expected is None:
            self.note(state == "unknown", key, f"says {state} on a page that lost its socket")
        elif expected and state != "live":
            self.late += 1
        else:
            self.note(state == "live" or not expected, key,
                      f"says {state} where its engine has not answered for longer than the "
                      "stale bound")

    def clocks(self, key: str, html: str) -> None:
        """A machine not live: no clock of it is rendered running, and its stopped clocks."""
        running = re.findall(r'<span class="tick" [^>]*>([^<]*)<', html)
        self.note(not running, key, f"clocks run on a machine that is not live: {running}")
        self.stopped(key, json.dumps(re.findall(r'<span class="tick-frozen">([^<]*)<', html)))

    def stopped(self, key: str, reading: str) -> None:
        """A clock of a machine not live reads the same as at the previous sample."""
        self.clocks_checked += 1
        previous = self.stopped_clocks.setdefault(key, reading)
        self.note(previous == reading, key, f"a stopped clock moved: {previous} → {reading}")
        self.stopped_clocks[key] = reading

    def bills(self) -> list[tuple]:
        return self.stack.query("SELECT instance_id, dollars, fetched_at FROM "
                                "fleet_providerbill ORDER BY instance_id")

    def check_bills(self, fleet: str, api: dict, bills_before: list[tuple]) -> None:
        """What the product pulled from Vast's charges is what the fake billed when it was
        pulled (the pull's time is its start: the fake answers a moment later, rounded to a
        thousandth per item), and the pages show the sum of it (when no pull came between)."""
        bills = self.bills()
        for instance_id, dollars, fetched_at in bills:
            at = datetime.fromisoformat(fetched_at).replace(tzinfo=UTC).timestamp()
            record = self.vast(self.vast.fake.billing_records, at)[instance_id]
            later = self.vast(self.vast.fake.billing_records, at + 5)[instance_id]
            self.within(f"Vast's bill of vast-{instance_id} as pulled", float(dollars),
                        record["gpu"] + record["disk"] - 0.002,
                        later["gpu"] + later["disk"] + 0.002, monotonic=False)
        if bills and bills == bills_before:
            total = sum(float(d) for _, d, _ in bills)
            self.equal("billed by Vast on the fleet totals",
                       _attr(fleet, 'class="total-billed" data-billed="([\\d.]+)"'),
                       total, 1e-4)
            self.equal("billed by Vast on /api/v1/fleet", float(api["billed"] or 0), total, 1e-4)

    # ---- judging one figure

    def note(self, ok: bool, key: str, what: str) -> None:
        self.checked += 1
        if not ok:
            self.disagreements.append(f"sample {self.samples}: {key}: {what}")

    def within(self, key: str, value: float | None, low: float, high: float, *,
               monotonic: bool = True) -> None:
        if value is None:
            self.note(False, key, "not shown")
            return
        self.note(low - 1e-6 <= value <= high + 1e-6, key,
                  f"{value:.6f} outside [{low:.6f}, {high:.6f}]")
        if monotonic and key.startswith("spend"):
            previous = self.last.get(key)
            self.note(previous is None or value >= previous - 1e-6, key + " (monotonic)",
                      f"went down from {previous} to {value:.6f}")
            self.last[key] = value

    def equal(self, key: str, value: float | None, expected: float, tolerance: float) -> None:
        if value is None:
            self.note(False, key, "not shown")
            return
        self.note(abs(value - expected) <= tolerance + 1e-9, key,
                  f"{value} where Vast bills {expected:.6f}")

    def summary(self) -> str:
        return (f"fleet oracle: {self.samples} samples ({self.unsettled} before a "
                f"reconcile had seen the latest change: spend only), {self.checked} figures "
                f"checked, {len(self.disagreements)} disagreements\n"
                f"liveness: {self.liveness_checked} states checked ({self.liveness_unsettled} "
                f"machine samples the product could not know yet: not compared; {self.late} "
                f"states late to say live); clocks: "
                f"{self.clocks_checked} checks of machines not live")


def _attr(html: str, pattern: str) -> float | None:
    found = re.search(pattern, html)
    return float(found.group(1)) if found and found.group(1) else None


def _text(html: str, pattern: str) -> str | None:
    found = re.search(pattern, html)
    return found.group(1) if found else None


def _metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{re.escape(name)} ([\d.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _row(html: str, name: str) -> str | None:
    for row in re.findall(r'<tr[^>]*id="host-\d+-row".*?</tr>', html, re.DOTALL):
        if f">{name}<" in row:
            return row
    return None


@pytest.fixture(scope="module")
def vast():
    fake = FakeOnItsLoop(API_KEY, boot_s=(3600.0, 7200.0))
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, vast, sshd):  # noqa: F811 - the fixtures imported above
    # The SSH machine has no network: pip installs our wheel alone (the engine's dependencies
    # are on its PYTHONPATH, see real_sshd.py); one tiny benchmark proof gates it.
    yield from served_stack(tmp_path_factory.mktemp("fleet-oracle"), param_cache, {
        "VAST_URL": vast.url, "VASTMGR_AUTOMATION_INTERVAL_S": str(AUTOMATION_INTERVAL_S),
        "VASTMGR_PROVISION_PIP_ARGS": "--no-index", "VASTMGR_REMOTE_PYTHON": host_python(),
        "VASTMGR_MIN_BENCH_RATE": "0.01", "VASTMGR_BENCH_KIND": "winning-post",
        "VASTMGR_BENCH_PROFILE": "tiny", "VASTMGR_BENCH_PROOFS": "1"})


@pytest.fixture(scope="module")
def receiver():
    """The on-call channel: a webhook that records what the notifier sends."""
    with Receiver() as hook:
        yield hook


def post_json(stack, path: str, body: dict) -> dict:
    """A JSON API call from the logged-in session, with its CSRF token (as a page's script)."""
    token = next(c.value for c in stack.cookies if c.name == "csrftoken")
    request = urllib.request.Request(
        stack.url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-CSRFToken": token,
                 "Referer": stack.url + "/"})
    with stack.http.open(request, timeout=60) as answer:
        assert answer.status == 201, answer.read()[:500]
        return json.loads(answer.read())


def requeued_events(stack, jobs: list[str]) -> dict[str, int]:
    """How many Events say each of `jobs` (ids as the database holds them) was re-queued."""
    counts = {}
    for job in jobs:
        text = f"proof {uuid.UUID(job)} re-queued"
        counts[str(uuid.UUID(job))] = stack.query(
            "SELECT COUNT(*) FROM fleet_event WHERE message LIKE ?", f"{text}%")[0][0]
    return counts


def test_every_figure_of_the_fleet_agrees_with_vast_and_the_engines(
        stack, operator, vast, sshd, key_file, browser, receiver):
    oracle = Oracle(stack, operator, vast)
    fake = vast.fake
    operator.post("/notify/", {"name": "on-call", "url": receiver.url, "min_level": "warning",
                               "topics": ["proof"], "resend_minutes": 1})
    operator.post("/remote/offers/api-key/", {"api_key": API_KEY}, form="/remote/offers/")
    # An SSH machine behind the real sshd, provisioned while the money scenario runs.
    operator.post("/remote/machines/add/", host_form(SSH_MACHINE, sshd.port, sshd.user,
                                                     key_file, price_per_hour=""))
    ssh_pk, local_pk = machine_id(stack, SSH_MACHINE), machine_id(stack, "local")
    provisioned = last_event(stack)
    operator.post(f"/remote/machines/{ssh_pk}/provision/", form=f"/remote/machines/{ssh_pk}/")
    local = ProbedEngine("local", f"http://127.0.0.1:{stack.engine_port}", watched=True)
    oracle.engines.append(local)
    page = browser.new_page(viewport=DESKTOP)
    oracle.page = PageLink(page)
    log_in(page, stack.url, ADMIN, PASSWORD)
    offers = [vast(lambda gpus=gpus, price=price: fake.add_offer(
        gpu_name="RTX 4090", num_gpus=gpus, dph_base=price))
        for gpus, price in ((1, 0.31), (2, 0.62), (1, 0.27))]
    storage = [o["storage_cost"] * 64 / 720 for o in offers]
    try:
        # A rent from the JSON API, two from the rent dialog's form.
        api_rent = oracle.product_change(lambda: post_json(
            stack, f"/api/v1/offers/{offers[0]['id']}/rent", {"disk_gb": 64}), storage[0])
        oracle.product_change(lambda: operator.post("/remote/offers/rent/", {
            "offer_ids": [offers[1]["id"], offers[2]["id"]], "max_price_per_proof": "0.008",
            "disk_gb": 64, "engine_flavour": "", "image": "", "env": "", "onstart": ""},
            form="/remote/offers/"), storage[1] + storage[2])
        by_offer = vast(lambda: {i["_offer"]["id"]: key for key, i in fake.instances.items()})
        instances = [by_offer[o["id"]] for o in offers]  # in the offers' order
        assert api_rent["name"] == f"vast-{instances[0]}"
        oracle.sample()
        # The instances boot: their GPUs bill from now.
        oracle.provider_change(lambda: vast(fake.advance, 7200),
                               sum(o["dph_base"] for o in offers))
        oracle.wait_seen()
        oracle.sample()
        # A price change at extension.
        oracle.provider_change(lambda: vast(fake.reprice, instances[0], 0.45), 0.45 - 0.31)
        oracle.wait_seen()
        # A stop and a start, on Vast's side.
        oracle.provider_change(lambda: vast.console(instances[1], "stopped"), 0.62)
        oracle.wait_seen()
        oracle.sample()
        oracle.provider_change(lambda: vast.console(instances[1], "running"), 0.62)
        oracle.wait_seen()
        # Destroyed outside the product.
        oracle.provider_change(lambda: vast(fake.vanish, instances[2]), 0.27 + storage[2])
        oracle.wait_seen()
        oracle.sample()
        # Killed from the UI: the machine page's Destroy button.
        victim = stack.query("SELECT id FROM fleet_machine WHERE name = ?",
                             f"vast-{instances[0]}")[0][0]
        oracle.product_change(lambda: operator.post(
            f"/remote/machines/{victim}/destroy/", form=f"/remote/machines/{victim}/"),
            0.45 + storage[0])
        oracle.sample()

        # The local engine frozen with SIGSTOP mid-proof, then thawed (while the SSH machine
        # is provisioned).
        local_jobs = prove(stack, operator, local_pk, ["winning-post"] * 2, 1)
        [frozen_job] = prove(stack, operator, local_pk, ["snap-update"], 41)
        oracle.sample_until(lambda: stack.jobs([frozen_job]).get(
            str(uuid.UUID(frozen_job)), ("",))[0] == "running", 60, "the proof never ran")
        engine_pid = stack.children()["engine"]
        os.kill(engine_pid, signal.SIGSTOP)
        try:
            not_live = []
            oracle.sample_until(lambda: not_live.append(local.expected(
                time.time(), oracle.stale_bound("local"), BROWSER_SLACK_S) is False)
                or sum(not_live) >= 2, 60, "the frozen engine was never shown not live")
            screenshot(page, "fleet-oracle-frozen")
        finally:
            os.kill(engine_pid, signal.SIGCONT)
        oracle.sample_until(lambda: oracle.shown_live["local"], 60,
                            "the thawed engine was never shown live again")
        rows = all_final(stack, [*local_jobs, frozen_job])
        assert all(r[0] == "done" and r[1] == 1 for r in rows), rows

        # The SSH machine runs: the product watches its engine from now on.
        wait_state(stack, ssh_pk, SSH_MACHINE, "running", after=provisioned)
        [(port, token)] = stack.query("SELECT engine_port, engine_token FROM fleet_machine "
                                      "WHERE id = ?", ssh_pk)
        remote = ProbedEngine(SSH_MACHINE, f"http://127.0.0.1:{port}", token)
        oracle.engines.append(remote)
        page.reload()  # the row of a machine added after the page was loaded
        oracle.sample_until(lambda: remote.answering, 60, "the SSH machine's engine answers")
        remote.watched = True

        # The page's socket cut: every machine on it reads unknown, no clock on it moves.
        oracle.page.cut_off()
        page.wait_for_function("document.documentElement.dataset.pageConn === 'lost'",
                               timeout=15_000)
        for _ in range(3):
            oracle.sample()
            page.wait_for_timeout(1_000)  # the browser's clocks tick once a second
        screenshot(page, "fleet-oracle-page-cut")
        oracle.page.restore()
        page.wait_for_function(
            "document.getElementById('connection-badge').textContent === 'live'",
            timeout=60_000)
        oracle.sample()
        # Restart engine on the SSH machine with proofs queued on it (urgent ones: each is
        # sent at once, past the room an engine is given).
        known = {job for job, in stack.query("SELECT id FROM proofs_proofjob")}
        operator.post("/proofs/new/", {"machine": ssh_pk, "kind": "winning-post",
                                       "profile": "tiny", "seed": 11, "count": 12,
                                       "priority": ""})
        remote_jobs = [job for job, in stack.query("SELECT id FROM proofs_proofjob")
                       if job not in known]
        oracle.sample_until(lambda: any(status in ("dispatched", "running") for status, _ in
                                        stack.jobs(remote_jobs).values()), 60,
                            "the proofs did not reach the SSH machine's engine")
        restarted = last_event(stack)
        remote.watched = False  # its engine goes away and comes back: not live meanwhile
        operator.post(f"/remote/machines/{ssh_pk}/restart/", form=f"/remote/machines/{ssh_pk}/")
        oracle.sample_until(lambda: stack.query(
            "SELECT 1 FROM fleet_event WHERE id > ? AND machine_id = ? AND message LIKE "
            "'%engine is healthy%'", restarted, ssh_pk), 180, "the engine was not restarted")
        rows = all_final(stack, remote_jobs)
        assert all(r[0] == "done" and r[1] == 1 for r in rows), rows
        remote.watched = True
        # Tiny proofs are all admitted at once, and a drain lets admitted ones finish: here a
        # re-queue is rare, and each one that happens is one Event, told once.
        requeued = requeued_events(stack, remote_jobs)
        assert all(n in (0, 1) for n in requeued.values()), f"re-queued Events: {requeued}"
        told = [job for job, n in requeued.items() if n]
        def told_each() -> bool:
            messages = receiver.messages()
            return all(any(job in text for text in messages) for job in told)
        eventually(told_each, 60, "the re-queues did not reach the notification channel")
        delivered = receiver.messages()
        assert all(sum(job in text for text in delivered) == 1 for job in told), delivered

        # Proofs delivered: $/proof is the 24 h spend over them; time passes between samples.
        for _ in range(2):
            oracle.sample()
            page.wait_for_timeout(AUTOMATION_INTERVAL_S * 1000)
    finally:
        SUMMARY.parent.mkdir(parents=True, exist_ok=True)
        SUMMARY.write_text(oracle.summary() + "\n" + "\n".join(oracle.disagreements[:50]) + "\n")
    assert not oracle.events_twice(), oracle.events_twice()
    assert oracle.samples >= 8 and oracle.checked > 100, oracle.summary()
    assert oracle.liveness_checked > 50 and oracle.clocks_checked > 10, oracle.summary()
    assert not oracle.disagreements, oracle.summary() + "\n" + "\n".join(
        oracle.disagreements[:30])
