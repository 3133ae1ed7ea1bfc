"""An operator's first week (issue 39), in Debian's chromium via Playwright against the served
stack (`manage.py up`) with the strict fake Vast as the provider: what a new operator meets on
each page, checked in the page's own terms and against the source of truth at that moment (the
JSON API, i.e. the database, or the fake Vast). One stack serves the whole module; each test
opens its own browser context. Screenshots go to test-output/browser/first-week-*.png."""

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from cuzk_engine.vocabulary import PARTITION_PHASES
from devtools.fake_vast import FakeVast
from tests.conftest import REPO, eventually, free_port
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PASSWORD,
    USER,
    log_in,
    running_stack,
    wait_until_done_and_verified,
)
from tests.vastmgr.browser.test_browser_proofs import start_proof

param_cache = test_browser.param_cache
pytestmark = test_browser.pytestmark

API_KEY = "vast-first-week-key-0123456789abcdef"
SCREENSHOTS = REPO / "test-output" / "browser"
VIEWER, VIEWER_PASSWORD = "viewer1", "pw-viewer-first-week-1"


@pytest.fixture(scope="module")
def fake_vast() -> Iterator[FakeVast]:
    """The fake Vast on its own event loop in a thread, for the stack's processes to call.
    Its instances never boot in this module: a rented machine stays without an address."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    vast = FakeVast(API_KEY, boot_s=(3600.0, 7200.0))
    asyncio.run_coroutine_threadsafe(vast.start(), loop).result(30)
    for machine_id in (40001, 40002):
        vast.add_offer(gpu_name="RTX 4090", num_gpus=1, machine_id=machine_id)
    try:
        yield vast
    finally:
        asyncio.run_coroutine_threadsafe(vast.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def engine_port() -> int:
    """The stack's local engine: what it says is the truth the pages are held to."""
    return free_port()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, fake_vast, engine_port) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("first-week")
    # As tests/conftest.py's clean_env, for the whole module.
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                        "VASTMGR_HTTPS", "VASTMGR_ADMIN_USER", "VASTMGR_ADMIN_PASSWORD"}}
    env.update(VASTMGR_DATA_DIR=str(tmp_path / "data"), DJANGO_SETTINGS_MODULE="vastmgr.settings",
               PYTHONPATH=str(REPO), VAST_URL=fake_vast.url,
               VASTMGR_CALLHOME_PORT=str(free_port()))
    with running_stack(tmp_path, env, param_cache, engine_port=engine_port) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, stack):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, stack)
    yield page
    context.close()


def api(page, path: str):
    """The database's view through the JSON API, in this page's session (the oracle)."""
    base = "/".join(page.url.split("/", 3)[:3])
    answer = page.request.get(base + path)
    assert answer.ok, (path, answer.status, answer.text()[:300])
    return answer.json()


