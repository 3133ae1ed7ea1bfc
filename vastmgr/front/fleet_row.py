"""The fleet table's row (`<tr id="host-N-row">`): the one place its HTML is made, for the first
page render, the polling fallback and the controller's pushes.

It is written in Python rather than as a template: with every machine on somebody's screen the
controller renders each changed row, a thousand a second at a thousand machines, and the
template engine's variable lookups made that the larger part of its work (the row below renders
about eight times faster). The values, filters and escaping are the template engine's own
(`localize`, `conditional_escape`, `floatformat`, `pluralize`...), so the row reads exactly as
the template made it.

Machine-readable state (the truth oracle reads these): data-host (machine id), data-conn
(live|stale|offline), data-host-stale (true: data shown but the engine is not live),
data-snapshot-at (controller's receipt of the snapshot, epoch s), data-seq (engine seq),
data-workers-busy / data-workers (proving / all workers), data-waiting-jobs (jobs no device
has touched: queued, parameters, synthesis, waiting for a device), data-parts-ready
(synthesized partitions waiting for a device). data-state (lifecycle state), data-gpu-util and
data-gpu-temp (the provider's figures; empty: not reported).
Rendered without a request (pushes): staff-only controls carry class staff-only and open the
page's dialogs (which hold the CSRF token); the server checks staff on every action.
"""

from __future__ import annotations

from functools import lru_cache
from html import escape

from django.template.defaultfilters import floatformat, pluralize, truncatechars
from django.template.loader import render_to_string
from django.urls import get_script_prefix, reverse
from django.utils.formats import localize
from django.utils.html import conditional_escape

from vastmgr.fleet.liveness import LIVE
from vastmgr.fleet.models import Machine
from vastmgr.front.readmodel import MachineView
from vastmgr.front.templatetags.reported import NOT_REPORTED, not_reported
from vastmgr.front.templatetags.units import ago, binary_size, ticking

NOT_REPORTED_BY_PROVIDER = not_reported("the provider")
NOT_REPORTED_BY_ANYONE = not_reported("neither the provider nor the engine")


def text(value) -> str:
    """`value` as `{{ value }}` shows it: localized, then escaped unless already safe. Plain
    strings and integers (most of a row) take a short way to the same text: an integer
    localizes to its digits, as this project shows numbers without thousands separators."""
    kind = type(value)
    if kind is str:
        return escape(value)
    if kind is int:
        return str(value)
    return conditional_escape(localize(value))


@lru_cache(maxsize=4096)
def _urls(prefix: str, machine_id: int) -> tuple[str, str, str]:
    """The row's links (under the script prefix they were reversed with)."""
    return (reverse("fleet-row-detail", args=[machine_id]), reverse("machine-panel", args=[machine_id]),
            reverse("remote:machine", args=[machine_id]))


def render_fleet_row(h: MachineView) -> str:
    machine = h.machine
    pk = text(machine.pk)
    name = text(machine.name)
    detail_url, panel_url, machine_url = (text(url) for url in _urls(get_script_prefix(),
                                                                     machine.pk))
    connection = text(h.connection)
    status = h.status
    snapshot_at = h.snapshot_at
    queue_depth = h.queue_depth
    gpu_util, gpu_temp = h.gpu_util, h.gpu_temp
    attributes = (
        f'<tr id="host-{pk}-row" class="conn-{text(h.presence)}" data-host="{pk}" '
        f'data-conn="{connection}" data-host-stale="{"true" if h.stale else "false"}" '
        f'data-snapshot-at="{"" if snapshot_at is None else text(str(snapshot_at))}" '
        f'data-seq="{"" if status is None or status.seq is None else text(status.seq)}" '
        f'data-workers-busy="{text(h.busy_workers)}" data-workers="{text(len(h.workers))}" '
        f'data-waiting-jobs="{"" if queue_depth is None else text(queue_depth)}" '
        f'data-parts-ready="{text(h.partitions_waiting)}" data-state="{text(machine.state)}" '
        f'data-gpu-util="{"" if gpu_util is None else text(gpu_util)}" '
        f'data-gpu-temp="{"" if gpu_temp is None else text(gpu_temp)}">')
    return "".join((
        attributes,
        "\n  <td class=\"host-cell\">", _host_cell(h, pk, name, detail_url, panel_url, machine_url),
        "</td>\n  <td>", text(machine.provider), ' · <span class="state state-',
        text(machine.state), '">', text(machine.state), "</span>",
        "" if machine.enabled else " <small>(disabled)</small>",
        "</td>\n  <td class=\"conn\">", conn_badge(h), _stale_flag(h),
        "</td>\n  <td class=\"gpu-cell\">", _gpu(h),
        "</td>\n  <td class=\"gpu-util-cell\">", _gpu_util(gpu_util),
        "</td>\n  <td class=\"temp-cell\">", _gpu_temp(gpu_temp),
        "</td>\n  <td class=\"ram-cell\">", _ram(h),
        "</td>\n  <td class=\"uptime-cell\">", _uptime(h),
        "</td>\n  <td class=\"workers-cell\">", _workers(h),
        "</td>\n  <td class=\"waiting-cell\">", _waiting(h, queue_depth),
        "</td>\n  <td><span class=\"ok\">", text(h.done_24h), "</span> / <span class=\"bad\">",
        text(h.failed_24h), "</span></td>\n  <td>", _memory(h),
        "</td>\n  <td class=\"rate-cell\">", _rate(machine),
        f'</td>\n  <td class="cost-cell" data-dph="{h.running_dph:.6f}">', _cost(h),
        "</td>\n  <td>", _cost_per_proof(h),
        "</td>\n  <td class=\"actions-cell\">", _actions(h, pk, name),
        "</td>\n</tr>\n"))


