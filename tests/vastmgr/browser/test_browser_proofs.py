"""The proofs pages in a real browser against the real stack (`manage.py up`): cancel a running
proof and retry it from the page, download the one-file archive and verify it with the engine's
own CLI, and at 390 px wide no page scrolls sideways. Screenshots go to test-output/browser/."""

import subprocess
import sys
import tarfile

from tests.conftest import REPO
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import (
    PROOF_TIMEOUT_MS,
    USER,
    log_in,
    screenshot,
    wait_until_done_and_verified,
)

pytestmark = test_browser.pytestmark
# The same stack as test_browser's (`manage.py up` on free ports, its own data dir).
stack, param_cache, browser = test_browser.stack, test_browser.param_cache, test_browser.browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1400, "height": 900}
LONG_NAME = "gpu-host-" + "x" * 91  # 100 characters, like the name in the issue


def logged_in(browser, stack, viewport):
    page = browser.new_page(viewport=viewport, accept_downloads=True)
    log_in(page, stack)
    return page


def start_proof(page, stack, kind: str, seed: int) -> str:
    page.goto(f"{stack}/proofs/new/")
    page.select_option("#id_machine", label="local")
    page.select_option("#id_kind", kind)
    page.select_option("#id_profile", "tiny")
    page.fill("#id_seed", str(seed))
    page.locator("form.proof-form").get_by_role("button", name="Start").click()
    page.wait_for_url(f"{stack}/proofs/*/")
    return page.url.rstrip("/").rsplit("/", 1)[1]


def wait_for_status(page, job_id: str, status: str, timeout=PROOF_TIMEOUT_MS):
    page.wait_for_function(
        """([id, status]) => {
          const s = document.getElementById(`proof-${id}-status`);
          return s && s.textContent.trim() === status;
        }""", arg=[job_id, status], timeout=timeout, polling=50)


