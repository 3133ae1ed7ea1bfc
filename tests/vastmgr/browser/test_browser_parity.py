"""vast-manager parity in a real browser (Debian's chromium via Playwright) against the served
stack (`manage.py up`) with the strict fake Vast as the provider: keyboard shortcuts (and that
they are ignored while typing), the bad-hosts page, the BAD badge that unmarks after a confirm,
the offers multi-select and the rent dialog's minimum rate and $/day, a rent, the fleet table's
server-side sort and filter surviving the socket's full state, the SSH-command copy button and
destroy with its confirm dialog; a row expanded inline (keyboard, live panel, logs per source,
kept across a full-state swap); bulk ignore; an upstream cuzk worker rented from the dialog
whose instance calls home while its machine page follows. Each checks what is shown against the
fake Vast, the engine or the database (through the JSON API) at that moment. Screenshots go to
test-output/browser/ (parity-fleet.png, parity-offers.png, parity-row-expanded.png)."""

import asyncio
import itertools
import json
import math
import re
import threading
import time
import urllib.request
from decimal import Decimal

import asyncssh
import pytest

from devtools.fake_vast import FakeVast
from tests.conftest import free_port
from tests.vastmgr.browser import test_browser
from tests.vastmgr.browser.test_browser import log_in, running_stack, screenshot
from vastmgr.front.detail import LOG_POLL_S

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
def ports():
    """The call-home listener's and the local engine's ports: free ones, never the defaults
    another stack on this machine may hold."""
    return {"callhome": free_port(), "engine": free_port()}


@pytest.fixture
def stack(tmp_path, clean_env, param_cache, fake_vast, ports):
    env = {**clean_env, "VAST_URL": fake_vast.url,
           "VASTMGR_CALLHOME_PORT": str(ports["callhome"])}
    with running_stack(tmp_path, env, param_cache, engine_port=ports["engine"]) as url:
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
    page.wait_for_url(f"{stack}/remote/bad-machines/")
    page.fill("input[name=provider_machine_id]", "40002")
    page.fill("input[name=reason]", "kernel panics")
    page.get_by_role("button", name="Mark bad").click()
    page.locator("#bad-hosts", has_text="kernel panics").wait_for()
    assert {b["machine_id"]: b["reason"] for b in api(page, "/api/dashboard")["bad_machines"]} \
        == {"40002": "kernel panics (by ops)"}

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
    assert api(page, "/api/dashboard")["bad_machines"] == []

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
    # Interruptible: the bid shows, starts at the highest minimum bid of the offers chosen, and
    # prices each offer at it (its disk plus the bid).
    bid = rent.locator("input[name=bid_price]")
    assert not bid.is_visible()
    rent.locator("input[name=offer_type][value=bid]").check()
    offers = [page.locator(f"#offer-{rows.nth(i).locator('td').first.text_content()}")
              for i in range(2)]
    min_bids = [float(offer.get_attribute("data-min-bid")) for offer in offers]
    assert bid.is_visible() and bid.input_value() == f"{max(min_bids):.4f}"
    for index, offer in enumerate(offers):
        at_bid = float(offer.get_attribute("data-dph")) - \
            float(offer.get_attribute("data-dph-base")) + max(min_bids)
        assert rows.nth(index).locator(".dph").text_content() == f"${at_bid:.3f}"
        assert rows.nth(index).locator(".min-bid").text_content() == f"${min_bids[index]:.4f}"
    rent.locator("input[name=offer_type][value=on-demand]").check()
    assert not bid.is_visible()
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
    page.goto(f"{stack}/remote/machines/add/")
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
    # What bills now: the SSH host its price; the instance, still loading, only its disk.
    loading = instance["storage_cost"] * instance["disk_space"] / 720
    by_price = sorted([(0.3, "ssh-box"), (loading, f"vast-{instance_id}")])
    assert names == [name for _, name in by_price] + ["local"], names  # no billing: last
    assert page.locator("[data-state-count='running'] b").text_content() == "1"
    box = page.locator("#fleet-rows tr", has_text="ssh-box")
    box.get_by_role("button", name="Copy the SSH command for ssh-box").click()
    page.locator("#toasts", has_text="Copied: ssh -p 2222 root@127.0.0.1").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == "ssh -p 2222 root@127.0.0.1"

    # Vast reports the instance's GPU figures; the next reconcile (once a minute) lists them,
    # and the pushed cards say how old that listing is.
    # (An earlier reconcile may have listed the instance already: wait for these figures.)
    instance.update(gpu_util=73.0, gpu_temp=64.0, mem_usage=12.5, mem_limit=64.0)
    vast_row = page.locator("#fleet-rows tr", has_text=f"vast-{instance_id}")
    vast_row.locator(".gpu-util-cell", has_text="73 %").wait_for(timeout=RECONCILE_TIMEOUT_MS)
    assert re.search(r"\d+ s\s*Vast data old", page.locator(".vast-age").inner_text())
    page.reload()
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


