"""vast-manager parity on the fleet page: summary cards per state, the table sorted and filtered
on the server, the provider's hardware facts ("not reported", never 0, where nobody reports
them), SSH-command copy, destroy from the table, BAD badges that unmark, the provider data's
age. Rendering and permissions through the Django client; the browser parts are in
test_browser_parity.py."""

import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.http import QueryDict
from django.utils import timezone

from vastmgr.fleet import ledger
from vastmgr.fleet.models import Event, Machine, MachineStatus
from vastmgr.front import fragments, readmodel
from vastmgr.front.fleet_table import FleetTableForm, fleet_table
from vastmgr.proofs.models import ProofJob
from vastmgr.remote.models import BadMachine, RemoteMachine, Secret, VastSync

pytestmark = pytest.mark.django_db


def make(name, state="running", provider="ssh", price=None, gpu="", gpus=0, rate=None,
         facts=None, **fields):
    machine = Machine.objects.create(name=name, provider=provider, state=state, host=f"{name}.example",
                                     price_per_hour=price, gpu_name=gpu, gpu_count=gpus,
                                     bench_rate=rate, last_seen=timezone.now(), **fields)
    MachineStatus.objects.create(machine=machine, connected=True, interval=1, snapshot={"seq": 1})
    RemoteMachine.objects.create(machine=machine, billing_started=timezone.now() - timedelta(hours=1),
                              vast_facts=facts or {})
    if price is not None:
        ledger.bill(machine, "running", price, gpus=gpus, cause="rent",
                    at=timezone.now() - timedelta(hours=1))
    return machine


@pytest.fixture
def fleet():
    return {
        "a": make("alpha", price="0.5000", gpu="RTX 4090", gpus=2, rate=80, ssh_port=2222,
                  provider="vast", vast_machine_id=77,
                  facts={"gpu_util": 87.5, "gpu_temp": 71, "mem_usage": 10.2, "mem_limit": 64,
                         "start_date": time.time() - 7200, "num_gpus": 2,
                         "gpu_name": "RTX 4090"}),
        "b": make("bravo", price="0.2000", gpu="RTX 3090", gpus=1, rate=30,
                  facts={"gpu_util": 0.0, "cpu_ram": 128000}),
        "c": make("charlie", state="provisioning", price="0.9000"),
        "d": make("delta", state="benchmarked", price="0.1000", gpu="A100 SXM4", gpus=1),
    }


def test_summary_cards_count_machines_per_state_and_link_to_the_filter(admin_client, fleet):
    fleet["d"].kill("benchmark too slow")
    ProofJob.objects.create(kind="winning-post", profile="tiny", seed=1, machine=fleet["a"],
                            status=ProofJob.Status.DONE, finished_at=timezone.now())
    totals = admin_client.get("/").content.decode().split('id="fleet-totals"')[1]
    counts = dict(re.findall(r'data-state-count="(\w+)"><b>(\d+)</b>', totals))
    assert counts == {"running": "2", "benchmarking": "0", "provisioning": "1",
                      "registered": "0", "stopped": "0", "killed": "1"}
    assert 'href="?state=running"' in totals
    # What bills now (the killed one no longer) with the GPUs rented (2 + 1), from the ledger.
    assert re.search(r'<b class="total-dph" data-dph="1.600000">\$1.600</b><span>Total \$/h · '
                     r'<span class="total-gpus" data-gpus="3">3</span> GPUs rented', totals)
    assert '<b class="total-proofs-1h">1</b><span>Proofs/h · bench 110</span>' in totals


