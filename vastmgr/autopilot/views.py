"""The Autopilot page: its switch, limits, current plan and forecast, proposals to approve and
its last decisions. Actions are plain POSTs that redirect back (one click each)."""

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from vastmgr.autopilot import pilot as pilot_module
from vastmgr.autopilot.forms import LimitsForm
from vastmgr.autopilot.models import EVENT_KIND, Autopilot, Proposal
from vastmgr.autopilot.planner import duration
from vastmgr.autopilot.planner_input import RemoteSettings, hosts
from vastmgr.fleet.ledger import Reading
from vastmgr.fleet.models import Event
from vastmgr.lib.errors import SecretUnavailable, VastError
from vastmgr.lib.http import AuthenticatedHttpRequest, staff_only
from vastmgr.remote import vast

LAST_DECISIONS = 30


def _client() -> vast.VastClient | None:
    try:
        return vast.VastClient.from_settings()
    except (SecretUnavailable, VastError):
        return None


def _live(pilot: Autopilot) -> dict:
    """What the page shows that changes on its own (the first render and every poll)."""
    now = timezone.now()
    money = Reading.load(now.timestamp())
    fleet = hosts(RemoteSettings.load(), now, money)
    spend = money.dollars_per_hour()  # the ledger's, as on every page
    plan = pilot.plan or {}
    return {
        "pilot": pilot, "modes": Autopilot.Mode, "plan": plan, "spend": spend,
        "hosts": len(fleet), "spend_share": min(spend / pilot.max_dollars_per_hour, 1) * 100
        if pilot.max_dollars_per_hour else 100,
        "forecasts": [{**f, "drain": "—" if not f["unfinished"] else
                       "∞ (no host serves it)" if f["drain_s"] is None
                       else duration(f["drain_s"]), "left": duration(f["slack_s"]),
                       "budget": duration(f["budget_s"])} for f in plan.get("forecasts", [])],
        "proposals": Proposal.objects.filter(status=Proposal.Status.PROPOSED).order_by("id"),
        "decided": Proposal.objects.exclude(status=Proposal.Status.PROPOSED)[:10],
        "events": Event.objects.filter(kind=EVENT_KIND)[:LAST_DECISIONS],
    }


@staff_only
def page(request: AuthenticatedHttpRequest, form: LimitsForm | None = None) -> HttpResponse:
    pilot = Autopilot.current()
    return render(request, "autopilot/page.html",
                  {**_live(pilot), "form": form or LimitsForm(instance=pilot)},
                  status=400 if form is not None else 200)


@staff_only
def live(request: AuthenticatedHttpRequest) -> HttpResponse:
    return render(request, "autopilot/_live.html", _live(Autopilot.current()))


@staff_only
@require_POST
def set_mode(request: AuthenticatedHttpRequest) -> HttpResponse:
    mode = request.POST.get("mode", "")
    if mode not in Autopilot.Mode.values:
        return HttpResponse(f"unknown autopilot mode {mode[:40]!r}: choose one of "
                            f"{', '.join(Autopilot.Mode.values)}", status=400,
                            content_type="text/plain")
    Autopilot.current().set_mode(mode, request.user)
    messages.info(request, f"Autopilot: {Autopilot.Mode(mode).label}")
    return redirect("autopilot:page")


@staff_only
@require_POST
def set_limits(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = LimitsForm(request.POST, instance=Autopilot.current())
    if not form.is_valid():
        return page(request, form)
    form.save()
    Event.record(EVENT_KIND, "autopilot limits changed by "
                             f"{request.user.get_username()}",
                 data={k: str(v) for k, v in form.cleaned_data.items()})
    messages.info(request, "Limits saved")
    return redirect("autopilot:page")


@staff_only
@require_POST
def plan_now(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Plan at once instead of at the next tick: dry run only (acting stays with the one
    process that holds the lease)."""
    if Autopilot.current().mode != Autopilot.Mode.DRY_RUN:
        messages.error(request, "Plan now is for dry-run mode: switch to dry run first")
        return redirect("autopilot:page")
    async_to_sync(pilot_module.Pilot(_client()).propose_now)()
    return redirect("autopilot:page")


@staff_only
@require_POST
def approve(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    if Autopilot.current().mode != Autopilot.Mode.DRY_RUN:
        messages.error(request, "The autopilot is not in dry-run mode: nothing to approve")
        return redirect("autopilot:page")
    proposal = async_to_sync(pilot_module.approve)(pk, request.user, _client())
    if proposal is None:
        messages.error(request, "That proposal is no longer open (approved already, or "
                                "replaced by a newer plan)")
    elif proposal.status == Proposal.Status.DONE:
        messages.info(request, f"Done: {proposal.decision['summary']} — {proposal.outcome}")
    else:
        messages.error(request, f"{proposal.decision['summary']}: {proposal.outcome}")
    return redirect("autopilot:page")