def shot(page, name: str, *, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"first-week-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def add_ssh_machine(page, stack: str, name: str) -> int:
    """Through the Add machine form, untested: an sshd that does not exist (a free port)."""
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    page.goto(f"{stack}/remote/machines/add/")
    page.fill("#id_name", name)
    page.fill("#id_host", "127.0.0.1")
    page.fill("#id_ssh_port", str(free_port()))
    page.fill("#id_private_key", key)
    page.get_by_role("button", name="Add without testing").click()
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def machine_named(page, name: str) -> dict:
    [found] = [m for m in api(page, "/api/v1/machines") if m["name"] == name]
    return found


# Pixels of the series' colour in a chart's canvas (the line, or a lone point's dot).
SERIES_PIXELS = """figure => {
    const hex = getComputedStyle(document.documentElement).getPropertyValue("--chart-rate").trim();
    const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    const canvas = figure.querySelector("canvas");
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let count = 0;
    for (let i = 0; i < pixels.length; i += 4) {
        if (pixels[i + 3] > 200 && want.every((v, c) => Math.abs(pixels[i + c] - v) < 40)) count++;
    }
    return count;
}"""


def test_a_24_h_chart_with_one_point_draws_it_and_says_so(stack, page):
    """First in the module: the stack has run for less than one 24-h point (4 min), so the
    24-h proofs/min chart has one point. It is drawn (a dot in the series' colour, where a
    line of one point drew nothing) and the chart says why it is a dot."""
    local_id = machine_named(page, "local")["id"]

    charts = page.locator(f"#host-{local_id}-charts[data-window='24h'][data-drawn]")

    def one_point() -> bool:
        page.goto(f"{stack}/machines/{local_id}/?window=24h")
        charts.wait_for()  # the socket's first state carries the default window, then 24 h
        return charts.locator(".chart-note").count() == 1
    eventually(one_point, 90, "the 24-h chart's first point (two samples, 10 s apart)", every=2)
    assert "one point so far" in charts.locator(".chart-head small").inner_text()
    figure = charts.locator("figure[data-series=rate]")
    assert figure.evaluate("f => f.querySelector('.plot')._uplot.data[1]"
                           ".filter(v => v != null).length") == 1
    page.wait_for_function(f"() => ({SERIES_PIXELS})(document.querySelector("
                           f"'#host-{local_id}-charts figure[data-series=rate]')) > 5",
                           timeout=10_000)
    charts.scroll_into_view_if_needed()
    shot(page, "chart-one-point", full_page=False)


def test_a_new_machine_reads_as_not_started_and_cannot_be_picked_for_a_proof(stack, page):
    machine_id = add_ssh_machine(page, stack, "dead-box")
    truth = api(page, f"/api/v1/machines/{machine_id}")
    assert truth["state"] == "registered" and truth["last_seen"] is None

    page.goto(f"{stack}/")
    row = page.locator(f"#host-{machine_id}-row")
    row.wait_for()
    badge = row.locator(".conn .badge")
    assert badge.inner_text() == "not started yet"
    assert "offline" not in row.locator(".conn").inner_text()
    # Not painted as an alarm: the row's cells have the same background as a live row's.
    # Both rows read in one go: pushes swap rows in at any time.
    new_bg, live_bg = page.evaluate("""ids => ids.map(id => getComputedStyle(
        document.querySelector(`#host-${id}-row td`)).backgroundColor)""",
        [machine_id, machine_named(page, "local")["id"]])
    assert new_bg == live_bg
    # ...and its badge is not the offline badge's red.
    offline_red = page.evaluate("""() => {
        const probe = document.createElement("span");
        probe.className = "badge badge-offline";
        document.body.append(probe);
        const red = getComputedStyle(probe).backgroundColor;
        probe.remove();
        return red;
    }""")
    assert page.evaluate(f"""() => getComputedStyle(document.querySelector(
        '#host-{machine_id}-row .conn .badge')).backgroundColor""") != offline_red
    # The summary: not among the offline ones, counted as not started.
    totals = page.locator("#fleet-totals")
    offline = sum(1 for m in api(page, "/api/v1/machines")
                  if m["state"] != "registered" and m["connected"] is False)
    assert totals.locator("[data-count=offline]").inner_text() == f"{offline} offline"
    assert totals.locator("[data-count=not-started]").inner_text() == "1 not started yet"
    shot(page, "fleet-new-machine")

    page.goto(f"{stack}/machines/{machine_id}/")
    assert page.locator(f"#host-{machine_id}-panel .conn .badge").inner_text() == \
        "not started yet"

    # The test-proof form lists only the machines that can prove now: running, engine online.
    page.goto(f"{stack}/proofs/new/")
    offered = [o for o in page.locator("#id_machine option").all_inner_texts()
               if not o.startswith("auto")]
    can_prove = sorted(m["name"] for m in api(page, "/api/v1/machines")
                       if m["state"] == "running" and m["connected"])
    assert offered == can_prove == ["local"]
    # A request naming the new machine anyway (an old tab, the API) is refused: no job, so no
    # failure charged to the machine and no alert.
    csrf = page.locator("form.proof-form input[name=csrfmiddlewaretoken]").input_value()
    answer = page.request.post(f"{stack}/proofs/new/", form={
        "csrfmiddlewaretoken": csrf, "machine": str(machine_id), "kind": "winning-post",
        "profile": "tiny", "count": "1", "priority": ""},
        headers={"Referer": f"{stack}/proofs/new/"})
    assert answer.status == 400 and "dead-box cannot take a test proof now: machine dead-box is registered" in answer.text()
    assert api(page, f"/api/v1/proofs?machine={machine_id}")["count"] == 0


def test_a_colleague_without_staff_sees_only_what_they_may_use(stack, page, browser):
    # Staff adds a colleague through the admin, as a person would.
    page.goto(f"{stack}/admin/auth/user/add/")
    page.fill("#id_username", VIEWER)
    page.fill("#id_password1", VIEWER_PASSWORD)
    page.fill("#id_password2", VIEWER_PASSWORD)
    page.locator("input[name=_save]").click()
    page.wait_for_url(re.compile(r".*/admin/auth/user/\d+/change/$"))

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    viewer = context.new_page()
    log_in(viewer, stack, VIEWER, VIEWER_PASSWORD)
    nav = viewer.locator("header.topbar").inner_text()
    assert "Autopilot" not in nav and "Notifications" not in nav and "Admin" not in nav
    for path, title in (("/autopilot/", "Not allowed"), ("/notify/", "Not allowed")):
        answer = viewer.goto(f"{stack}{path}")
        assert answer is not None and answer.status == 403, path
        assert viewer.url == f"{stack}{path}", "sent elsewhere (the admin's login?)"
        assert viewer.locator("h1").inner_text() == title
        assert "Only staff may use this page" in viewer.locator("main").inner_text()
        assert viewer.locator("header.topbar").get_by_role("link", name="Fleet").is_visible()
    shot(viewer, "not-allowed")
    context.close()


def row_of(element) -> dict:
    return element.evaluate("""e => { const r = e.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom, left: r.left, height: r.height}; }""")


def assert_box_beside_its_label(label) -> None:
    """The box and its words share one row, the box first, at the label's start."""
    box, whole = row_of(label.locator("input")), row_of(label)
    assert whole["top"] <= box["top"] and box["bottom"] <= whole["bottom"] + 0.5, (box, whole)
    assert whole["height"] < 2.2 * box["height"] + 8, (box, whole, label.inner_text())
    assert abs(box["left"] - whole["left"]) < 4, (box, whole)


def test_run_a_command_lists_boxes_beside_names_and_says_unreachable(stack, page):
    machine_id = add_ssh_machine(page, stack, "far-box")
    page.goto(f"{stack}/remote/machines/command/")
    labels = page.locator("#command-machines label.check")
    names = [t.strip() for t in labels.all_inner_texts()]
    assert names[0] == "Select all" and "far-box" in names
    for index in range(labels.count()):
        assert_box_beside_its_label(labels.nth(index))
    shot(page, "command-form")

    page.get_by_label("Select all").check()
    machines = page.locator("#command-machines input[name=machines]")
    assert all(machines.nth(i).is_checked() for i in range(machines.count()))
    page.get_by_label("Select all").uncheck()
    assert not any(machines.nth(i).is_checked() for i in range(machines.count()))
    page.get_by_label("far-box").check()
    assert page.get_by_label("Select all").evaluate("b => b.indeterminate") == \
        (machines.count() > 1)

    page.fill("#id_command", "uptime")
    page.fill("#id_timeout", "5")
    page.get_by_role("button", name="Run").click()
    result = page.locator(f"#command-{machine_id}")
    result.wait_for()
    assert result.locator("h2 [data-status]").inner_text() == "unreachable"
    assert "timed out" not in result.inner_text() and "exit status" not in result.inner_text()
    assert "cannot connect" in result.locator("pre").inner_text()
    # The output box scrolls by itself rather than growing the page.
    assert result.locator("pre").evaluate(
        "p => [getComputedStyle(p).overflowY, getComputedStyle(p).maxHeight]")[0] == "auto"
    events = api(page, "/api/v1/events?q=far-box")["items"]
    assert any("far-box=255" in e["message"] for e in events), events


def test_the_machine_page_guards_destroy_and_links_to_the_live_panel(stack, page):
    machine_id = add_ssh_machine(page, stack, "box-7")
    page.goto(f"{stack}/remote/machines/{machine_id}/")
    destroy = page.get_by_role("button", name="Destroy…")
    provision = page.get_by_role("button", name="Provision")
    start = page.get_by_role("button", name="Start engine", exact=True)
    style = "b => [getComputedStyle(b).backgroundColor, getComputedStyle(b).opacity]"
    # Destroy stands apart from the other actions; a disabled action looks disabled.
    assert destroy.evaluate(style)[0] != provision.evaluate(style)[0]
    assert start.is_disabled() and float(start.evaluate(style)[1]) < 0.7
    assert provision.is_enabled() and float(provision.evaluate(style)[1]) == 1.0
    shot(page, "machine-page")

    # Live panel and back, by links; the panel explains its cell colours.
    page.locator("#to-live-panel").click()
    page.wait_for_url(f"{stack}/machines/{machine_id}/")
    legend = page.locator(".cell-key .legend-item")
    assert legend.count() == len(PARTITION_PHASES) and "done" in legend.all_inner_texts()
    assert page.locator("#connection-badge").evaluate(
        "b => getComputedStyle(b).borderRadius") != page.locator(
        f"#host-{machine_id}-panel .conn .badge").evaluate("b => getComputedStyle(b).borderRadius")
    assert "page updates" in page.locator("header .page-updates").inner_text()
    assert page.locator(f"#host-{machine_id}-panel .conn").inner_text().startswith("engine")
    shot(page, "machine-panel")
    page.locator("#to-machine-page").click()
    page.wait_for_url(f"{stack}/remote/machines/{machine_id}/")

    # Destroy asks first: dismissed, nothing happens; accepted, the machine is killed.
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    destroy.click()
    assert asked == ["Destroy box-7? This cannot be undone."]
    assert api(page, f"/api/v1/machines/{machine_id}")["state"] == "registered"
    page.once("dialog", lambda d: d.accept())
    destroy.click()
    page.wait_for_load_state()
    assert api(page, f"/api/v1/machines/{machine_id}")["state"] == "killed"


def test_a_rented_machine_waits_for_its_address_before_provision_is_offered(
        stack, page, fake_vast):
    page.goto(f"{stack}/remote/offers/")
    if page.locator("input[name=api_key]").count():
        page.fill("input[name=api_key]", API_KEY)
        page.get_by_role("button", name="Save key").click()
    page.fill("#id_gpu_name", "RTX 4090")
    page.get_by_role("button", name="Search").click()
    # Nothing has benchmarked yet (the API's estimates are empty): the page says why the
    # estimate columns are empty and what fills them.
    assert all(o["proofs_per_hour"] is None for o in api(page, "/api/v1/offers"))
    assert "until a machine with these GPUs has benchmarked" in page.locator(
        "#no-estimates").inner_text()
    assert page.locator("#offers-table .no-estimate").first.get_attribute("title")
    page.locator("#offers-table tr[data-machine-id='40001']").get_by_role(
        "button", name="Rent…").click()
    page.locator("#rent-dialog").get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))
    machine_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    truth = api(page, f"/api/v1/machines/{machine_id}")
    assert truth["vast_instance_id"] in fake_vast.instances
    assert truth["host"] == "", truth  # the database: no SSH address yet

    assert "waiting for Vast to give one" in page.locator("#waiting-for-address").inner_text()
    provision = page.get_by_role("button", name="Provision")
    assert provision.is_disabled()
    assert "waiting for Vast to give an address" in provision.get_attribute("title")
    shot(page, "rented-waiting")