def _host_cell(h: MachineView, pk: str, name: str, detail_url: str, panel_url: str,
               machine_url: str) -> str:
    machine = h.machine
    parts = [(f'<button type="button" class="row-toggle" aria-expanded="false" '
              f'aria-controls="host-{pk}-detail" data-detail-url="{detail_url}" '
              f'aria-label="Details of {name}" title="Details, engine panel and logs">▸</button>'
              f'<a href="{panel_url}" class="truncate" title="{name}">{name}</a>')]
    if machine.is_upstream:
        parts.append(' <span class="flavour" title="Curio\'s Rust cuzk daemon, watched only">'
                     'upstream</span>')
        lies = h.snapshot.get("lies")
        if lies:
            parts.append(f' <span class="flag" title="the daemon\'s status contradicts itself: '
                         f'see the host panel">{text(len(lies))} status warning'
                         f'{pluralize(len(lies))}</span>')
    if h.bad_host:
        # Rare, and shared with the offers page: its template stays the one owner.
        parts.append(" " + render_to_string("remote/_bad_badge.html", {"bad": h.bad_host}))
    if machine.provider != "local":
        parts.append(f' <a class="machine-link" href="{machine_url}" '
                     f'title="SSH, provisioning, costs and events">machine</a>')
    return "".join(parts)


def conn_badge(h: MachineView) -> str:
    """The engine's connection badge, last seen and error (the row's and the panel's)."""
    connection = text(h.connection)
    seen_ago = h.seen_ago
    seen = ('<small class="seen">never seen</small>' if seen_ago is None else
            f'<small class="seen" data-ago="{text(seen_ago)}">last seen {text(seen_ago)} s ago'
            f'</small>')
    error = h.status.error if h.status is not None else ""
    shown_error = (f'<small class="error" title="{text(error)}">'
                   f'{text(truncatechars(error, 60))}</small>'
                   if h.connection != LIVE and h.presence != "new" and error else "")
    if h.presence == "new":
        badge = (f'<span class="badge badge-new" data-conn="{connection}" title="This machine\'s '
                 "engine has not been started yet: provision it (or wait for its provisioning) "
                 'and it comes live">not started yet</span>')
    else:
        badge = (f'<span class="badge badge-{connection}" data-conn="{connection}" title="The '
                 f'machine\'s engine, as the fleet controller last heard it">{connection}</span>')
    signal = h.billing.vast_status_signal if h.billing is not None else ""
    told = (f'<small class="signal" data-signal="{text(signal)}">told by {text(signal)}</small>\n'
            if h.connection == "outbid" and signal else "")
    return f"{badge}\n{seen}\n{shown_error}\n{told}"


def _stale_flag(h: MachineView) -> str:
    if not (h.stale and h.snapshot_age is not None):
        return ""
    return (' <small class="stale-flag" title="Values in this row are what the engine reported '
            f'then">data {ago(h.snapshot_age)} old</small>')


def _gpu(h: MachineView) -> str:
    name = h.gpu_name
    if not name:
        return NOT_REPORTED_BY_ANYONE
    count = h.gpu_count
    return f"{text(count)} × {text(name)}" if count else text(name)


def _gpu_util(gpu_util: float | None) -> str:
    if gpu_util is None:
        return NOT_REPORTED_BY_PROVIDER
    percent = floatformat(gpu_util, 0)
    return (f'<div class="bar" title="{percent} % as Vast last listed it"><div class="fill '
            f'fill-ok" style="width:{percent}%"></div></div><small>{percent} %</small>')