def test_the_table_sorts_and_filters_on_the_server(admin_client, fleet):
    def names(query):
        html = admin_client.get("/" + query).content.decode().split('id="fleet-rows"')[1]
        return re.findall(r'class="truncate" title="([^"]+)"', html)

    assert names("") == ["alpha", "bravo", "charlie", "delta"]
    assert names("?sort=-dph") == ["charlie", "alpha", "bravo", "delta"]
    assert names("?sort=rate") == ["bravo", "alpha", "charlie", "delta"]  # no rate: last
    assert names("?sort=-gpu_util") == ["alpha", "bravo", "charlie", "delta"]
    assert names("?state=running") == ["alpha", "bravo"]
    assert names("?state=benchmarking") == ["delta"]
    assert names("?q=3090") == ["bravo"]
    assert names("?q=nothing-like-it") == []
    fleet["c"].kill("gone")
    assert names("?state=killed") == ["charlie"] and "charlie" not in names("")
    # The sort links keep the filter and flip the direction of the current sort.
    html = admin_client.get("/?state=running&sort=dph").content.decode()
    assert 'href="?state=running&amp;sort=-dph"' in html and 'aria-sort="ascending"' in html
    # The page's socket, its poll URL and the socket fallback read the same rows.
    assert 'data-poll-url="/fragments/fleet/?state=running&amp;sort=dph"' in html
    assert 'ws-connect="/ws/fleet/?state=running&amp;sort=dph"' in html
    fragment = admin_client.get("/fragments/fleet/?state=running&sort=-dph").content.decode()
    assert re.findall(r'class="truncate" title="([^"]+)"', fragment) == ["alpha", "bravo"]


def test_the_table_is_paginated_and_each_page_reads_its_own_rows(admin_client, fleet,
                                                                  monkeypatch):
    monkeypatch.setattr(FleetTableForm, "PER_PAGE", 3)

    def names(path):
        html = admin_client.get(path).content.decode().split('id="fleet-rows"')[1]
        return re.findall(r'class="truncate" title="([^"]+)"', html)

    assert names("/") == ["alpha", "bravo", "charlie"]
    assert names("/?page=2") == names("/fragments/fleet/?page=2") == ["delta"]
    assert names("/?page=9") == ["delta"]  # past the end: the last page
    assert names("/?sort=-dph&page=2") == ["delta"]
    html = admin_client.get("/?sort=-dph").content.decode()
    assert 'href="?sort=-dph&amp;page=2"' in html and "page 1 of 2" in html
    assert 'ws-connect="/ws/fleet/?sort=-dph"' in html
    assert FleetTableForm(QueryDict("page=2")).is_valid()
    first, second = (fleet_table(query) for query in (b"", b"page=2"))
    assert first.page_key() != second.page_key() == fleet_table(b"page=2&q=").page_key()
    # What a page's socket tells the controller names the same page.
    assert fleet_table(second.canonical_query()).page_key() == second.page_key()
    assert [h.machine.pk for h in fleet_table(second.canonical_query()).page_rows(time.time())] \
        == [fleet["d"].pk]


@pytest.mark.parametrize("query", ["?sort=bogus", "?state=flying", "?q=" + "x" * 101])
def test_bad_table_parameters_are_a_400_with_the_reason(admin_client, fleet, query):
    page = admin_client.get("/" + query)
    assert page.status_code == 400 and b'class="form-errors"' in page.content
    assert b"ws-connect" not in page.content  # no socket to fill an unfiltered table
    fragment = admin_client.get("/fragments/fleet/" + query)
    assert fragment.status_code == 400 and b"Bad fleet table parameters" in fragment.content


def test_hardware_facts_are_the_providers_and_not_reported_otherwise(admin_client, fleet):
    html = admin_client.get("/").content.decode()
    alpha = html.split(f'id="host-{fleet["a"].pk}-row"')[1].split("</tr>")[0]
    assert "2 × RTX 4090" in alpha and "88 %" in alpha and "71 °C" in alpha
    assert "10.2 / 64 GB" in alpha and 'data-tick-base="72' in alpha  # up ~2 h (7200 s)
    assert 'data-gpu-util="87.5"' in alpha and 'data-gpu-temp="71.0"' in alpha
    assert 'data-copy="ssh -p 2222 root@alpha.example"' in alpha
    bravo = html.split(f'id="host-{fleet["b"].pk}-row"')[1].split("</tr>")[0]
    # Vast said 0 % for bravo: that is a value; its temperature nobody reported.
    assert "0 %" in bravo and "128 GB" in bravo and 'data-copy="ssh root@bravo.example"' in bravo
    temp = bravo.split('class="temp-cell"')[1].split("</td>")[0]
    assert "not reported" in temp and "°C" not in temp
    charlie = html.split(f'id="host-{fleet["c"].pk}-row"')[1].split("</tr>")[0]
    for cell in ("gpu-cell", "gpu-util-cell", "temp-cell", "ram-cell", "uptime-cell"):
        assert "not reported" in charlie.split(f'class="{cell}"')[1].split("</td>")[0], cell