def test_a_failed_test_notification_says_why_in_plain_words_and_a_url_is_added_once(
        stack, page):
    url = f"json://127.0.0.1:{free_port()}/hook"  # nothing listens there
    page.goto(f"{stack}/notify/")
    page.fill("#id_name", "pager")
    page.fill("#id_url", url)
    page.get_by_role("button", name="Add channel").click()
    row = page.locator("#channels tr", has_text="pager")
    row.wait_for()
    row.get_by_role("button", name="Send test notification").click()
    result = row.locator("[id^=test-result-]")
    result.locator(".error").wait_for()
    said = result.inner_text()
    assert said.startswith("not sent:") and "connection refused" in said, said
    assert not re.search(r"\d{4}-\d\d-\d\d|WARNING|DEBUG|Errno", said), said
    page.reload()
    delivery = page.locator("#deliveries tbody tr").first
    assert "failed" in delivery.inner_text() and "works" not in delivery.inner_text()

    # The same URL again: a clear form error, and still one channel.
    page.fill("#id_name", "pager-2")
    page.fill("#id_url", url)
    page.get_by_role("button", name="Add channel").click()
    assert "this URL is already the channel pager" in page.locator(".channel-form").inner_text()
    assert page.locator("#channels tr", has_text="pager").count() == 1
    shot(page, "notifications")


