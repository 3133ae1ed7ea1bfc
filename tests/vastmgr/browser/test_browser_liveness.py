"""One liveness, on the real stack (`manage.py up`) in Chromium: numbers a page shows as running
are the engine's only while the engine is live and the page is connected.

- The engine frozen with SIGSTOP while a partition is on a device: once its row, its panel and
  the proof's page say it is not live, no clock on them moves (a worker's busy time and busy
  total, SRS "last used", the engine's uptime, a phase's duration, the ETA), and each says how
  old it is ("as of N s ago").
- The page's own socket cut (the dashboard process killed while its supervisor is held, so
  nothing answers): every machine's state reads "unknown" and no clock runs; when the
  dashboard is back, the page reconnects and the rows say `live` again.
"""

import os
import signal
import time

from tests.conftest import eventually, free_port
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import log_in, running_stack, screenshot
from tests.vastmgr.browser.test_browser_proofs import DESKTOP, start_proof
from tests.vastmgr.browser.test_browser_truth import engine_status, engine_url, pipeline_of

pytestmark = test_browser.pytestmark
param_cache, browser = test_browser.param_cache, test_browser.browser

WATCH_SECONDS = 4.0  # how long a stopped clock is watched: several of the browser's ticks
NOT_LIVE_MS = 30_000  # 3 missed intervals make a machine stale; the push follows within a tick

# The running clocks of a page, each read without its "as of" note (an age, which runs). A
# clock is what a person reads: the visible text of its cell.
CLOCKS = """
(selectors) => selectors.flatMap(sel => [...document.querySelectorAll(sel)].map(el => {
  const copy = el.cloneNode(true);
  copy.querySelectorAll(".as-of").forEach(note => note.remove());
  const note = el.querySelector(".as-of");
  return {where: sel, text: copy.textContent.replace(/\\s+/g, " ").trim(),
          asOf: note ? note.textContent.replace(/\\s+/g, " ").trim() : null,
          running: el.querySelectorAll(".tick:not(.age)").length};
}))
"""


def pid_of(*marks: str) -> int:
    """The one process whose command line holds every mark."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(mark in line for mark in marks):
            found.append(int(entry))
    assert len(found) == 1, (marks, found)
    return found[0]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def watch_clocks(pages: dict, selectors: dict) -> dict:
    """Every clock of every page, read again and again for WATCH_SECONDS: each read's texts."""
    reads: dict = {name: [] for name in pages}
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        for name, page in pages.items():
            reads[name].append(page.evaluate(CLOCKS, selectors[name]))
        pages["panel"].wait_for_timeout(250)  # the browser's clocks tick once a second
    return reads