def test_a_local_engine_has_no_ssh_command(admin_client):
    local = make("local", provider="local")
    row = admin_client.get("/").content.decode().split(f'id="host-{local.pk}-row"')[1]
    assert "copy-ssh" not in row.split("</tr>")[0]


def test_the_local_engine_cannot_be_destroyed(admin_client):
    local = make("local", provider="local")
    row = admin_client.get("/").content.decode().split(f'id="host-{local.pk}-row"')[1]
    assert "destroy-open" not in row.split("</tr>")[0]
    assert "Destroy" not in admin_client.get(f"/remote/machines/{local.pk}/").content.decode()
    # A hand-made post (or a stale page) is refused with the reason, and nothing changes.
    response = admin_client.post(f"/remote/machines/{local.pk}/destroy/", {"next": "/"})
    assert response.status_code == 409
    assert "local engine" in response.content.decode()
    local.refresh_from_db()
    assert local.state == Machine.State.RUNNING


def test_destroy_from_the_table_returns_to_it_and_needs_staff(client, admin_client, fleet):
    html = admin_client.get("/?state=running").content.decode()
    assert 'id="destroy-dialog"' in html and 'data-action-template="/remote/machines/0/destroy/"' in html
    machine = fleet["b"]
    response = admin_client.post(f"/remote/machines/{machine.pk}/destroy/",
                                 {"next": "/?state=running"})
    assert response.status_code == 302 and response.url == "/?state=running"
    machine.refresh_from_db()
    assert machine.state == Machine.State.KILLED
    # an offsite `next`, or one that is no path, is ignored
    for target in ("https://evil.example/", "0"):
        response = admin_client.post(f"/remote/machines/{fleet['c'].pk}/destroy/",
                                     {"next": target})
        assert response.url == f"/remote/machines/{fleet['c'].pk}/"
    viewer = User.objects.create_user("viewer", password="pw-123456789")
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert 'id="destroy-dialog"' not in page  # the row's button is hidden by data-staff="0"
    assert client.post(f"/remote/machines/{fleet['a'].pk}/destroy/").status_code == 403
    fleet["a"].refresh_from_db()
    assert fleet["a"].state == Machine.State.RUNNING


def test_a_bad_machine_shows_a_badge_that_unmarks(client, admin_client, fleet):
    bad = BadMachine.flag(77, "slow benchmark")
    html = admin_client.get("/").content.decode()
    row = html.split(f'id="host-{fleet["a"].pk}-row"')[1].split("</tr>")[0]
    assert f'data-bad-host="{bad.pk}"' in row and "slow benchmark" in row
    assert 'data-action-template="/remote/bad-machines/0/unmark/"' in html
    viewer = User.objects.create_user("viewer", password="pw-123456789")
    client.force_login(viewer)
    assert client.post(f"/remote/bad-machines/{bad.pk}/unmark/").status_code == 403  # our page: only staff
    assert BadMachine.objects.filter(pk=bad.pk).exists()
    response = admin_client.post(f"/remote/bad-machines/{bad.pk}/unmark/", {"next": "/"})
    assert response.status_code == 302 and response.url == "/"
    assert not BadMachine.objects.exists()
    assert Event.objects.filter(kind="bad_host", message__contains="unmarked by admin").exists()
    assert admin_client.post(f"/remote/bad-machines/{bad.pk}/unmark/").status_code == 404