def api(page, path: str):
    """The database's view through the JSON API, in this page's session (the oracle)."""
    answer = page.request.get(page.url.split("/", 3)[0] + "//" + page.url.split("/", 3)[2] + path)
    assert answer.ok, (path, answer.status)
    return answer.json()


class CallHome:
    """An image built for vast-manager, calling home as main.go's protocol says, with the
    deployment secret its rental put in its environment."""

    def __init__(self, port: int, secret: str):
        self.url, self.secret = f"http://127.0.0.1:{port}", secret

    def send(self, path: str, body: bytes | dict, headers: dict | None = None):
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        request = urllib.request.Request(self.url + path, data=data, method="POST", headers={
            "Authorization": f"Bearer {self.secret}", **(headers or {})})
        with urllib.request.urlopen(request, timeout=30) as answer:
            raw = answer.read()
            return json.loads(raw) if raw else None


def fleet_row(page, name: str):
    return page.locator("#fleet-rows tr[data-host]", has=page.locator(
        f".host-cell a.truncate:text-is('{name}')"))


def console_errors(page) -> list[str]:
    """What the page logs as an error (htmx's "no target" among them) or throws, from now on."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def under_its_row(page, machine_id: str) -> bool:
    """Whether the row's detail follows it, read in one go: a row found first and asked
    after may be one a push has just replaced (detached, with nothing after it)."""
    return page.evaluate("""id => document.getElementById(`host-${id}-row`).nextElementSibling
                                 === document.getElementById(`host-${id}-detail`)""", machine_id)


def log_reads(page, machine_id) -> list[tuple[float, str]]:
    """Each request the page makes for a row's logs, from now on: (time, what asked: the logs
    part's own poll is `host-N-logs`, a tab is its button)."""
    reads: list[tuple[float, str]] = []
    path = f"/fragments/fleet/{machine_id}/logs/"
    page.on("request", lambda request: path in request.url and reads.append(
        (time.monotonic(), request.headers.get("hx-trigger", ""))))
    return reads


def polls_kept_the_open_detail(page, machine_id: str) -> str:
    """The page's sockets close cleanly (as when daphne restarts) and the fleet's finds nothing
    listening when it tries again: the page polls the same fragments over HTTP, the badge says
    so, and each polled table body leaves the open row's detail where it was: the same element
    (its logs untouched) under its row, the toggle saying so. The detail's own socket comes
    back by itself, and says nothing about the fleet's: the badge stays "polling". Afterwards
    the fleet's socket is let through again. Returns the address the refused sockets went to."""
    dead_end = f"ws://127.0.0.1:{free_port()}/"
    page.evaluate("""([id, deadEnd]) => {
        window.__keptDetail = document.getElementById(`host-${id}-detail`);
        window.__polledBodies = 0;  // table bodies swapped in while the socket is refused
        new MutationObserver(records => records.forEach(r => r.addedNodes.forEach(node => {
            if (node.id === "fleet-rows") window.__polledBodies++;
        }))).observe(document.getElementById("fleet-table"), {childList: true});
        window.__createWebSocket = htmx.createWebSocket;
        htmx.createWebSocket = url => window.__createWebSocket(
            url.includes("/ws/fleet/") ? deadEnd : url);
        window.__detailSocket = false;
        for (const el of [document.querySelector(".live[ws-connect^='/ws/fleet/']"),
                          window.__keptDetail.querySelector("[ws-connect]")])
            el["htmx-internal-data"].webSocket.socket.close(1000);
    }""", [machine_id, dead_end])
    page.wait_for_function(
        "document.getElementById('connection-badge').textContent === 'polling'")
    # The first poll goes at once, the next 5 s later: two polled bodies swapped in.
    page.wait_for_function("window.__polledBodies >= 2", timeout=15_000)
    page.wait_for_function("() => window.__detailSocket")
    kept = page.evaluate("""id => {
        const row = document.getElementById(`host-${id}-row`);
        return {same: document.getElementById(`host-${id}-detail`) === window.__keptDetail,
                under: row.nextElementSibling === window.__keptDetail,
                expanded: row.querySelector(".row-toggle").getAttribute("aria-expanded"),
                badge: document.getElementById("connection-badge").textContent};
    }""", machine_id)
    page.evaluate("() => { htmx.createWebSocket = window.__createWebSocket; }")
    assert kept == {"same": True, "under": True, "expanded": "true", "badge": "polling"}, kept
    return dead_end