def _gpu_temp(gpu_temp: float | None) -> str:
    if gpu_temp is None:
        return NOT_REPORTED_BY_PROVIDER
    level = "bad" if gpu_temp >= 85 else "warn" if gpu_temp >= 75 else ""
    return f'<span class="{level}">{floatformat(gpu_temp, 0)} °C</span>'


def _ram(h: MachineView) -> str:
    ram = h.ram
    if ram is None:
        return NOT_REPORTED_BY_PROVIDER
    if ram["used_gb"] is None:
        return f"{floatformat(ram['total_gb'], 0)} GB"
    return f"{floatformat(ram['used_gb'], 1)} / {floatformat(ram['total_gb'], 0)} GB"


def _uptime(h: MachineView) -> str:
    uptime = h.uptime
    if uptime is None:
        return NOT_REPORTED_BY_ANYONE
    stopped = h.uptime_stopped
    if stopped:
        return text(stopped)
    value, age = h.uptime_clock or (uptime, 0.0)
    return ticking(value, age, of=h)


def _workers(h: MachineView) -> str:
    workers = h.workers
    if workers:
        devices = h.devices
        shown = (f"{text(len(devices)) + ' dev × ' if devices else ''}{text(len(workers))} "
                 f"workers: <b>{text(h.busy_workers)}</b> busy / {text(h.idle_workers)} idle")
    else:
        shown = "—"
    flag = ('<span class="flag" title="A worker has been idle for 5 s or more while synthesized '
            'partitions wait for a device">idle GPU with work waiting</span>'
            if h.gpu_idle_while_waiting else "")
    return f"{shown}\n    {flag}"


def _waiting(h: MachineView, queue_depth: int | None) -> str:
    if h.status is None or not h.status.snapshot:
        return "—"
    if queue_depth is None:
        return NOT_REPORTED
    shown = f'<b class="waiting-jobs">{text(queue_depth)}</b> job{pluralize(queue_depth)}'
    parts = h.partitions_waiting
    if parts:
        shown += (f' · <span class="waiting-parts" title="Synthesized partitions waiting for a '
                  f'device">{text(parts)} part{pluralize(parts)} ready</span>')
    return shown


def _memory(h: MachineView) -> str:
    memory = h.memory
    if not memory["total"]:
        return "—"
    used, total = text(binary_size(memory["used"])), text(binary_size(memory["total"]))
    return (f'<div class="bar" title="{used} of {total}"><div class="fill '
            f'fill-{text(memory["level"])}" style="width:{text(memory["percent"])}%"></div></div>'
            f"<small>{used} / {total}</small>")


def _rate(machine: Machine) -> str:
    if machine.bench_rate:
        return floatformat(machine.bench_rate, 1)
    return '<span class="not-reported" title="no benchmark recorded">—</span>'


def _cost(h: MachineView) -> str:
    """$/h and spend, from the ledger (estimated), beside what Vast last billed."""
    spent = h.spent
    if spent is None:
        return "—"
    shown = f"${floatformat(h.running_dph, 3)}" + (
        "" if h.billing_active else ' <small title="Not billing now">(not billing)</small>')
    billed = h.billed
    billed_part = (f' · <span class="billed" data-billed="{billed.dollars:.6f}">'
                   f"${floatformat(billed.dollars, 2)}</span> billed by Vast" if billed else "")
    return (f'{shown}\n    <br><small>spent <span class="money" data-amount="{spent:.6f}" '
            f'data-per-hour="{h.running_dph:.6f}">${floatformat(spent, 2)}</span> est.'
            f"{billed_part}</small>")


def _cost_per_proof(h: MachineView) -> str:
    cost = h.cost_per_proof
    if cost is not None:
        return f"${floatformat(cost, 4)}"
    estimate = h.bench_cost_per_proof
    return ('<span title="'
            + (f"Benchmark estimate ${floatformat(estimate, 4)}; " if estimate is not None else "")
            + 'no measured figure: needs billing and a proof done in 24 h">—</span>')


def _actions(h: MachineView, pk: str, name: str) -> str:
    machine = h.machine
    parts = []
    ssh = h.ssh_command
    if ssh:
        ssh = text(ssh)
        parts.append(f'<button type="button" class="small secondary copy-ssh" data-copy="{ssh}" '
                     f'title="Copy: {ssh}" aria-label="Copy the SSH command for {name}">SSH'
                     f'</button>')
    if machine.state != "killed" and not machine.destroy_refusal():
        parts.append(f' <button type="button" class="small danger staff-only destroy-open" '
                     f'data-machine="{pk}" data-name="{name}">Destroy</button>')
    return "".join(parts)
