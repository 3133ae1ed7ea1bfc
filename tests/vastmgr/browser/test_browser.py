"""The dashboard in a real browser: Debian's chromium driven by Playwright against the real
stack (`manage.py up`: daphne, fleet controller, remote automation and a tiny-profile engine).
A test proof started from the form must move through its partitions on screen, by pushes over
the proof's websocket rather than reloads, and end verified. Screenshots go to test-output/."""

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, wait_for_http
from tests.vastmgr import live_engine

param_cache = live_engine.param_cache

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "test-output" / "browser"
USER, PASSWORD = "ops", "pw-for-browser-tests-1"
START_TIMEOUT = 120
# snap-update has 16 partitions at the tiny profile: enough steps to watch cells change.
# The budget covers the one-off parameter setup when the session's cache is still empty.
PROOF_TIMEOUT_MS = 300_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason=f"no chromium at {CHROMIUM} (set CHROMIUM_PATH; "
                              "Debian package `chromium`)"),
]

# Installed before any page script: remembers every partition phase the DOM shows, split into
# what the server rendered and what arrived later by swaps, and a token that a reload would lose.
OBSERVE_PHASES = """
(() => {
  window.__pageToken = Math.random().toString(36).slice(2);
  window.__phases = {initial: [], pushed: []};
  const record = (bucket, el) => {
    for (const c of el.classList) {
      if (c.startsWith("phase-") && !window.__phases[bucket].includes(c)) {
        window.__phases[bucket].push(c);
      }
    }
  };
  const scan = (bucket, root) => {
    if (root.matches && root.matches(".cells .cell")) record(bucket, root);
    if (root.querySelectorAll) root.querySelectorAll(".cells .cell").forEach(el => record(bucket, el));
  };
  let loaded = false;
  document.addEventListener("DOMContentLoaded", () => { scan("initial", document); loaded = true; });
  new MutationObserver(mutations => {
    if (!loaded) return;
    for (const m of mutations) m.addedNodes.forEach(node => scan("pushed", node));
  }).observe(document, {childList: true, subtree: true});
})();
"""


def stack_exited(proc: subprocess.Popen) -> Callable[[], str | None]:
    return lambda: proc.poll() is not None and f"the stack exited with {proc.returncode}"


@contextmanager
def running_stack(tmp_path: Path, clean_env: dict, param_cache: Path, *up_args: str,
                  engine_port: int | None = None):
    """`./dev up` on free ports (the engine on `engine_port` when given) with its own data
    dir; stopped with Ctrl-C like a user would. Yields the dashboard's base URL once the login
    page and the local engine answer."""
    port, engine_port = free_port(), engine_port or free_port()
    env = {**clean_env, "VASTMGR_ADMIN_USER": USER, "VASTMGR_ADMIN_PASSWORD": PASSWORD,
           "CUZK_PARAM_CACHE": str(param_cache)}
    log_path = tmp_path / "stack.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(port),
             "--engine-listen", f"127.0.0.1:{engine_port}",
             # A stack that names its call-home port (a test that calls home) keeps it.
             "--callhome-port", env.get("VASTMGR_CALLHOME_PORT") or str(free_port()), *up_args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", START_TIMEOUT, stack_exited(proc))
        wait_for_http(f"http://127.0.0.1:{engine_port}/status", START_TIMEOUT, stack_exited(proc))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / "stack.log").write_text(log_path.read_text())


@pytest.fixture
def stack(tmp_path, clean_env, param_cache):
    with running_stack(tmp_path, clean_env, param_cache) as url:
        yield url


@pytest.fixture
def browser():
    """Debian's chromium, launched through Playwright for one test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser):
    return browser.new_page(viewport={"width": 1400, "height": 900})


def log_in(page, stack: str, user: str = USER, password: str = PASSWORD) -> None:
    """Through the login form, as a person would; lands on the fleet page."""
    page.goto(f"{stack}/accounts/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{stack}/")


def wait_until_done_and_verified(page, job_id: str) -> None:
    """The proof page shows the job done and the dashboard's own verified badge, by pushes."""
    page.wait_for_function(
        """id => {
          const s = document.getElementById(`proof-${id}-status`);
          return s && s.textContent.trim() === "done"
            && [...document.querySelectorAll(`#proof-${id} .badge`)]
                 .some(b => b.textContent.trim() === "verified");
        }""", arg=job_id, timeout=PROOF_TIMEOUT_MS, polling=200)


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_test_proof_started_in_the_browser_moves_through_its_partitions_and_verifies(
        stack, page):
    log_in(page, stack)
    row = page.locator("#fleet-rows tr", has_text="local")
    row.wait_for()
    page.wait_for_function(
        "document.getElementById('connection-badge').textContent === 'live'")
    screenshot(page, "fleet-before")

    page.get_by_role("link", name="Run test proof").click()
    page.select_option("#id_machine", label="local")
    page.select_option("#id_kind", "snap-update")
    page.select_option("#id_profile", "tiny")
    page.fill("#id_seed", "7")
    page.add_init_script(OBSERVE_PHASES)
    proof_frames: list[str] = []
    page.on("websocket", lambda ws: ws.on(
        "framereceived", lambda frame: proof_frames.append(str(frame))
    ) if "/ws/proofs/" in ws.url else None)
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url)
            if frame == page.main_frame else None)
    page.locator("form.proof-form").get_by_role("button", name="Start").click()
    page.wait_for_url(f"{stack}/proofs/*/")
    job_id = page.url.rstrip("/").rsplit("/", 1)[1]
    token = page.evaluate("window.__pageToken")

    status = page.locator(f"#proof-{job_id}-status")
    wait_until_done_and_verified(page, job_id)
    screenshot(page, "proof-verified")

    assert status.text_content().strip() == "done"
    assert page.evaluate("window.__pageToken") == token, "the proof page was reloaded"
    assert [url for url in navigations if "/proofs/" in url] == [page.url]
    phases = page.evaluate("window.__phases")
    assert len(set(phases["pushed"])) >= 2, phases
    assert "phase-done" in phases["pushed"], phases
    assert page.locator(f"#proof-{job_id} .cells .cell").count() == 16
    assert page.locator(f"#proof-{job_id} .cells .phase-done").count() == 16
    assert len(proof_frames) >= 2 and any("phase-" in frame for frame in proof_frames[1:])
    assert page.locator("#connection-badge").text_content() == "live"
    assert "3072 bytes" in page.locator(f"#proof-{job_id}").text_content()  # 16 × 192

    page.locator(f"#proof-{job_id}").get_by_role("link", name="local").click()
    page.wait_for_url(f"{stack}/machines/*/")
    page.locator(f"a[href='/proofs/{job_id}/']").wait_for()
    screenshot(page, "host")

    page.get_by_role("link", name="Fleet", exact=True).first.click()
    page.wait_for_url(f"{stack}/")
    assert page.locator("#fleet-rows tr", has_text="local").locator(".ok").text_content() == "1"
    screenshot(page, "fleet-after")
