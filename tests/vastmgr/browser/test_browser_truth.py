"""What the pages show after a cancel, held against the engine, in a real browser on the real
stack (`manage.py up`): a proof cancelled while a partition is on a device ends with every
partition settled on its page and no worker proving it on the host panel, exactly as the
engine's own /status says at that moment. A 100-character host name keeps the fleet table on a
1440 px screen. Both pages are screenshotted in both colour schemes and every visible text is
checked for WCAG AA contrast (4.5:1)."""

import json
import subprocess
import sys
import time
import urllib.request

from tests.conftest import REPO
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import PROOF_TIMEOUT_MS, log_in, screenshot
from tests.vastmgr.browser.test_browser_proofs import (
    DESKTOP,
    LONG_NAME,
    start_proof,
    wait_for_status,
)

pytestmark = test_browser.pytestmark
stack, param_cache, browser = test_browser.stack, test_browser.param_cache, test_browser.browser

SETTLED = {"done", "failed", "cancelled"}
PUSH_LATENCY_MS = 2_000  # what a page may lag behind the engine (the oracle allows it)

# Every element with its own visible text: its colour against the first opaque background
# behind it (the colour-scheme's page background when none is), as WCAG computes contrast.
CONTRAST = """
() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const c = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * c(r) + 0.7152 * c(g) + 0.0722 * c(b);
  };
  const background = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return rgb(getComputedStyle(document.body).backgroundColor).slice(0, 3);
  };
  const low = [];
  for (const el of document.querySelectorAll("main *")) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const box = el.getBoundingClientRect();
    if (!own || box.width === 0 || box.height === 0) continue;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none") continue;
    const fg = lum(rgb(style.color)), bg = lum(background(el));
    const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
    if (ratio < 4.5) {
      low.push(`${el.tagName.toLowerCase()}.${[...el.classList].join(".")} ` +
               `"${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}:1`);
    }
  }
  return low;
}
"""


def engine_url(clean_env) -> str:
    script = ("from vastmgr.fleet.models import Machine; m = Machine.objects.get(name='local'); "
              "print(m.pk, m.engine_port)")
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO,
                         env=clean_env, check=True, capture_output=True, text=True)
    pk, port = out.stdout.strip().splitlines()[-1].split()
    return pk, f"http://127.0.0.1:{port}"


def engine_status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/status", timeout=10) as response:
        return json.loads(response.read())


def pipeline_of(status: dict, job_id: str) -> dict | None:
    return next((p for p in status["pipelines"] if p["request_id"] == job_id), None)


def shown_partitions(page, job_id: str) -> dict[int, str]:
    return {int(k): v for k, v in page.evaluate(
        """id => Object.fromEntries([...document.querySelectorAll(
             `#proof-${id} .cells [data-partition]`)].map(c => [c.dataset.partition,
                                                                c.dataset.phase]))""",
        job_id).items()}


