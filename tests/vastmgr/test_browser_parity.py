"""vast-manager parity in a real browser (Debian's chromium via Playwright) against the served
stack (`manage.py up`) with the strict fake Vast as the provider: keyboard shortcuts (and that
they are ignored while typing), the bad-hosts page, the BAD badge that unmarks after a confirm,
the offers multi-select and the rent dialog's minimum rate and $/day, a rent, the fleet table's
server-side sort and filter surviving the socket's full state, the SSH-command copy button and
destroy with its confirm dialog. Screenshots of the fleet and offers pages go to
test-output/browser/ (parity-fleet.png, parity-offers.png)."""

import asyncio
import math
import re
import threading
from decimal import Decimal

import asyncssh
import pytest

from tests.vastmgr import test_browser
from tests.vastmgr.remote.fake_vast import FakeVast
from tests.vastmgr.test_browser import log_in, running_stack, screenshot

param_cache, browser = test_browser.param_cache, test_browser.browser

pytestmark = test_browser.pytestmark

API_KEY = "vast-browser-key-0123456789abcdef"
# The automation lists Vast instances once a minute (its first pass ran before the key was set).
RECONCILE_TIMEOUT_MS = 120_000
PAGE_TOKEN = "window.__pageToken = window.__pageToken || Math.random().toString(36).slice(2);"


