"""The fleet money oracle: the served stack (`manage.py up`) with the strict Vast fake as the
provider, driven over HTTP as an operator's browser does, every money and GPU-count figure held
against a ledger computed independently from the fake's own billing records (never from our
ledger code).

The scenario: a rent from the JSON API and two from the rent dialog's form, the instances
booting, a price change at extension, a stop and a start made on Vast's side, an instance
destroyed outside the product, a kill from the machine page's Destroy button, and proofs on the
local engine. Between the steps, and while the automation has not yet seen a change, it samples
the fleet page (cards and rows), each machine page, `/api/v1/fleet`, `/api/dashboard`, `/metrics`
and the autopilot page, and checks:

- $/h and GPUs rented equal the fake's once the automation has listed Vast since the last
  change made there (before that, the product cannot know it: such samples are counted, not
  compared);
- every spend lies between the fake's at the sample's start and at its end, give or take what
  changed on Vast's side before a reconcile saw it (each change's $/h × the time unseen);
- $/proof is that spend over the proofs delivered in 24 h;
- no spend figure ever goes down.

It writes a one-line summary (samples, figures checked, disagreements) to
test-output/fleet-money-oracle/summary.txt, which `.ci/run` prints, and fails on any
disagreement."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devtools.fake_vast import FakeVast
from tests.conftest import eventually
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache
from tests.vastmgr.remote.served import Operator, served_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

API_KEY = "vast-money-oracle-key-0123456789"
SUMMARY = Path(__file__).resolve().parents[3] / "test-output" / "fleet-money-oracle" / "summary.txt"
AUTOMATION_INTERVAL_S = 2
# Prices are quantized to $0.0001/h where Vast's are not, and the pages print 4-6 decimals.
RATE_TOLERANCE = 0.0002
# What the product's own actions may trail the fake by (the HTTP call itself), in dollars.
ROUNDING = 0.001


class FakeOnItsLoop:
    """The fake Vast on its own event loop in a thread, for the stack's processes to call; the
    test reaches its state on that loop, never from another thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake = FakeVast(API_KEY, boot_s=(3600.0, 7200.0))
        self.url = asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(30)

    def __call__(self, function, *args):
        async def run():
            return function(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def console(self, instance_id: int, state: str) -> None:
        """Stop or start an instance as another Vast client does (the console, the CLI)."""
        request = urllib.request.Request(
            f"{self.url}/api/v0/instances/{instance_id}/", method="PUT",
            data=json.dumps({"state": state}).encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Change:
    """A change of what Vast bills: when it happened, by how much the $/h moved, and when the
    product saw it (its own action's end, or the first Vast listing after it)."""

    happened: float
    rate_delta: float
    seen: float | None = None


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
        return {"fleet": fleet, "killed": killed, "api": api, "dashboard": dashboard,
                "metrics": metrics, "autopilot": autopilot, "machines": machines}

    def sample(self) -> None:
        # Settled: the product has listed Vast since every change, before any surface is read.
        seen_all = self.mark_seen()
        bills_before = self.bills()
        start = time.time()
        before = self.fake_ledger(start)
        shown = self.read_surfaces()
        end = time.time()
        after = self.fake_ledger(end)
        settled = seen_all and before["dph"] == after["dph"]
        self.samples += 1
        self.unsettled += not settled
        slack = self.lag_dollars(end) + ROUNDING
        low, high = before["spend"] - slack, after["spend"] + slack
        done = self.stack.query("SELECT COUNT(*) FROM proofs_proofjob WHERE status = 'done' "
                                "AND finished_at >= datetime('now', '-1 day')")[0][0]

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
        if done:
            per_proof = {"fleet card": _attr(fleet, 'class="total-ppp" data-ppp="([\\d.e-]+)"'),
                         "/api/v1/fleet": float(api["cost_per_proof_24h"] or 0),
                         "/api/dashboard": float(dashboard["avg_price_per_proof"])}
            for surface, value in per_proof.items():
                self.within(f"$/proof on {surface}", value, low / done, high / done)
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
        return (f"fleet money oracle: {self.samples} samples ({self.unsettled} before a "
                f"reconcile had seen the latest change: spend only), {self.checked} figures "
                f"checked, {len(self.disagreements)} disagreements")


def _attr(html: str, pattern: str) -> float | None:
    found = re.search(pattern, html)
    return float(found.group(1)) if found and found.group(1) else None


def _metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} ([\d.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _row(html: str, name: str) -> str | None:
    for row in re.findall(r'<tr[^>]*id="host-\d+-row".*?</tr>', html, re.DOTALL):
        if f">{name}<" in row:
            return row
    return None


@pytest.fixture(scope="module")
def vast():
    fake = FakeOnItsLoop()
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, vast):  # noqa: F811 - the fixture imported above
    yield from served_stack(tmp_path_factory.mktemp("money-oracle"), param_cache, {
        "VAST_URL": vast.url, "VASTMGR_AUTOMATION_INTERVAL_S": str(AUTOMATION_INTERVAL_S)})


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


def test_every_money_figure_agrees_with_what_vast_bills(stack, vast):
    operator = Operator(stack)
    operator.login()
    oracle = Oracle(stack, operator, vast)
    fake = vast.fake
    operator.post("/remote/offers/api-key/", {"api_key": API_KEY}, form="/remote/offers/")
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
        # Proofs delivered (on the local engine): $/proof is the 24 h spend over them.
        local = stack.query("SELECT id FROM fleet_machine WHERE name = 'local'")[0][0]
        for seed in (1, 2):
            operator.post("/proofs/new/", {"machine": local, "kind": "winning-post",
                                           "profile": "tiny", "seed": seed, "count": 1,
                                           "priority": ""})
        eventually(lambda: stack.query("SELECT COUNT(*) FROM proofs_proofjob WHERE status = "
                                       "'done'")[0][0] >= 2, 180, "the proofs did not finish",
                   every=0.5)
        for _ in range(3):
            oracle.sample()
            time.sleep(AUTOMATION_INTERVAL_S)  # let time pass between samples: spend grows
    finally:
        SUMMARY.parent.mkdir(parents=True, exist_ok=True)
        SUMMARY.write_text(oracle.summary() + "\n" + "\n".join(oracle.disagreements[:50]) + "\n")
    assert operator.server_errors() == []
    assert oracle.samples >= 8 and oracle.checked > 100, oracle.summary()
    assert not oracle.disagreements, oracle.summary() + "\n" + "\n".join(
        oracle.disagreements[:30])
