"""One duration, on the real stack (`manage.py up`) in Chromium: a proof cancelled while some of
its partitions are on a device and others wait for one shows one duration on its page (the
"took" figure and the timeline's), in the proofs list and in the JSON API, and that duration is
the engine's own: from the job's submission on the engine until its last partition settled
(`GET /v1/proofs/<id>` on the engine, read here independently of the dashboard). The timeline
keeps the wait of every partition that was synthesized but never reached a device."""

import json
import urllib.request

from tests.conftest import eventually
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import PROOF_TIMEOUT_MS, log_in, screenshot
from tests.vastmgr.browser.test_browser_proofs import DESKTOP, start_proof, wait_for_status
from tests.vastmgr.browser.test_browser_truth import engine_status, engine_url, pipeline_of

pytestmark = test_browser.pytestmark
stack, param_cache, browser = test_browser.stack, test_browser.param_cache, test_browser.browser


def engine_record(engine: str, engine_job: str) -> dict:
    with urllib.request.urlopen(f"{engine}/v1/proofs/{engine_job}", timeout=10) as response:
        return json.loads(response.read())


def engine_duration_s(record: dict) -> float:
    """The engine's end, or the last partition's if one settled after it."""
    ends = [record["timings"]["total_ms"]]
    for p in record["partition_states"]:
        for start, length in (("synth_start_ms", "synth_ms"), ("gpu_start_ms", "gpu_ms"),
                              ("finalize_start_ms", "finalize_ms")):
            if p.get(start) is not None and p.get(length) is not None:
                ends.append(p[start] + p[length])
    return max(ends) / 1000


def shown_seconds(text: str) -> float:
    return float(text.strip().removesuffix("s").strip())


def test_a_cancelled_proof_has_one_duration_everywhere_and_keeps_its_waits(
        stack, browser, clean_env):
    page = browser.new_page(viewport=DESKTOP)
    log_in(page, stack)
    _, engine = engine_url(clean_env)
    # snap-update: 16 partitions on two device workers, so synthesized ones wait for a device
    job_id = start_proof(page, stack, "snap-update", 51)
    def one_on_a_device_and_one_waiting() -> bool:
        pipeline = pipeline_of(engine_status(engine), job_id)
        states = [p["state"] for p in pipeline["partitions"]] if pipeline else []
        if "gpu" in states and "synth_done" in states:
            return True
        assert not pipeline or pipeline["status"] == "running", pipeline
        return False

    eventually(one_on_a_device_and_one_waiting, PROOF_TIMEOUT_MS / 1000,
               "never a partition waiting beside one on a device", every=0.02)
    page.locator(f"#proof-{job_id}").get_by_role("button", name="Cancel").click()
    wait_for_status(page, job_id, "cancelled", timeout=60_000)
    page.wait_for_function(
        "id => document.getElementById(`proof-${id}`).dataset.settled === 'true'",
        arg=job_id, timeout=30_000, polling=50)
    page.reload()  # what a person opening the page now sees
    panel = page.locator(f"#proof-{job_id}")
    record = engine_record(engine, panel.get_attribute("data-engine-job"))
    assert record["status"] == "cancelled" and record.get("settled") is not False, record
    expected = engine_duration_s(record)
    screenshot(page, "duration-cancelled-proof")

    durations = panel.locator(".duration")
    assert durations.count() == 2, panel.text_content()  # "took" and the timeline's
    shown = {"took": shown_seconds(durations.nth(0).text_content()),
             "timeline": shown_seconds(durations.nth(1).text_content())}
    page.goto(f"{stack}/proofs/?q={job_id[:8]}")
    cell = page.locator(f"tr:has(a[href='/proofs/{job_id}/']) td.duration")
    shown["list"] = shown_seconds(cell.text_content())
    api = page.request.get(f"{stack}/api/v1/proofs/{job_id}").json()
    shown["api"] = round(api["duration_s"], 1)
    assert set(shown.values()) == {round(expected, 1)}, (shown, expected)

    # Every partition the engine synthesized that never reached a device keeps its wait.
    waited = [p["index"] for p in record["partition_states"]
              if p.get("synth_ms") is not None and p.get("gpu_start_ms") is None]
    assert waited, record["partition_states"]
    page.goto(f"{stack}/proofs/{job_id}/")
    rows = page.evaluate(
        """id => Object.fromEntries([...document.querySelectorAll(`#proof-${id} .gantt-row`)]
             .map(r => [r.querySelector('.gantt-label').textContent.trim(),
                        [...r.querySelectorAll('.seg')].map(s => s.classList[1])]))""", job_id)
    for index in waited:
        assert "seg-queue" in rows[f"P{index}"], (index, rows[f"P{index}"])