def test_the_bad_machines_form_refuses_id_zero_and_other_scripts_digits(stack, page):
    page.goto(f"{stack}/remote/bad-machines/")
    # The browser's own check first: 0 is below the field's minimum, nothing is sent.
    field = page.locator("input[name=provider_machine_id]")
    field.fill("0")
    page.fill("input[name=reason]", "typo")
    assert field.evaluate("f => f.validity.rangeUnderflow")
    # A request that skips the browser's check (another client, an old page): 400, said why.
    csrf = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    for typed, said in (("0", "greater than or equal to 1"),
                        ("٤٠٠٠١", "using the digits 0-9")):
        answer = page.request.post(f"{stack}/remote/bad-machines/", form={
            "csrfmiddlewaretoken": csrf, "provider_machine_id": typed, "reason": "typo"},
            headers={"Referer": f"{stack}/remote/bad-machines/"})
        assert answer.status == 400 and said in answer.text(), (typed, answer.status)
    assert api(page, "/api/dashboard")["bad_machines"] == []


SCHEMES = ("light", "dark")
WIDTHS = {"wide": 1400, "phone": 390}


def test_the_changed_pages_fit_a_phone_in_both_colour_schemes(stack, browser):
    """Each page this issue changed, light and dark, wide and at 390 px: at 390 px nothing
    widens the page past the screen (wide tables scroll in their own box) and the nav is one
    row. Screenshots: test-output/browser/first-week-<page>-<scheme>-<width>.png."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, stack)
    machine_id = add_ssh_machine(page, stack, "phone-box")
    local_id = machine_named(page, "local")["id"]
    pages = {"fleet": "/", "machine-panel": f"/machines/{local_id}/",
             "machine-page": f"/remote/machines/{machine_id}/", "proof-new": "/proofs/new/",
             "proofs": "/proofs/",
             "command": "/remote/machines/command/", "notifications": "/notify/",
             "bad-machines": "/remote/bad-machines/"}
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)
        for width_name, width in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": 900})
            for name, path in pages.items():
                page.goto(stack + path)
                page.wait_for_load_state("networkidle")
                shot(page, f"{name}-{scheme}-{width_name}")
                if width_name != "phone":
                    continue
                overflow = page.evaluate("document.documentElement.scrollWidth")
                assert overflow <= width, (name, scheme, overflow)
                nav, link = page.evaluate("""() => [
                    document.querySelector("header.topbar nav").getBoundingClientRect().height,
                    document.querySelector("header.topbar nav a").getBoundingClientRect().height]""")
                assert nav < 2 * link, (name, nav, link)
    context.close()


def test_a_retry_from_two_tabs_is_one_retry_on_the_chosen_machine(stack, page, browser):
    local = machine_named(page, "local")
    job_id = start_proof(page, stack, "porep-c2", 71)
    page.get_by_role("button", name="Cancel").first.click()
    page.wait_for_function(
        "id => document.getElementById(`proof-${id}-status`).textContent.trim() === 'cancelled'",
        arg=job_id, timeout=120_000)

    second = page.context.new_page()  # the same proof in another tab, before any retry
    second.goto(page.url)
    page.reload()
    page.get_by_role("button", name="Retry").first.click()
    page.wait_for_url(lambda url: job_id not in url)
    second.get_by_role("button", name="Retry").first.click()
    second.wait_for_url(lambda url: job_id not in url)
    assert second.url == page.url
    assert "already retried" in second.locator(".messages").inner_text()

    retries = [p for p in api(page, "/api/v1/proofs?kind=porep-c2")["items"]
               if p["retry_of"] == job_id]
    assert len(retries) == 1, retries
    assert retries[0]["machine"] == local["id"], retries  # still the chosen machine


# How long a page may take to show what the engine said: a controller tick (0.5 s), the push,
# and a loaded machine. The Proofs list polled every 5 s before it followed the pushes.
CATCH_UP_MS = 3_500


def engine_pipelines(engine_port: int, job_ids: list[str]) -> dict[str, dict]:
    """The engine's own word on our jobs (by request id = job id): status, partitions done."""
    with urllib.request.urlopen(f"http://127.0.0.1:{engine_port}/status", timeout=5) as answer:
        pipelines = json.load(answer)["pipelines"]
    return {p["request_id"]: {"status": p["status"], "done": p["partitions_done"]}
            for p in pipelines if p["request_id"] in job_ids}