def test_the_provider_datas_age_is_shown_and_warned_when_old(admin_client, fleet):
    assert "Vast data" not in admin_client.get("/").content.decode()  # no key: no Vast
    Secret.store(Secret.VAST_API_KEY, "vast-key-0123456789abcdef")
    assert "Vast data: not listed yet" in admin_client.get("/").content.decode()
    VastSync.mark(timezone.now() - timedelta(seconds=30))
    totals = admin_client.get("/").content.decode().split('id="fleet-totals"')[1]
    card = totals.split('data-vast-age="')[1]
    assert 28 <= float(card.split('"')[0]) < 60 and "stale" not in card.split("</div>")[0]
    VastSync.mark(timezone.now() - timedelta(seconds=VastSync.STALE_AFTER_S + 60))
    totals = admin_client.get("/").content.decode().split('id="fleet-totals"')[1]
    assert 'class="stat-card vast-age warn"' in totals and "provider figures are stale" in totals


def test_pushed_rows_and_totals_are_the_pages(admin_client, fleet):
    """The controller renders rows and totals without a request: same fragments."""
    hosts = readmodel.load_machines(time.time())
    row = fragments.render_fleet_row(next(h for h in hosts if h.machine.pk == fleet["a"].pk))
    assert 'class="small danger staff-only destroy-open"' in row and "88 %" in row
    assert 'data-state-count="running"' in fragments.render_fleet_totals(hosts)


def test_shortcuts_are_documented_and_named_on_the_links(admin_client):
    html = admin_client.get("/").content.decode()
    assert 'id="shortcuts"' in html and "<kbd>Esc</kbd>" in html
    for key in "olb":
        assert f'data-shortcut="{key}" aria-keyshortcuts="{key}"' in html


def test_an_engines_gpus_count_but_its_cpu_device_does_not(admin_client):
    cpu = make("cpu-engine", provider="local")
    cuda = make("cuda-engine", provider="local")
    MachineStatus.objects.filter(machine=cpu).update(snapshot={"seq": 1, "devices": [
        {"ordinal": 0, "name": "cpu", "backend": "cpu", "workers": [0, 1]}]})
    MachineStatus.objects.filter(machine=cuda).update(snapshot={"seq": 1, "devices": [
        {"ordinal": 0, "name": "RTX 4090", "backend": "cuda", "workers": [0]},
        {"ordinal": 1, "name": "RTX 4090", "backend": "cuda", "workers": [1]}]})
    html = admin_client.get("/").content.decode()

    def gpu_cell(machine):
        row = html.split(f'id="host-{machine.pk}-row"')[1]
        return row.split('class="gpu-cell">')[1].split("</td>")[0]

    assert "not reported" in gpu_cell(cpu) and gpu_cell(cuda) == "2 × RTX 4090"
    assert 'data-gpus="0">0</span> GPUs rented · 2 on engines' in html  # none billed


def test_the_machine_page_shows_the_vast_instances_details(admin_client, fleet):
    remote = RemoteMachine.objects.get(machine=fleet["a"])
    remote.vast_seen_at = timezone.now()
    remote.min_bench_rate = 63
    remote.save()
    html = admin_client.get(f"/remote/machines/{fleet['a'].pk}/").content.decode()
    facts = html.split('id="vast-facts"')[1].split("</div>\n")[0]
    assert "<dt>GPU utilisation</dt><dd>88 %</dd>" in facts  # 87.5 rounds to 88
    assert "<dt>GPU temperature</dt><dd>71 °C</dd>" in facts
    assert "must benchmark at least 63 proofs/h" in facts
    download = facts.split("<dt>Download</dt><dd>")[1].split("</dd>")[0]
    assert "not reported" in download  # the record had no inet_down