def test_a_proof_cancelled_on_the_device_shows_every_partition_settled_as_the_engine_does(
        stack, browser, clean_env):
    page = browser.new_page(viewport=DESKTOP)
    log_in(page, stack)
    host_pk, engine = engine_url(clean_env)
    # snap-update: 16 partitions, seconds of device work on the tiny profile
    job_id = start_proof(page, stack, "snap-update", 31)
    deadline = time.monotonic() + PROOF_TIMEOUT_MS / 1000
    while True:  # until one of its partitions is on a device (the engine says so)
        pipeline = pipeline_of(engine_status(engine), job_id)
        if pipeline and any(p["state"] == "gpu" for p in pipeline["partitions"]):
            break
        assert time.monotonic() < deadline, "no partition reached a device"
        # Waiting for its turn or its parameters (queued) is fine; ended before a partition
        # reached a device is not.
        assert not pipeline or pipeline["status"] in ("queued", "running"), pipeline
        time.sleep(0.02)
    page.locator(f"#proof-{job_id}").get_by_role("button", name="Cancel").click()
    wait_for_status(page, job_id, "cancelled", timeout=60_000)
    page.wait_for_function(
        "id => document.getElementById(`proof-${id}`).dataset.settled === 'true'",
        arg=job_id, timeout=30_000, polling=50)

    before = engine_status(engine)
    shown = shown_partitions(page, job_id)
    after = engine_status(engine)
    panel = page.locator(f"#proof-{job_id}")
    assert panel.get_attribute("data-job-status") == "cancelled"
    assert panel.get_attribute("data-phase") == "cancelled"
    assert len(shown) == 16 and set(shown.values()) <= SETTLED, shown
    assert "cancelled" in shown.values()
    for status in (before, after):
        engine_pipeline = pipeline_of(status, job_id)
        if engine_pipeline is not None:  # listed until the engine's retention ends
            assert engine_pipeline["phase"] == "cancelled"
            assert {p["index"]: p["state"] for p in engine_pipeline["partitions"]} == shown
        assert not [w for w in status["gpu_workers"] if w["current_job"]
                    and w["current_job"] == (engine_pipeline or {}).get("job_id")]
    # the timeline's bars end where the partitions did, not at the page's edge
    assert "running phases as of the snapshot" not in panel.text_content()
    screenshot(page, "truth-cancelled-proof-light")

    page.goto(f"{stack}/machines/{host_pk}/")
    host = page.locator(f"#host-{host_pk}-panel")
    host.wait_for()
    engine_job = pipeline_of(engine_status(engine), job_id)
    # The result reached the proof page at once; the host panel follows the status stream,
    # so it may show the last in-flight snapshot for up to the push latency the oracle allows.
    page.wait_for_function(
        """([pk, job]) => {
          const panel = document.getElementById(`host-${pk}-panel`);
          return panel.dataset.conn === "live" && ![...panel.querySelectorAll("[data-worker]")]
            .some(w => w.dataset.workerState !== "idle" || (job && w.dataset.job === job));
        }""", arg=[host_pk, engine_job and engine_job["job_id"]], timeout=PUSH_LATENCY_MS,
        polling=50)
    before = engine_status(engine)
    workers = page.evaluate(
        """pk => [...document.querySelectorAll(`#host-${pk}-panel [data-worker]`)].map(
             w => [Number(w.dataset.worker), w.dataset.workerState, w.dataset.job])""", host_pk)
    after = engine_status(engine)
    engine_job = pipeline_of(before, job_id)
    for worker_id, state, job in workers:
        assert not (engine_job and job == engine_job["job_id"]), (worker_id, state, job)
        # nothing else runs: each worker is idle on the page as in both engine snapshots
        assert state == "idle" == before["gpu_workers"][worker_id]["state"] \
            == after["gpu_workers"][worker_id]["state"]
    if engine_job is not None:
        row = page.locator(f"#host-{host_pk}-panel [data-job='{engine_job['job_id']}']")
        assert row.get_attribute("data-phase") == "cancelled"
        cells = row.locator("[data-partition]")
        assert {cells.nth(i).get_attribute("data-phase") for i in range(cells.count())} <= SETTLED
    # A 100-character host name is cut with its full name in the tooltip, and keeps every
    # column of the fleet table on a 1440 px screen.
    script = (f"from vastmgr.fleet.models import Machine; Machine.objects.create(name='{LONG_NAME}', "
              "provider='ssh', host='127.255.0.1', enabled=False)")
    subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=clean_env,
                   check=True, capture_output=True)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{stack}/")
    # Cut with an ellipsis: asked of the row in the page until it holds, since the controller
    # pushes the page whole when it sees the new host and may replace the row under the read.
    page.wait_for_function(
        """name => [...document.querySelectorAll('#fleet-table a.truncate')].some(
             el => el.title === name && el.scrollWidth > el.clientWidth)""",
        arg=LONG_NAME, timeout=10_000)
    right = page.evaluate("""() => Math.max(...[...document.querySelectorAll('#fleet-table th')]
                                     .map(th => th.getBoundingClientRect().right))""")
    assert right <= 1440 and page.evaluate("document.documentElement.scrollWidth") <= 1440
    page.set_viewport_size(DESKTOP)
    low = {}
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for name, path in (("host", f"/machines/{host_pk}/"), ("proof", f"/proofs/{job_id}/")):
            page.goto(stack + path)
            page.wait_for_load_state("load")
            screenshot(page, f"truth-{name}-{scheme}")
            low[(name, scheme)] = page.evaluate(CONTRAST)
    assert not any(low.values()), low
