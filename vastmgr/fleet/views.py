import time

from django.contrib import messages
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from cuzk_engine.circuits import KINDS, PROFILES

from .controller import fragments
from .forms import EventListForm, SrsActionForm
from .models import HostAction, Machine

# Suggestions for the SRS form (staff only, outside the pushed panel, so a pushed panel never
# carries a control a non-staff viewer could use).
CIRCUIT_IDS = [f"{kind}.{profile}" for kind in KINDS for profile in PROFILES]


def fleet(request):
    now = time.time()
    hosts = fragments.load_hosts(now)
    return render(request, "fleet/fleet.html", {
        "hosts": hosts, "totals_html": fragments.render_fleet_totals(hosts),
    })


def fleet_fragment(request):
    """The socket's full state over plain HTTP: the browser's fallback while the socket is down."""
    return HttpResponse(fragments.render_fleet())


def host(request, machine_id):
    machine = get_object_or_404(Machine, pk=machine_id)
    return render(request, "fleet/host.html", {
        "machine": machine, "state_html": _host_state(machine), "srs_form": SrsActionForm(),
        "circuit_ids": CIRCUIT_IDS,
    })


def host_fragment(request, machine_id):
    return HttpResponse(_host_state(get_object_or_404(Machine, pk=machine_id)))


def _host_state(machine: Machine) -> str:
    now = time.time()
    return fragments.render_host_panel(machine, now) + fragments.render_host_charts(machine, now)


@require_POST
def host_srs(request, machine_id):
    if not request.user.is_staff:
        return HttpResponseForbidden("Only staff can preload or evict SRS on a machine.",
                                     content_type="text/plain; charset=utf-8")
    machine = get_object_or_404(Machine, pk=machine_id)
    form = SrsActionForm(request.POST)
    if not machine.can_prove:
        messages.error(request, f"{machine.name} runs an upstream cuzk daemon: SRS actions go "
                                "through its gRPC API, which vastmgr does not drive.")
    elif form.is_valid():
        HostAction.objects.create(machine=machine, requested_by=request.user, **form.cleaned_data)
        messages.info(request, f"{form.cleaned_data['action']} of {form.cleaned_data['circuit_id']}"
                               f" requested; the panel updates when the engine has done it.")
        return redirect("host", machine_id=machine.pk)
    return render(request, "fleet/host.html", {
        "machine": machine, "state_html": _host_state(machine), "srs_form": form,
        "circuit_ids": CIRCUIT_IDS,
    }, status=400)


def events(request):
    form = EventListForm(request.GET)
    context = {"form": form, "sorts": form.sort_links()}
    if not form.is_valid():
        return render(request, "fleet/events.html", context, status=400)
    context.update(page=form.page_of(form.events()), page_query=form.query_without("page"))
    return render(request, "fleet/events.html", context)


def offers(request):
    """Offers live in the remote app (Vast search and rent); keep the short URL working."""
    return redirect("remote:offers", permanent=True)