def test_cancel_a_running_proof_then_retry_it_and_verify_the_downloaded_archive(
        stack, browser, tmp_path):
    page = logged_in(browser, stack, DESKTOP)
    # snap-update: 16 partitions, seconds of work on the tiny profile to catch it running
    job_id = start_proof(page, stack, "snap-update", 21)
    wait_for_status(page, job_id, "running")
    page.locator(f"#proof-{job_id}").get_by_role("button", name="Cancel").click()
    wait_for_status(page, job_id, "cancelled", timeout=60_000)
    assert "Cancel requested" in page.locator(".messages").text_content()
    panel = page.locator(f"#proof-{job_id}")
    assert panel.get_by_role("button", name="Cancel").count() == 0

    panel.get_by_role("button", name="Retry").click()
    page.wait_for_url(lambda url: "/proofs/" in url and job_id not in url)
    retry_id = page.url.rstrip("/").rsplit("/", 1)[1]
    assert page.locator(f"a[href='/proofs/{job_id}/']").count() == 1  # "retry of …"
    wait_until_done_and_verified(page, retry_id)
    screenshot(page, "proof-desktop")

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download all (tar.gz)").click()
    download = download_info.value
    assert download.suggested_filename == f"proof-{retry_id[:8]}.tar.gz"
    archive_path = tmp_path / download.suggested_filename
    download.save_as(archive_path)
    with tarfile.open(archive_path) as archive:
        archive.extractall(tmp_path / "proof", filter="data")
    result = subprocess.run([sys.executable, "-m", "cuzk_engine", "verify", str(tmp_path / "proof")],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "OK: 16 partition proof(s) verify" in result.stdout

    page.goto(f"{stack}/proofs/")
    rows = page.locator("#proof-rows tr")
    assert rows.count() == 2
    assert page.locator(f"#job-{job_id} .status").text_content() == "cancelled"
    assert page.locator(f"#job-{retry_id} .status").text_content() == "done"
    screenshot(page, "proofs-desktop")

    page.goto(f"{stack}/events/?level=info&q=cancel")
    assert page.locator("tbody tr", has_text=f"proof {job_id}: cancel requested").count() == 1


def no_sideways_scroll(page) -> dict:
    return page.evaluate("""() => ({scroll: document.documentElement.scrollWidth,
                                    inner: window.innerWidth})""")


def test_at_390_px_no_page_scrolls_sideways(stack, browser, clean_env):
    page = logged_in(browser, stack, PHONE)
    job_id = start_proof(page, stack, "winning-post", 3)
    # The list refreshes its rows in place (every 5 s) until the proof is done.
    page.goto(f"{stack}/proofs/")
    page.evaluate("window.__listToken = 1")
    page.wait_for_function(
        "id => document.querySelector(`#job-${id} .status`).textContent === 'done'",
        arg=job_id, timeout=PROOF_TIMEOUT_MS, polling=200)
    assert page.evaluate("window.__listToken") == 1, "the list was reloaded instead of refreshed"
    # A machine with a 100-character name (the case that stretched tables in the issue) and an
    # error event with a long message, written into the stack's own database.
    script = ("from vastmgr.fleet.models import Machine, Event; "
              f"m = Machine.objects.create(name='{LONG_NAME}', provider='ssh', "
              "host='127.255.0.1', enabled=False); "
              "Event.record('proof', 'proof failed: ' + 'a very long reason ' * 20, machine=m, "
              "level=Event.Level.ERROR); "
              "print(Machine.objects.get(name='local').pk)")
    local_pk = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO,
                              env=clean_env, check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
    pages = {"fleet": "/", "proofs": "/proofs/", "proof": f"/proofs/{job_id}/",
             "events": "/events/", "machine": f"/remote/machines/{local_pk}/"}
    for name, path in pages.items():
        page.goto(stack + path)
        page.wait_for_load_state("load")
        widths = no_sideways_scroll(page)
        screenshot(page, f"{name}-390")
        assert widths["scroll"] <= widths["inner"], (name, widths)
    page.goto(f"{stack}/events/")
    name_cell = page.locator(".truncate", has_text=LONG_NAME).first
    assert name_cell.get_attribute("title") == LONG_NAME
    assert name_cell.evaluate("el => el.scrollWidth > el.clientWidth")  # cut with an ellipsis
    assert page.locator("tr.level-error").count() >= 1


def test_dark_mode_follows_the_system_setting(stack, browser):
    page = logged_in(browser, stack, DESKTOP)
    colours = "() => [getComputedStyle(document.body).backgroundColor, " \
              "getComputedStyle(document.body).color]"
    page.goto(f"{stack}/proofs/")
    light = page.evaluate(colours)
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(colours)
    assert light == ["rgb(246, 247, 249)", "rgb(29, 35, 48)"]
    assert dark == ["rgb(17, 21, 28)", "rgb(227, 232, 239)"]
    table = page.locator("table.grid").first.evaluate("el => getComputedStyle(el).backgroundColor")
    assert table == "rgb(26, 32, 43)"  # surfaces follow too, not only the page
    screenshot(page, "proofs-dark")


def test_pushed_proof_actions_show_only_to_staff_and_the_owner(stack, browser, clean_env):
    """The proof panel (pushed to every viewer) carries Cancel/Retry hidden; the page shows them
    to staff and to whoever started the proof, never to another user."""
    script = ("from django.contrib.auth import get_user_model; "
              "from vastmgr.proofs.models import ProofJob; "
              "User = get_user_model(); "
              "User.objects.create_user('viewer', password='pw-for-viewer-1'); "
              f"owner = User.objects.get(username='{USER}'); "
              "print(ProofJob.objects.create(kind='winning-post', profile='tiny', seed=9, "
              "status='cancelled', requested_by=owner).pk)")
    job_id = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO,
                            env=clean_env, check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    retry = f"#proof-{job_id} .proof-actions button:has-text('Retry')"

    staff = logged_in(browser, stack, DESKTOP)
    staff.goto(f"{stack}/proofs/{job_id}/")
    staff.locator(retry).wait_for(state="visible")

    viewer = browser.new_page(viewport=DESKTOP)
    log_in(viewer, stack, "viewer", "pw-for-viewer-1")
    viewer.goto(f"{stack}/proofs/{job_id}/")
    viewer.wait_for_load_state("load")
    assert viewer.locator(retry).count() == 1  # in the page, as pushed to everyone ...
    assert not viewer.locator(retry).is_visible()  # ... but not shown to this user