SHOWS_AT_LEAST = """truth => Object.entries(truth).every(([id, t]) => {
    const row = document.getElementById(`job-${id}`);
    if (!row) return false;
    const status = row.querySelector("td [data-job-status]").dataset.jobStatus;
    const final = ["done", "failed", "cancelled"];
    if (final.includes(t.status)) return status === t.status;
    if (final.includes(status) || t.done === 0) return true;
    const shown = row.cells[5].textContent.match(/(\\d+)\\/\\d+/);  // "70% 7/10"
    return shown !== null && Number(shown[1]) >= t.done;
})"""


def test_the_proofs_list_follows_the_engine_as_the_proof_page_does(stack, page, engine_port):
    """A batch of porep-c2 proofs (10 partitions each) watched on the Proofs list: every state
    the engine reports (partitions done, the end) reaches each row within a controller tick
    and a push, never at the next 5-s poll; a row never says running once its job ended; a
    running job's "so far" and time left run in the browser, as on its own page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{stack}/proofs/new/")
    page.select_option("#id_machine", label="local")
    page.select_option("#id_kind", "porep-c2")
    page.select_option("#id_profile", "tiny")
    page.fill("#id_count", "6")
    page.locator("form.proof-form").get_by_role("button", name="Start").click()
    page.wait_for_url(re.compile(r".*/proofs/\?kind=porep-c2$"))
    rows = page.locator("#proof-rows tr[id^=job-]")
    job_ids = [(rows.nth(i).get_attribute("id") or "").removeprefix("job-") for i in range(6)]
    assert len(set(job_ids)) == 6

    compared, seen_running = 0, False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        truth = engine_pipelines(engine_port, job_ids)
        try:
            page.wait_for_function(SHOWS_AT_LEAST, arg=truth, timeout=CATCH_UP_MS, polling=50)
        except PlaywrightTimeout as lag:
            shown = {i: page.locator(f"#job-{i}").inner_text() for i in truth}
            raise AssertionError(f"the list did not catch up with the engine within "
                                 f"{CATCH_UP_MS} ms:\nengine: {truth}\nlist: {shown}") from lag
        compared += 1
        running = [i for i, t in truth.items() if t["status"] == "running" and t["done"]]
        if running:
            # One read of the row: a push may replace it (done) between two reads.
            seen = page.evaluate("""id => { const r = document.getElementById(`job-${id}`);
                return r && {status: r.querySelector("td [data-job-status]").dataset.jobStatus,
                             ticks: r.querySelectorAll(".duration .tick").length,
                             etas: r.querySelectorAll("[data-eta]").length,
                             html: r.innerHTML}; }""", running[0])
            if seen and seen["status"] == "running":
                # its clocks run in the browser: the time left is one estimate, said in words
                assert seen["ticks"] == 1, seen["html"]
                assert seen["etas"] == 1, seen["html"]
                if not seen_running:
                    shot(page, "proofs-list-running")
            seen_running = True
        ended = [p for p in api(page, "/api/v1/proofs?kind=porep-c2")["items"]
                 if p["id"] in job_ids and p["status"] == "done"]
        if len(ended) == len(job_ids):
            break
    assert seen_running and compared >= 3, (compared, seen_running)
    # Ended (the database says so): each row says done, none says running.
    page.wait_for_function(SHOWS_AT_LEAST, arg={i: {"status": "done", "done": 10}
                                                for i in job_ids},
                           timeout=CATCH_UP_MS, polling=50)
    assert "running" not in page.locator("#proof-rows").inner_text()
    shot(page, "proofs-list")


def test_a_command_run_beside_the_stack_works_on_the_stacks_data(stack, page):
    """`manage.py machines list` in another shell, without VASTMGR_DATA_DIR, while the stack
    runs with its own data directory: it lists the stack's machines (as the JSON API has
    them) and says whose data it read, rather than the checkout's var/."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"VASTMGR_DATA_DIR", "DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    listed = subprocess.run([sys.executable, "manage.py", "machines", "list"], check=False, cwd=REPO,
                            env={**env, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    names = sorted(m["name"] for m in api(page, "/api/v1/machines") if m["state"] != "killed")
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == names, \
        listed.stdout
    said = listed.stderr
    assert "using the data directory of the stack ./dev up runs" in said, said
    assert f"not {REPO / 'var'}" in said, said


def test_the_timeline_labels_the_wait_for_parameters(stack, page):
    """A window-post proof (no other test here proves one, so the engine first generates its
    parameters, then loads them from disk): its timeline starts with the job's own waits, the
    engine's queue and its parameters, as labelled bars, so no stretch of it is blank and
    unexplained before the first partition."""
    job_id = start_proof(page, stack, "window-post", 72)
    wait_until_done_and_verified(page, job_id)
    timings = api(page, f"/api/v1/proofs/{job_id}")["timings"]
    assert timings["srs_load_ms"] >= 1, timings  # its parameters took time
    timeline = page.locator(f"#proof-{job_id} .gantt")
    params = timeline.locator(".gantt-job [data-wait=parameters]")
    assert params.inner_text().startswith("loading or generating parameters"), \
        timeline.inner_html()
    edges = timeline.evaluate("""t => [...t.querySelectorAll(".seg")].map(s => [
        parseFloat(s.style.left), parseFloat(s.style.left) + parseFloat(s.style.width),
        s.closest(".gantt-job") !== null])""")
    # Covered from the start: the job's waits begin at 0, the partitions where they end.
    assert min(left for left, _, _ in edges) <= 0.5, edges
    waits_end = max(right for _, right, job in edges if job)
    first_partition = min(left for left, _, job in edges if not job)
    assert abs(first_partition - waits_end) < 3, edges
    assert "loading or generating parameters" in timeline.locator(".legend").inner_text()
    shot(page, "proof-timeline", full_page=False)


FOCUS_RING = """() => {
    const e = document.activeElement, style = getComputedStyle(e);
    return {tag: e.tagName, text: (e.innerText || e.name || e.id || "").trim().slice(0, 40),
            style: style.outlineStyle, width: parseFloat(style.outlineWidth),
            colour: style.outlineColor, background: getComputedStyle(e.parentElement).backgroundColor};
}"""


def tab_to(page, target, limit: int = 80) -> None:
    """Press Tab until `target` has the focus, as a person without a mouse does; it must
    show a focus ring when it gets there."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if target.evaluate("e => e === document.activeElement"):
            ring = page.evaluate(FOCUS_RING)
            assert ring["style"] != "none" and ring["width"] >= 2, ring
            assert ring["colour"] != ring["background"], ring
            return
    raise AssertionError(f"{target} not reached with Tab in {limit} presses")


def test_the_main_actions_work_from_the_keyboard(stack, browser):
    """Log in, run test proofs, cancel one and retry it, add a machine and destroy it (with
    its confirmation), with Tab, Enter and Space only; every control on the way shows where
    the focus is, in both colour schemes."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{stack}/accounts/login/")
    page.keyboard.type(USER)  # the username field has the focus first
    tab_to(page, page.locator("#id_password"))
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{stack}/")

    # Six snap-update proofs: the engine gets three (two workers and one ahead), the others
    # wait in the dashboard's queue.
    page.goto(f"{stack}/proofs/new/")
    tab_to(page, page.locator("#id_machine"))
    page.keyboard.press("ArrowDown")  # from "auto" to the one machine that can prove
    tab_to(page, page.locator("#id_kind"))
    page.keyboard.type("snap")
    tab_to(page, page.locator("#id_count"))
    page.keyboard.press("Control+A")
    page.keyboard.type("6")
    tab_to(page, page.locator("form.proof-form").get_by_role("button", name="Start"))
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/proofs/\?kind=snap-update$"))
    mine = api(page, "/api/v1/proofs?kind=snap-update")["items"][:6]
    assert [p["status"] for p in mine].count("queued") >= 1, mine
    waiting = next(p["id"] for p in mine if p["status"] == "queued")
    tab_to(page, page.locator(f"#job-{waiting}").get_by_role("button", name="Cancel"))
    page.keyboard.press("Space")
    page.locator(f"#job-{waiting} td [data-job-status=cancelled]").wait_for()
    assert api(page, f"/api/v1/proofs/{waiting}")["status"] == "cancelled"
    tab_to(page, page.locator(f"#job-{waiting}").get_by_role("button", name="Retry"))
    page.keyboard.press("Enter")
    retry_id = eventually(lambda: next((
        p["id"] for p in api(page, "/api/v1/proofs?kind=snap-update")["items"]
        if p["retry_of"] == waiting), None), 30, "the retry made from the keyboard")
    page.locator(f"#job-{retry_id}").wait_for()  # back on the list, which shows it
    csrf = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    for proof in [*mine, {"id": retry_id}]:  # the engine is free again for the next test
        page.request.post(f"{stack}/api/v1/proofs/{proof['id']}/cancel",
                          headers={"X-CSRFToken": csrf, "Referer": f"{stack}/proofs/"})

    # Add a machine, then destroy it: the confirmation answers to the keyboard too.
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    page.goto(f"{stack}/remote/machines/add/")
    name = "keys-box"
    for field, value in (("#id_name", name), ("#id_host", "127.0.0.1"),
                         ("#id_ssh_port", str(free_port())), ("#id_private_key", key)):
        tab_to(page, page.locator(field))
        page.keyboard.press("Control+A")
        page.keyboard.type(value)
    tab_to(page, page.get_by_role("button", name="Add without testing"))
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))
    machine_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    tab_to(page, page.get_by_role("button", name="Destroy…"))
    page.keyboard.press("Enter")
    eventually(lambda: api(page, f"/api/v1/machines/{machine_id}")["state"] == "killed", 30,
               "the machine destroyed from the keyboard")
    assert asked == [f"Destroy {name}? This cannot be undone."]

    # The ring shows in the dark scheme too, on the page and on the top bar.
    page.emulate_media(color_scheme="dark")
    page.goto(f"{stack}/proofs/new/")
    tab_to(page, page.locator("header.topbar").get_by_role("link", name="Proofs"))
    tab_to(page, page.locator("form.proof-form").get_by_role("button", name="Start"))
    context.close()