@pytest.fixture
def fake_vast():
    """The fake Vast on its own event loop in a thread, for the stack's processes to call."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    vast = FakeVast(API_KEY, boot_s=(3600.0, 7200.0))
    asyncio.run_coroutine_threadsafe(vast.start(), loop).result(30)
    for machine_id, gpus in ((40001, 1), (40002, 2), (40003, 1)):
        vast.add_offer(gpu_name="RTX 4090", num_gpus=gpus, machine_id=machine_id)
    try:
        yield vast
    finally:
        asyncio.run_coroutine_threadsafe(vast.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def stack(tmp_path, clean_env, param_cache, fake_vast):
    with running_stack(tmp_path, {**clean_env, "VAST_URL": fake_vast.url}, param_cache) as url:
        yield url


@pytest.fixture
def page(browser, stack):
    context = browser.new_context(viewport={"width": 1680, "height": 950})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack)
    page = context.new_page()
    page.add_init_script(PAGE_TOKEN)
    log_in(page, stack)
    return page


def offer_row(page, machine_id: int):
    return page.locator(f"#offers-table tr[data-machine-id='{machine_id}']")


def test_an_operator_drives_the_parity_features(stack, page, fake_vast):
    # Keys: o goes to the offers, but not while typing in a field.
    page.keyboard.press("o")
    page.wait_for_url(f"{stack}/remote/offers/")
    page.fill("input[name=api_key]", API_KEY)
    page.get_by_role("button", name="Save key").click()
    page.fill("#id_gpu_name", "b")  # typing "b" in a field: no shortcut
    assert page.url.startswith(f"{stack}/remote/offers/")
    page.keyboard.press("Escape")
    page.fill("#id_gpu_name", "RTX 4090")
    page.get_by_role("button", name="Search").click()
    assert page.locator("#offers-table tr[data-offer-id]").count() == 3

    # b: the bad-hosts page; mark one machine bad with a reason.
    page.locator("body").click(position={"x": 5, "y": 300})
    page.keyboard.press("b")
    page.wait_for_url(f"{stack}/remote/bad-hosts/")
    page.fill("input[name=provider_machine_id]", "40002")
    page.fill("input[name=reason]", "kernel panics")
    page.get_by_role("button", name="Mark bad").click()
    page.locator("#bad-hosts", has_text="kernel panics").wait_for()

    # Its offer shows a BAD badge; clicking it asks, Esc keeps it, Unmark removes it.
    page.go_back()
    page.go_back()
    page.reload()
    badge = offer_row(page, 40002).get_by_role("button", name=re.compile("^BAD"))
    badge.click()
    dialog = page.locator("#unmark-dialog")
    assert dialog.is_visible() and "kernel panics" in dialog.text_content()
    page.keyboard.press("Escape")
    assert not dialog.is_visible()
    page.check("input[name=hide_bad]")
    page.get_by_role("button", name="Search").click()
    assert offer_row(page, 40002).count() == 0 and page.locator("#hidden-bad").is_visible()
    page.uncheck("input[name=hide_bad]")
    page.get_by_role("button", name="Search").click()
    offer_row(page, 40002).get_by_role("button", name=re.compile("^BAD")).click()
    dialog.get_by_role("button", name="Unmark").click()
    page.wait_for_load_state()
    assert offer_row(page, 40002).get_by_role("button", name=re.compile("^BAD")).count() == 0

    # Multi-select: the rent dialog lists both, with $/day and ceil($/h ÷ max $/proof).
    for machine_id in (40001, 40002):
        offer_row(page, machine_id).locator(".select-offer").check()
    assert page.locator(".selected-count").text_content() == "2 selected"
    page.get_by_role("button", name="Rent selected…").click()
    rent = page.locator("#rent-dialog")
    rows = rent.locator(".rent-summary tbody tr")
    assert rows.count() == 2
    screenshot(page, "parity-offers")
    page.fill("#rent-dialog input[name=max_price_per_proof]", "0.01")
    for index in range(2):
        dph = float(rows.nth(index).get_attribute("data-dph"))
        assert rows.nth(index).locator(".min-rate").text_content() == str(
            math.ceil(Decimal(str(dph)) / Decimal("0.01")))
        assert rows.nth(index).locator(".per-day").text_content() == f"${dph * 24:.2f}"
    page.keyboard.press("Escape")
    assert not rent.is_visible()

    # Rent one: the machine page; the values are remembered for next time.
    offer_row(page, 40003).get_by_role("button", name="Rent…").click()
    page.fill("#rent-dialog input[name=max_price_per_proof]", "0.02")
    rent.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))
    assert "it must benchmark at least" in page.locator(".messages").text_content()
    page.goto(f"{stack}/remote/offers/")
    assert page.locator("#rent-dialog input[name=max_price_per_proof]").input_value() == "0.02"

    # An SSH host, added through the form (never tested: it does not exist).
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    page.goto(f"{stack}/remote/hosts/add/")
    page.fill("#id_name", "ssh-box")
    page.fill("#id_host", "127.0.0.1")
    page.fill("#id_ssh_port", "2222")
    page.fill("#id_private_key", key)
    page.fill("#id_price_per_hour", "0.3")
    page.get_by_role("button", name="Add without testing").click()
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))

    # The fleet: sorted by $/h on the server, the cards, the SSH copy button.
    page.goto(f"{stack}/")
    page.get_by_role("link", name="$/h · spent").click()
    page.wait_for_url(re.compile(r".*\?sort=dph$"))
    names = page.locator("#fleet-rows tr .host-cell a.truncate").all_text_contents()
    [(instance_id, instance)] = fake_vast.instances.items()
    by_price = sorted([(0.3, "ssh-box"), (instance["dph_total"], f"vast-{instance_id}")])
    assert names == [name for _, name in by_price] + ["local"], names  # no price: last
    assert page.locator("[data-state-count='running'] b").text_content() == "1"
    box = page.locator("#fleet-rows tr", has_text="ssh-box")
    box.get_by_role("button", name="Copy the SSH command for ssh-box").click()
    page.locator("#toasts", has_text="Copied: ssh -p 2222 root@127.0.0.1").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == "ssh -p 2222 root@127.0.0.1"

    # Vast reports the instance's GPU figures; the next reconcile (once a minute) lists them,
    # and the pushed cards say how old that listing is.
    instance.update(gpu_util=73.0, gpu_temp=64.0, mem_usage=12.5, mem_limit=64.0)
    page.locator(".stat-card.vast-age[data-vast-age]:not([data-vast-age=''])").wait_for(
        timeout=RECONCILE_TIMEOUT_MS)
    assert re.search(r"\d+ s\s*Vast data old", page.locator(".vast-age").inner_text())
    page.reload()
    vast_row = page.locator("#fleet-rows tr", has_text=f"vast-{instance_id}")
    assert "73 %" in vast_row.locator(".gpu-util-cell").inner_text()
    assert vast_row.locator(".temp-cell").inner_text() == "64 °C"
    assert vast_row.locator(".ram-cell").inner_text() == "12.5 / 64 GB"
    assert "not reported" in page.locator("#fleet-rows tr", has_text="ssh-box").locator(
        ".temp-cell").inner_text()
    screenshot(page, "parity-fleet")

    # A filtered table keeps its rows when the socket sends its full state (on connect): the
    # socket carries the page's query and sends that page's rows.
    page.goto(f"{stack}/?state=registered")
    page.wait_for_function(
        "document.getElementById('connection-badge').textContent === 'live'")
    shown = page.locator("#fleet-rows tr .host-cell a.truncate").all_text_contents()
    assert "local" not in shown and "ssh-box" in shown, shown

    # Destroy asks first; Cancel keeps it, Destroy kills it and returns to the same view.
    box = page.locator("#fleet-rows tr", has_text="ssh-box")
    box.get_by_role("button", name="Destroy").click()
    destroy = page.locator("#destroy-dialog")
    assert "ssh-box" in destroy.locator(".machine-name").text_content()
    destroy.get_by_role("button", name="Cancel").click()
    assert not destroy.is_visible() and box.count() == 1
    box.get_by_role("button", name="Destroy").click()
    destroy.get_by_role("button", name="Destroy").click()
    page.wait_for_url(f"{stack}/?state=registered")
    assert page.locator("#fleet-rows tr", has_text="ssh-box").count() == 0

    # r reloads the page (a new page token); l opens the manager log.
    token = page.evaluate("window.__pageToken")
    page.keyboard.press("r")
    page.wait_for_function(f"window.__pageToken !== {token!r}")
    page.keyboard.press("l")
    page.wait_for_url(f"{stack}/events/")