def test_rows_expand_inline_and_an_upstream_worker_is_rented_and_calls_home(
        stack, page, fake_vast, ports):
    # The local engine's row opens from the keyboard: its facts, its live panel, its logs.
    errors = console_errors(page)
    row = fleet_row(page, "local")
    machine_id = row.get_attribute("data-host")
    reads = log_reads(page, machine_id)
    toggle = row.locator(".row-toggle")
    assert toggle.get_attribute("aria-expanded") == "false"
    page.evaluate("""() => {
        window.__detailMessages = [];
        document.addEventListener("htmx:wsOpen", event => {
            if (event.target.closest(".row-detail")) window.__detailSocket = true; }, true);
        document.addEventListener("htmx:wsAfterMessage", event => {
            if (event.target.closest(".row-detail"))
                window.__detailMessages.push(event.detail.message); }, true);
    }""")
    toggle.focus()
    page.keyboard.press("Enter")
    detail = page.locator(f"#host-{machine_id}-detail")
    detail.wait_for()
    assert toggle.get_attribute("aria-expanded") == "true"
    assert under_its_row(page, machine_id)
    truth = api(page, f"/api/v1/machines/{machine_id}")
    assert f"{truth['provider']} · {truth['state']}" in detail.locator(".facts").inner_text()
    page.wait_for_function("window.__detailSocket === true")
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['engine']}/status", timeout=10) as r:
        engine_seq = json.load(r)["seq"]
    # An idle engine: the panel shows the snapshot the engine is at now (or one pushed since).
    # Found by id at each look: every push replaces the panel element.
    page.wait_for_function(
        "([id, seq]) => Number(document.querySelector(`#host-${id}-detail #host-${id}-panel`)"
        "?.getAttribute('data-snapshot-seq')) >= seq", arg=[machine_id, engine_seq])
    assert "No logs pushed" in detail.locator(".detail-logs").inner_text()
    # Its charts are drawn, and the controller's pushes to the host's socket (the charts with
    # each history sample, every 10 s) land in the detail: no part of them without a target.
    page.wait_for_function(
        "id => document.querySelectorAll(`#host-${id}-detail #host-${id}-charts .plot`)"
        ".length === 2 && [...document.querySelectorAll(`#host-${id}-charts .plot`)]"
        ".every(plot => plot._uplot)", arg=machine_id)
    page.wait_for_function(
        "id => window.__detailMessages.slice(1).some(m => m.includes(`host-${id}-charts`))",
        arg=machine_id, timeout=30_000)
    assert errors == []

    # The socket's full state replaces the table body (and the detail row with it): the row is
    # open again at once, under its row, with its toggle still saying so.
    page.evaluate("""async () => {
        window.__detailSocket = false;
        const html = await (await fetch("/fragments/fleet/")).text();
        const t = document.createElement("template"); t.innerHTML = html;
        for (const fresh of [...t.content.children]) {
            const old = fresh.id && document.getElementById(fresh.id);
            if (old) { old.replaceWith(fresh); htmx.process(fresh); }
        }
    }""")
    detail.wait_for()
    row = fleet_row(page, "local")
    assert row.locator(".row-toggle").get_attribute("aria-expanded") == "true"
    assert under_its_row(page, machine_id)
    # The re-fetched detail's panel connects (as a person sees it live before closing it; a
    # socket closed while still connecting makes the browser log a failed connection).
    page.wait_for_function("() => window.__detailSocket")
    dead_end = polls_kept_the_open_detail(page, machine_id)
    # Pressed again: it closes, and its logs are read no more (one poll period and a half).
    # A push may replace the row between the focus and the key: then the key reached nothing,
    # the row is still open, and a person presses again on the row they now see.
    toggle = row.locator(".row-toggle").element_handle()
    toggle.focus()
    page.keyboard.press(" ")
    page.wait_for_function("t => !t.isConnected || t.getAttribute('aria-expanded') === 'false'",
                           arg=toggle)
    if row.locator(".row-toggle").get_attribute("aria-expanded") == "true":
        row.locator(".row-toggle").focus()
        page.keyboard.press(" ")
    detail.wait_for(state="detached")
    assert row.locator(".row-toggle").get_attribute("aria-expanded") == "false"
    closed_at, polls = time.monotonic(), len(reads)
    page.wait_for_timeout(LOG_POLL_S * 1500)
    assert reads[polls:] == [] and all(at < closed_at for at, _ in reads)
    # The fleet's socket is back (after the extension's backoff). The browser logged each
    # connection refused while it was away, and htmx the error event: the test's doing.
    page.wait_for_function("document.getElementById('connection-badge').textContent === 'live'",
                           timeout=60_000)
    errors[:] = [error for error in errors if dead_end not in error and error != "[object Event]"]
    assert errors == []

    # Offers: a bulk rent of two makes two machines (Vast and the database agree).
    for machine in (40004, 40005):
        fake_vast.add_offer(gpu_name="RTX 4090", machine_id=machine)
    page.goto(f"{stack}/remote/offers/")
    page.fill("input[name=api_key]", API_KEY)
    page.get_by_role("button", name="Save key").click()
    page.fill("#id_gpu_name", "RTX 4090")
    page.get_by_role("button", name="Search").click()
    for machine in (40004, 40005):
        offer_row(page, machine).locator(".select-offer").check()
    page.get_by_role("button", name="Rent selected…").click()
    page.locator("#rent-dialog").get_by_role("button", name="Rent").click()
    page.wait_for_url(f"{stack}/")
    rented = {i["machine_id"]: f"vast-{i['id']}" for i in fake_vast.instances.values()}
    assert set(rented) == {40004, 40005}
    stored = {m["vast_machine_id"]: m["name"] for m in api(page, "/api/v1/machines")
              if m["provider"] == "vast"}
    assert stored == rented
    for name in rented.values():
        fleet_row(page, name).wait_for()
    # Every row opened at once (each pressed while the others' details are on their way): each
    # detail arrives under its own row.
    page.evaluate("() => document.querySelectorAll('#fleet-rows .row-toggle')"
                  ".forEach(toggle => toggle.click())")
    for name in ("local", *rented.values()):
        row = fleet_row(page, name)
        machine_id = row.get_attribute("data-host")
        page.locator(f"#host-{machine_id}-detail").wait_for(timeout=15_000)
        assert under_its_row(page, machine_id)
        assert row.locator(".row-toggle").get_attribute("aria-expanded") == "true"

    # Bulk ignore marks both machines bad (the database agrees); Remove on the bad-hosts page
    # takes one off again.
    page.goto(f"{stack}/remote/offers/?gpu_name=RTX+4090")
    for machine in (40002, 40003):
        offer_row(page, machine).locator(".select-offer").check()
    page.fill("#offers-form input[name=reason]", "too slow last time")
    page.get_by_role("button", name="Ignore selected (mark bad)").click()
    page.wait_for_load_state()
    marked = {b["machine_id"]: b["reason"] for b in api(page, "/api/dashboard")["bad_machines"]}
    assert marked == {"40002": "too slow last time (by ops)",
                      "40003": "too slow last time (by ops)"}
    for machine in (40002, 40003):
        assert offer_row(page, machine).get_by_role("button", name=re.compile("^BAD")).count() == 1
    page.goto(f"{stack}/remote/bad-machines/")
    page.get_by_role("button", name="Remove vast machine 40002 from the list").click()
    page.wait_for_load_state()
    assert [b["machine_id"] for b in api(page, "/api/dashboard")["bad_machines"]] == ["40003"]
    assert "40002" not in page.locator("#bad-hosts").inner_text()
    page.goto(f"{stack}/remote/offers/?gpu_name=RTX+4090")

    # Rent the third as an upstream cuzk worker: the image, env and onstart fields show only
    # for it, with the settings' defaults; what was typed is what Vast receives.
    offer_row(page, 40001).get_by_role("button", name="Rent…").click()
    rent = page.locator("#rent-dialog")
    fields = rent.locator(".upstream-fields")
    assert not fields.is_visible()
    rent.get_by_label("an upstream cuzk worker").check()
    assert fields.is_visible()
    assert rent.locator("input[name=image]").input_value() == "magik6k/curio-cuzk:latest"
    onstart = rent.locator("textarea[name=onstart]").input_value()
    assert onstart == "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
    rent.locator("textarea[name=env]").fill("PAVAIL=pa-secret\nPAVAIL_SERVER=192.0.2.7:22222")
    page.fill("#rent-dialog input[name=max_price_per_proof]", "0.01")
    min_rate = rent.locator(".rent-summary .min-rate").text_content()
    rent.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r".*/remote/machines/\d+/$"))
    machine_pk = int(re.search(r"/machines/(\d+)/", page.url).group(1))
    [(vast_id, instance)] = [(i, r) for i, r in fake_vast.instances.items()
                             if r["machine_id"] == 40001]
    env = dict(instance["extra_env"])
    secret = env.pop("VASTMGR_CALLHOME_SECRET")
    assert env == {"PAVAIL": "pa-secret", "PAVAIL_SERVER": "192.0.2.7:22222",
                   "MIN_RATE": f"{int(min_rate):.1f}"}
    assert (instance["image_uuid"], instance["onstart"], instance["image_runtype"]) == \
        ("magik6k/curio-cuzk:latest", onstart, "ssh_direc ssh_proxy")
    truth = api(page, f"/api/v1/machines/{machine_pk}")
    assert (truth["engine_flavour"], truth["state"]) == ("cuzk-upstream", "registered")

    # Its instance calls home with that secret; the machine page follows each state.
    home = CallHome(ports["callhome"], secret)
    me = home.send("/register", {"label": f"C.{vast_id}", "min_rate": float(env["MIN_RATE"])})
    badge = f"machine-{machine_pk}-state"  # re-read every 3 s: swapped, so found by id
    for path, body, state in (("/param-done", {"uuid": me["uuid"]}, "params_ready"),
                              ("/bench-done", {"uuid": me["uuid"], "rate": 1e6}, "benchmarked"),
                              ("/running", {"uuid": me["uuid"]}, "running")):
        home.send(path, body)
        page.wait_for_function("([id, s]) => document.getElementById(id).textContent === s",
                               arg=[badge, state], timeout=15_000)
        assert api(page, f"/api/v1/machines/{machine_pk}")["state"] == state
    home.send("/api/log-push", b"fetching params\nparams ok\n",
              {"X-Instance-UUID": me["uuid"], "X-Log-Source": "setup"})
    home.send("/api/log-push", b"cuzk up\n", {"X-Instance-UUID": me["uuid"],
                                                "X-Log-Source": "cuzk"})

    # Its fleet row opens on its call-home state and its logs, a tab per source.
    page.goto(f"{stack}/")
    upstream_reads = log_reads(page, machine_pk)
    row = fleet_row(page, f"vast-{vast_id}")
    row.locator(".row-toggle").click()
    detail = page.locator(f"#host-{machine_pk}-detail")
    detail.wait_for()
    assert detail.locator("[data-callhome-state]").get_attribute("data-callhome-state") == \
        "running"
    detail.get_by_role("tab", name="setup").click()
    page.wait_for_function(
        f"document.getElementById('host-{machine_pk}-logs').dataset.source === 'setup'")
    shown = detail.locator("pre.log").inner_text().splitlines()
    stored = [line["text"] for line in api(page, f"/api/instance-logs/{me['uuid']}?source=setup")]
    assert shown == stored == ["fetching params", "params ok"]
    # Switching tabs starts no second poll: the logs part's own reads stay one per period.
    detail.get_by_role("tab", name="cuzk").click()
    page.wait_for_function(
        f"document.getElementById('host-{machine_pk}-logs').dataset.source === 'cuzk'")
    detail.get_by_role("tab", name="all").click()
    page.wait_for_function(
        f"document.getElementById('host-{machine_pk}-logs').dataset.source === 'all'")
    page.evaluate(f"window.__shownLog = document.getElementById('host-{machine_pk}-logpanel')")
    page.wait_for_timeout(LOG_POLL_S * 2500)
    polls = [at for at, trigger in upstream_reads if trigger == f"host-{machine_pk}-logs"]
    assert len(polls) >= 2
    assert all(b - a > LOG_POLL_S * 0.8 for a, b in itertools.pairwise(polls)), polls
    # A quiet log is left as it is (a reader keeps their place); a pushed line appears.
    assert page.evaluate("window.__shownLog.isConnected")
    home.send("/api/log-push", b"proof 1 done\n", {"X-Instance-UUID": me["uuid"],
                                                     "X-Log-Source": "cuzk"})
    page.wait_for_function(
        f"document.getElementById('host-{machine_pk}-logpanel').textContent"
        ".includes('[cuzk] proof 1 done')", timeout=LOG_POLL_S * 3000)
    assert errors == []
    screenshot(page, "parity-row-expanded")