def test_a_destroyed_instance_shows_no_current_figures_and_a_stopped_uptime(admin_client, fleet):
    remote = RemoteMachine.objects.get(machine=fleet["a"])
    started = remote.vast_facts["start_date"]
    remote.billing_ended = timezone.now() - timedelta(minutes=30)
    remote.save()
    fleet["a"].kill("destroyed by admin")
    html = admin_client.get("/?state=killed").content.decode()
    row = html.split(f'id="host-{fleet["a"].pk}-row"')[1].split("</tr>")[0]
    for cell in ("gpu-util-cell", "temp-cell", "ram-cell"):
        assert "not reported" in row.split(f'class="{cell}"')[1].split("</td>")[0], cell
    uptime = row.split('class="uptime-cell">')[1].split("</td>")[0]
    assert "data-tick" not in uptime  # a stopped clock does not run in the browser
    assert uptime == readmodel.duration(remote.billing_ended.timestamp() - started)
    assert "destroy-open" not in row


def test_a_row_expands_to_its_facts_live_panel_and_logs_per_source(client, admin_client, fleet):
    from vastmgr.instances.models import Instance, LogLine

    alpha = fleet["a"]
    row = admin_client.get("/").content.decode().split(f'id="host-{alpha.pk}-row"')[1]
    assert f'aria-controls="host-{alpha.pk}-detail"' in row.split("</tr>")[0]
    assert f'data-detail-url="/fragments/fleet/{alpha.pk}/detail/"' in row
    instance = Instance.objects.create(uuid="0b5c9d2e-0000-4000-8000-00000000000a",
                                       label="C.1", runner_id=7, machine=alpha,
                                       state=Instance.State.PARAMS_DONE)
    LogLine.push(instance.uuid, "setup", b"fetching params\nparams ok\n")
    LogLine.push(instance.uuid, "benchout", b"rate=61.5\n")

    html = admin_client.get(f"/fragments/fleet/{alpha.pk}/detail/").content.decode()
    assert html.lstrip().startswith(f'<tr id="host-{alpha.pk}-detail"')
    assert 'data-callhome-state="params_done"' in html and instance.uuid in html
    assert "2 × RTX 4090" in html and "alpha.example" in html
    # The host page's own socket keeps the panel live, and the panel is the host page's.
    assert f'ws-connect="/ws/machines/{alpha.pk}/"' in html and f'id="host-{alpha.pk}-panel"' in html
    tabs = re.findall(r'role="tab"[^>]*aria-selected="(\w+)"[^>]*>(\w+)</button>', html)
    assert tabs == [("true", "all"), ("false", "benchout"), ("false", "setup")]
    assert "[setup] params ok" in html and "[benchout] rate=61.5" in html

    logs = admin_client.get(f"/fragments/fleet/{alpha.pk}/logs/?source=setup").content.decode()
    assert "params ok" in logs and "rate=61.5" not in logs and "[setup]" not in logs
    assert re.search(r'aria-selected="true"[^>]*>setup<', logs)
    # It polls its tab, naming the newest line shown: nothing newer is a 204 (left in place),
    # a pushed line is the fresh part.
    newest = LogLine.objects.filter(uuid=instance.uuid).order_by("-id").first().pk
    poll = f"/fragments/fleet/{alpha.pk}/logs/?source=setup&after={newest}"
    assert f'hx-get="{poll.replace("&", "&amp;")}"' in logs
    quiet_poll = admin_client.get(poll)
    assert quiet_poll.status_code == 204 and quiet_poll.content == b""
    LogLine.push(instance.uuid, "benchout", b"rate=62.0\n")  # another tab's line: new tab list
    fresh = admin_client.get(poll)
    assert fresh.status_code == 200 and "params ok" in fresh.content.decode()
    pushed = LogLine.objects.filter(uuid=instance.uuid).order_by("-id").first().pk
    assert pushed > newest and f"after={pushed}" in fresh.content.decode()
    # An unknown source is the whole log, an unknown machine a 404, a visitor goes to log in.
    assert "rate=61.5" in admin_client.get(
        f"/fragments/fleet/{alpha.pk}/logs/?source=nope").content.decode()
    assert admin_client.get("/fragments/fleet/999999/detail/").status_code == 404
    assert client.get(f"/fragments/fleet/{alpha.pk}/detail/").status_code == 302
    quiet = admin_client.get(f"/fragments/fleet/{fleet['b'].pk}/detail/").content.decode()
    assert "No logs pushed" in quiet
