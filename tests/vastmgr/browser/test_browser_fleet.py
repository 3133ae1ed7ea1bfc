"""The fleet and host pages in a real browser (Debian's chromium via Playwright) against the
real stack (`manage.py up`), with one device worker so that a batch of porep-c2 jobs has to wait
for the device: the backlog must show as waiting work, values must change by pushes (no
reload), a pushed notice must show as a toast, and the host charts must render with axes,
time labels and hover values.
Screenshots of both pages at desktop width and at 390 px go to test-output/browser/."""

import re

import pytest

from tests.vastmgr import live_engine
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import (
    log_in,
    running_stack,
    screenshot,
)
from vastmgr.front.fragments import render_toast

param_cache, browser = live_engine.param_cache, test_browser.browser

BATCH = 4  # porep-c2 tiny: 10 partitions each, so 40 partitions for one device worker
# Covers the one-off parameter setup when the session's cache is still empty.
BACKLOG_TIMEOUT_MS = 240_000
DONE_TIMEOUT_MS = 300_000

pytestmark = test_browser.pytestmark  # browser tests, skipped without chromium

PAGE_TOKEN = "window.__pageToken = window.__pageToken || Math.random().toString(36).slice(2);"


@pytest.fixture
def one_worker_stack(tmp_path, clean_env, param_cache):
    """`./dev up` whose local engine has a single device worker."""
    config = tmp_path / "engine.toml"
    config.write_text('[gpus]\ndevices = "cpu"\ngpu_workers_per_device = 1\n'
                      f'[srs]\nparam_cache = "{param_cache}"\n')
    with running_stack(tmp_path, clean_env, param_cache, "--engine-config", str(config)) as url:
        yield url


@pytest.fixture
def context(browser):
    return browser.new_context(viewport={"width": 1400, "height": 900})


def hover_value(page) -> str:
    """The rate chart's legend value with the mouse over its newest point. The controller
    replaces the charts every 10 s, so a hover that lands on a chart being replaced is retried."""
    for attempt in range(5):
        over = page.locator(".charts .plot .u-over").first
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        over.hover(position={"x": box["width"] * (0.995 - 0.002 * attempt),
                             "y": box["height"] / 2})
        value = page.locator(".charts .plot").first.locator(".u-legend .u-series").nth(1) \
            .locator(".u-value").text_content()
        if re.search(r"\d", value):
            return value
    raise AssertionError(f"no value under the cursor: {value!r}")


