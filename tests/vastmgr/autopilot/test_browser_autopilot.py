"""The Autopilot page in a real browser (Debian's chromium via Playwright) on the served stack
(`manage.py up`) with the strict Vast fake as the market: the dry run proposes, one click
approves and the host is rented (by label, on the fake), the big off switch stops it, and a
change made by another operator reaches the open page by its poll. After every step the page is compared with the source of truth at that moment: the stack's database
and the fake's instances."""

import asyncio
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from devtools.fake_vast import FakeVast
from tests.vastmgr import live_engine
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import log_in, running_stack, screenshot

from .conftest import API_KEY

param_cache, browser = live_engine.param_cache, test_browser.browser
pytestmark = test_browser.pytestmark


@contextmanager
def fake_vast_in_a_thread():
    """The fake on its own event loop, so the stack's processes can call it while the test
    drives the browser."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-vast", daemon=True)
    thread.start()
    fake = FakeVast(API_KEY)
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def market():
    with fake_vast_in_a_thread() as fake:
        cheap = fake.add_offer(gpu_name="RTX 4090", dph_base=0.30, storage_cost=0.1)
        fake.add_offer(gpu_name="RTX 4090", dph_base=0.60, storage_cost=0.1)
        fake.add_offer(gpu_name="H100 SXM", dph_base=2.10, storage_cost=0.1)
        yield fake, cheap


@pytest.fixture
def served(tmp_path, clean_env, param_cache, market):
    fake, _ = market
    with running_stack(tmp_path, {**clean_env, "VAST_URL": fake.url}, param_cache) as url:
        yield url, Path(clean_env["VASTMGR_DATA_DIR"]) / "vastmgr.sqlite3"


def query(db: Path, sql: str, *args) -> list[tuple]:
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return connection.execute(sql, args).fetchall()
    finally:
        connection.close()


def test_dry_run_proposes_one_click_approves_and_the_off_switch_stops_it(
        served, market, browser):
    url, db = served
    fake, cheap = market
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    log_in(page, url)

    page.goto(f"{url}/remote/offers/")
    page.fill("#id_api_key", API_KEY)
    page.get_by_role("button", name="Save key").click()

    page.get_by_role("link", name="Autopilot").click()
    page.wait_for_url(f"{url}/autopilot/")
    mode = page.locator("#autopilot-mode")
    assert mode.get_attribute("data-mode") == "dry_run"  # the default
    assert query(db, "SELECT mode FROM autopilot_autopilot") in ([], [("dry_run",)])

    # A floor of two warm hosts for WinningPoSt: the local engine is one, so one is missing.
    page.fill("#id_min_winning-post", "2")
    page.get_by_role("button", name="Save limits").click()
    page.wait_for_url(f"{url}/autopilot/")
    assert query(db, "SELECT min_hosts FROM autopilot_autopilot") == [('{"winning-post": 2}',)]

    page.get_by_role("button", name="Plan now").click()
    page.wait_for_url(f"{url}/autopilot/")
    proposal = page.locator("#autopilot-proposals tr[data-action='rent']")
    assert proposal.count() == 1
    shown = proposal.text_content()
    assert f"offer {cheap['id']}" in shown and "below the minimum of 2 host(s)" in shown
    open_rows = query(db, "SELECT id, decision FROM autopilot_proposal WHERE status='proposed'")
    assert len(open_rows) == 1 and f'"offer_id": {cheap["id"]}' in open_rows[0][1]
    assert not fake.instances, "a dry run rented"
    screenshot(page, "autopilot-proposed")

    proposal.get_by_role("button", name="Approve").click()
    page.wait_for_url(f"{url}/autopilot/")
    page.locator(".messages").get_by_text("Done: rent").wait_for()
    [instance] = fake.instances.values()
    assert instance["label"].startswith("vastmgr-")
    machine = query(db, "SELECT m.name FROM fleet_machine m JOIN autopilot_managedmachine a "
                        "ON a.machine_id = m.id WHERE m.vast_instance_id = ?", instance["id"])
    assert len(machine) == 1
    done = page.locator(f"#autopilot-proposals tr[data-proposal='{open_rows[0][0]}']")
    assert done.get_attribute("data-status") == "done"
    assert query(db, "SELECT status FROM autopilot_proposal WHERE id = ?",
                 open_rows[0][0]) == [("done",)]
    explained = page.locator("#autopilot-events").text_content()
    assert "autopilot did: rent" in explained and "approved by ops" in explained
    assert "below the minimum of 2 host(s)" in explained
    screenshot(page, "autopilot-approved")

    page.get_by_role("button", name="Turn the autopilot OFF").click()
    page.wait_for_url(f"{url}/autopilot/")
    assert mode.get_attribute("data-mode") == "off"
    assert query(db, "SELECT mode FROM autopilot_autopilot") == [("off",)]
    assert page.get_by_role("button", name="Plan now").count() == 0
    assert page.get_by_role("button", name="Approve", exact=True).count() == 0
    assert query(db, "SELECT count(*) FROM autopilot_proposal WHERE status='proposed'") == [(0,)]
    assert len(fake.instances) == 1
    screenshot(page, "autopilot-off")

    # Another operator switches back to dry run: this page shows it by its poll, no reload.
    token = page.evaluate("window.__pageToken = Math.random().toString(36).slice(2)")
    other = browser.new_page(viewport={"width": 1400, "height": 900})
    log_in(other, url)
    other.goto(f"{url}/autopilot/")
    other.get_by_role("button", name="Dry run: propose, I approve").click()
    other.wait_for_url(f"{url}/autopilot/")
    assert query(db, "SELECT mode FROM autopilot_autopilot") == [("dry_run",)]
    page.wait_for_function(
        "document.getElementById('autopilot-mode').dataset.mode === 'dry_run'",
        timeout=20_000, polling=250)
    assert page.evaluate("window.__pageToken") == token, "the page was reloaded"

    # The plan is the same as before the switch: nothing more to rent.
    page.get_by_role("button", name="Plan now").click()
    page.wait_for_url(f"{url}/autopilot/")
    assert page.locator("#autopilot-proposals tr[data-action='rent']").count() == 0
    assert len(fake.instances) == 1