def test_a_frozen_engine_stops_every_clock_and_each_says_as_of_when(
        tmp_path, clean_env, param_cache, browser):
    engine_port = free_port()
    with running_stack(tmp_path, clean_env, param_cache, engine_port=engine_port) as stack:
        host_pk, engine = engine_url(clean_env)
        context = browser.new_context(viewport=DESKTOP)  # one operator, three tabs
        proof = context.new_page()
        log_in(proof, stack)
        # snap-update: 16 partitions, seconds of device work on the tiny profile
        job_id = start_proof(proof, stack, "snap-update", 41)
        panel, fleet = context.new_page(), context.new_page()
        panel.goto(f"{stack}/machines/{host_pk}/")
        fleet.goto(f"{stack}/")
        def proving_after_a_partition_is_done() -> bool:
            status = engine_status(engine)
            pipeline = pipeline_of(status, job_id)
            return bool(pipeline) and any(w["state"] == "proving" for w in status["gpu_workers"]) \
                and any(p["state"] == "done" for p in pipeline["partitions"])

        # Until one of its partitions has been on a device for a while.
        eventually(proving_after_a_partition_is_done, test_browser.PROOF_TIMEOUT_MS / 1000,
                   "no partition reached a device", every=0.05)
        pid = pid_of("cuzk_engine", "serve", f"127.0.0.1:{engine_port}")
        os.kill(pid, signal.SIGSTOP)
        try:
            fleet.wait_for_function(
                "pk => (document.getElementById(`host-${pk}-row`) || {dataset: {}})"
                ".dataset.conn !== 'live'", arg=host_pk, timeout=NOT_LIVE_MS)
            panel.wait_for_function(
                "pk => document.getElementById(`host-${pk}-panel`).dataset.conn !== 'live'",
                arg=host_pk, timeout=NOT_LIVE_MS)
            proof.wait_for_function(
                "id => document.getElementById(`proof-${id}`).dataset.hostStale === 'true'",
                arg=job_id, timeout=NOT_LIVE_MS)
            selectors = {
                "panel": [f"#host-{host_pk}-panel .worker-proving",
                          f"#host-{host_pk}-panel tr[data-circuit] td:nth-child(5)"],
                "fleet": [f"#host-{host_pk}-row .uptime-cell"],
                "proof": [f"#proof-{job_id} .eta", f"#proof-{job_id} .panel-head small.muted"],
            }
            reads = watch_clocks({"panel": panel, "fleet": fleet, "proof": proof}, selectors)
            for name, page in (("panel", panel), ("fleet", fleet), ("proof", proof)):
                screenshot(page, f"liveness-frozen-{name}")
        finally:
            os.kill(pid, signal.SIGCONT)
        shown = {name: [clock for read in page_reads for clock in read]
                 for name, page_reads in reads.items()}
        assert any("busy total" in c["text"] for c in shown["panel"]), shown["panel"]
        assert any("ago" in c["text"] for c in shown["panel"] if "td" in c["where"]), \
            "no SRS row with its last use"
        assert shown["fleet"], "no uptime on the row"
        for name, page_reads in reads.items():
            first = page_reads[0]
            for later in page_reads[1:]:
                assert [c["text"] for c in later] == [c["text"] for c in first], \
                    f"a clock on the {name} moved while the engine was frozen:\n{first}\n{later}"
            for clock in first:
                assert clock["running"] == 0, clock
                if any(ch.isdigit() for ch in clock["text"]):
                    assert clock["asOf"] and clock["asOf"].startswith("as of "), clock


def test_a_page_that_lost_its_socket_says_unknown_and_stops_its_clocks(
        tmp_path, clean_env, param_cache, browser):
    with running_stack(tmp_path, clean_env, param_cache) as stack:
        page = browser.new_page(viewport=DESKTOP)
        log_in(page, stack)
        host_pk, _ = engine_url(clean_env)
        row = f"#host-{host_pk}-row"
        page.wait_for_function(
            """sel => document.getElementById('connection-badge').textContent === 'live'
                 && document.querySelector(sel)?.dataset.conn === 'live'""", arg=row)
        port = stack.rsplit(":", 1)[1]
        dashboard = pid_of("daphne", "-p", port)
        supervisor = parent_of(dashboard)
        os.kill(supervisor, signal.SIGSTOP)  # held: it would start the dashboard again
        try:
            os.kill(dashboard, signal.SIGKILL)
            page.wait_for_function(
                "document.getElementById('connection-badge').className.includes('offline')",
                timeout=15_000)
            states = page.evaluate(
                """sel => [...document.querySelectorAll(`${sel}, ${sel} [data-conn]`)].map(
                     el => [el.tagName, el.dataset.conn, el.classList.contains('badge')
                            ? el.textContent.trim() : null])""", row)
            seen = page.locator(f"{row} .seen").text_content()
            uptime = page.locator(f"{row} .uptime-cell").text_content()
            page.wait_for_timeout(2_500)  # two of the browser's ticks
            uptime_later = page.locator(f"{row} .uptime-cell").text_content()
            screenshot(page, "liveness-page-offline")
        finally:
            os.kill(supervisor, signal.SIGCONT)
        assert states and all(conn == "unknown" for _, conn, _ in states), states
        assert all(text == "unknown" for _, _, text in states if text is not None), states
        assert "last seen" not in seen, seen
        assert uptime_later == uptime, (uptime, uptime_later)
        # The supervisor starts the dashboard again; the page reconnects and is sent whole.
        page.wait_for_function(
            """sel => document.getElementById('connection-badge').textContent === 'live'
                 && document.querySelector(sel)?.dataset.conn === 'live'""", arg=row,
            timeout=60_000)
        assert "last seen" in page.locator(f"{row} .seen").text_content()