def test_backlog_pushed_values_and_host_charts(one_worker_stack, context):
    stack = one_worker_stack
    fleet = context.new_page()
    log_in(fleet, stack)
    fleet.add_init_script(PAGE_TOKEN)
    sockets = []

    def keep_socket(route):
        route.connect_to_server()  # everything still flows both ways; we may add a message
        sockets.append(route)

    fleet.route_web_socket(re.compile(r".*/ws/fleet/$"), keep_socket)
    fleet.reload()
    row = fleet.locator("#fleet-rows tr", has_text="local")
    fleet.wait_for_function(
        "document.getElementById('connection-badge').textContent === 'live'")
    row.locator(".badge-live").wait_for()
    token = fleet.evaluate("window.__pageToken")

    # A batch from the form, in a second tab: confirmed on the page it lands on.
    form = context.new_page()
    form.goto(f"{stack}/proofs/new/")
    form.select_option("#id_machine", label="local")
    form.select_option("#id_kind", "porep-c2")
    form.select_option("#id_profile", "tiny")
    form.fill("#id_seed", "21")
    form.fill("#id_count", str(BATCH))
    form.locator("form.proof-form").get_by_role("button", name="Start").click()
    form.wait_for_url(re.compile(r".*/proofs/.*"))
    assert f"Queued {BATCH} porep-c2/tiny proofs on local." in form.locator(".messages").text_content()

    # The backlog: the engine holds what its one worker can start soon (a job on the device and
    # one ahead); a job it holds that no device has touched shows as waiting, with the
    # synthesized partitions ready for the device, in the row and in the totals; the rest of the
    # batch is held by the dashboard, counted as not dispatched. Pushed, not reloaded.
    fleet.bring_to_front()
    fleet.wait_for_function(
        """() => {
          const row = [...document.querySelectorAll('#fleet-rows tr')]
            .find(r => r.textContent.includes('local'));
          const jobs = row && row.querySelector('.waiting-jobs');
          const parts = row && row.querySelector('.waiting-parts');
          const held = document.querySelector('#fleet-totals .total-queued');
          return jobs && Number(jobs.textContent) >= 1 && parts && parseInt(parts.textContent) >= 5
            && held && Number(held.textContent) >= 1;
        }""", timeout=BACKLOG_TIMEOUT_MS, polling=100)
    assert int(fleet.locator("#fleet-totals .total-parts").text_content()) >= 5
    assert int(fleet.locator("#fleet-totals .total-waiting").text_content()) >= 1
    screenshot(fleet, "fleet-desktop")
    fleet.set_viewport_size({"width": 390, "height": 844})
    screenshot(fleet, "fleet-390")
    fleet.set_viewport_size({"width": 1400, "height": 900})

    # Every proof lands in the 24 h count by pushes; the backlog drains to zero.
    fleet.wait_for_function(
        """n => {
          const row = [...document.querySelectorAll('#fleet-rows tr')]
            .find(r => r.textContent.includes('local'));
          return row && row.querySelector('.ok').textContent.trim() === String(n)
            && row.querySelector('.waiting-jobs').textContent.trim() === '0';
        }""", arg=BATCH, timeout=DONE_TIMEOUT_MS, polling=200)
    assert fleet.evaluate("window.__pageToken") == token, "the fleet page was reloaded"

    # A notice as the controller pushes it (the controller side is tested in test_fleet_truth):
    # it appears over the page and can be dismissed.
    sockets[-1].send(render_toast("error", "Proof 1234abcd (porep-c2/tiny) failed on local: boom",
                                  "/proofs/"))
    toast = fleet.locator("#toasts .toast-error", has_text="failed on local: boom")
    toast.wait_for()
    assert toast.is_visible()
    toast.get_by_role("button", name="Dismiss").click()
    toast.wait_for(state="detached")

    # The host page: charts drawn by uPlot with labelled axes, time ticks and hover values.
    row.get_by_role("link", name="local").click()
    fleet.wait_for_url(re.compile(r".*/machines/\d+/$"))
    token = fleet.evaluate("window.__pageToken")
    charts = fleet.locator(".charts")
    charts.locator(".window-picker a", has_text="15 min").click()
    fleet.wait_for_function(
        """() => {
          const c = document.querySelector('.charts[data-window="15m"]');
          return c && c.querySelectorAll('.plot canvas').length === 2
            && c.querySelector('.chart-rate');
        }""", timeout=60_000, polling=200)
    axes = fleet.evaluate(
        """() => [...document.querySelectorAll('.charts .plot')].map(p => ({
             labels: p._uplot.axes.map(a => a.label),
             ticks: p._uplot.axes[0]._values || []}))""")
    assert [a["labels"] for a in axes] == [["time (local)", "proofs/min"],
                                           ["time (local)", "GPU busy %"]], axes
    assert all(any(re.search(r"\d{1,2}:\d\d", str(t)) for t in a["ticks"]) for a in axes), axes
    assert float(charts.locator(".chart-rate").text_content()) > 0

    assert hover_value(fleet).endswith("/min")

    # The controller's next push carries the default window; the chosen one stays.
    fleet.wait_for_function(
        "() => document.querySelector('.charts').getAttribute('data-window') === '15m'"
        " && document.querySelector('.charts').dataset.drawn && "
        "document.querySelectorAll('.charts .plot canvas').length === 2", timeout=30_000)

    # The SRS entry's "last used" age keeps up with the clock while the idle engine sends
    # nothing new (counted on in the browser, re-rendered with each heartbeat push).
    age = """() => {
      const el = document.querySelector('.panel table.grid [data-tick-base]');
      return el ? parseInt(el.textContent) : NaN;
    }"""
    first = fleet.evaluate(age)
    fleet.wait_for_function(f"() => ({age})() >= {first + 3}", timeout=10_000)
    assert fleet.evaluate("window.__pageToken") == token, "the host page was reloaded"
    screenshot(fleet, "host-desktop")
    fleet.set_viewport_size({"width": 390, "height": 844})
    fleet.wait_for_function(  # the charts follow the narrow layout
        "() => [...document.querySelectorAll('.charts .plot')].every("
        "p => p._uplot.width <= document.documentElement.clientWidth)")
    screenshot(fleet, "host-390")

    # An SRS id in the wrong shape is caught by the form before anything is sent.
    fleet.set_viewport_size({"width": 1400, "height": 900})
    circuit = fleet.locator(".srs-form input[name=circuit_id]")
    circuit.fill("winning-post:tiny")
    assert circuit.evaluate("el => el.validity.patternMismatch")
    circuit.fill("winning-post.tiny")
    assert circuit.evaluate("el => el.checkValidity()")

    # A clock whose fragment spent 3 s on its way (a busy controller) is not left 3 s behind:
    # it runs from its render time, with the two clocks' offset taken from the quickest
    # fragment, so it reads 3 s ahead of an identical clock that arrived at once.
    fleet.evaluate("""() => {
      const now = Date.now() / 1000;
      for (const [id, transit] of [["quick-clock", 0.01], ["late-clock", 3.0]]) {
        const el = document.createElement("span");
        el.id = id; el.className = "tick"; el.textContent = "unticked";
        el.setAttribute("data-tick-base", "10.000");
        el.setAttribute("data-tick-age", "0.000");
        el.setAttribute("data-tick-rendered", (now - transit).toFixed(3));
        el.setAttribute("data-tick-digits", "1");
        document.body.appendChild(el);
      }
    }""")
    fleet.wait_for_function("() => !document.getElementById('late-clock').textContent"
                            ".startsWith('unticked')", timeout=5_000)
    quick, late = (float(fleet.locator(f"#{name}").text_content().split()[0])
                   for name in ("quick-clock", "late-clock"))
    assert 2.7 <= late - quick <= 3.1, (quick, late)
    assert 10.0 <= quick <= 12.0, quick
