import time

from django.contrib import messages
from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from vastmgr.fleet.models import Machine, MachineAction
from vastmgr.front import fragments, readmodel
from vastmgr.front.benchmark_forms import BenchmarkForm
from vastmgr.front.fleet_forms import EventListForm, SrsActionForm
from vastmgr.front.fleet_table import FleetTableForm
from vastmgr.front.proof_panel import phase_legend
from vastmgr.lib.http import AuthenticatedHttpRequest
from vastmgr.proofs.models import BenchmarkProof


def fleet(request: AuthenticatedHttpRequest) -> HttpResponse:
    table = FleetTableForm(request.GET)
    context = {"table": table, "sorts": table.sort_links()}
    if not table.is_valid():
        context["totals_html"] = fragments.render_fleet_totals(readmodel.load_machines(time.time()))
        return render(request, "fleet/fleet.html", context, status=400)
    now = time.time()
    page = table.page_rows(now)
    context.update(body_html=fragments.render_fleet_rows(list(page), table.query_without()),
                   page=page, query=table.query_without(),
                   page_query=table.query_without("page"),
                   totals_html=fragments.render_fleet_totals(readmodel.load_machines(now)))
    return render(request, "fleet/fleet.html", context)


def fleet_fragment(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The socket's full state over plain HTTP (the browser's fallback while the socket is
    down): the rows of the page the query parameters ask for, and the totals."""
    table = FleetTableForm(request.GET)
    if not table.is_valid():
        return HttpResponseBadRequest(f"Bad fleet table parameters: {table.error_message()}",
                                      content_type="text/plain; charset=utf-8")
    now = time.time()
    return HttpResponse(fragments.render_fleet(
        now, list(table.page_rows(now)), table.query_without("page")))


def machine_panel(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    machine = get_object_or_404(Machine, pk=machine_id)
    return _machine_page(request, machine, SrsActionForm(upstream=machine.speaks_grpc))


def _machine_page(request: AuthenticatedHttpRequest, machine: Machine, srs_form: SrsActionForm,
               status: int = 200, benchmark_form: BenchmarkForm | None = None) -> HttpResponse:
    return render(request, "fleet/machine_panel.html", {
        "benchmark_form": benchmark_form or BenchmarkForm(),
        "cancellable": machine.benchmarks.filter(status=BenchmarkProof.Status.SUBMITTED,
                                                 cancel_requested__isnull=True),
        "machine": machine, "srs_form": srs_form, "circuit_ids": srs_form.circuit_ids(),
        "circuit_pattern": srs_form.circuit_pattern(), "circuit_example": srs_form.example(),
        "state_html": _host_state(machine, request.GET.get("window")),
        "phases": phase_legend(),
    }, status=status)


def machine_fragment(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    return HttpResponse(_host_state(get_object_or_404(Machine, pk=machine_id),
                                    request.GET.get("window")))


def machine_charts(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    """The charts alone, for the window picker (`?window=15m|1h|24h`)."""
    machine = get_object_or_404(Machine, pk=machine_id)
    return HttpResponse(fragments.render_machine_charts(
        machine, window=readmodel.chart_window(request.GET.get("window"))))


def machine_state(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    """The lifecycle state badge, re-read by pages that show it in their heading."""
    machine = get_object_or_404(Machine, pk=machine_id)
    return render(request, "fleet/fragments/machine_state.html", {"machine": machine})


def _host_state(machine: Machine, window: str | None = None) -> str:
    now = time.time()
    return fragments.render_machine_panel(machine, now) + fragments.render_machine_charts(
        machine, now, readmodel.chart_window(window))


@require_POST
def machine_srs(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    if not request.user.is_staff:
        return HttpResponseForbidden("Only staff can preload or evict SRS on a machine.",
                                     content_type="text/plain; charset=utf-8")
    machine = get_object_or_404(Machine, pk=machine_id)
    form = SrsActionForm(request.POST, upstream=machine.speaks_grpc)
    if not machine.can_prove and not machine.speaks_grpc:
        messages.error(request, f"{machine.name} is an upstream cuzk daemon known by its status "
                                "server only: SRS actions go through its gRPC API; give its "
                                "gRPC address to drive it.")
    elif form.is_valid():
        MachineAction.objects.create(machine=machine, requested_by=request.user, **form.cleaned_data)
        messages.info(request, f"{form.cleaned_data['action']} of {form.cleaned_data['circuit_id']}"
                               f" requested; the panel updates when the engine has done it.")
        return redirect("machine-panel", machine_id=machine.pk)
    return _machine_page(request, machine, form, status=400)


def events(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = EventListForm(request.GET)
    context = {"form": form, "sorts": form.sort_links()}
    if not form.is_valid():
        return render(request, "fleet/events.html", context, status=400)
    context.update(page=form.page_of(form.events()), page_query=form.query_without("page"))
    return render(request, "fleet/events.html", context)


def offers(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Offers live in the remote app (Vast search and rent); keep the short URL working."""
    return redirect("remote:offers", permanent=True)


@require_POST
def machine_benchmark(request: AuthenticatedHttpRequest, machine_id: int) -> HttpResponse:
    """A benchmark proof for an upstream cuzk daemon: stored, then submitted and followed by
    the fleet controller over gRPC."""
    if not request.user.is_staff:
        return HttpResponseForbidden("Only staff can run benchmark proofs.",
                                     content_type="text/plain; charset=utf-8")
    machine = get_object_or_404(Machine, pk=machine_id)
    if not machine.speaks_grpc:
        return HttpResponseBadRequest(
            f"{machine.name} has no cuzk gRPC address: benchmark proofs are submitted to an "
            "upstream daemon through its gRPC API (our engines run test proofs instead).",
            content_type="text/plain; charset=utf-8")
    form = BenchmarkForm(request.POST, request.FILES)
    if not form.is_valid():
        return _machine_page(request, machine, SrsActionForm(upstream=True), status=400,
                             benchmark_form=form)
    bench = BenchmarkProof.objects.create(machine=machine, requested_by=request.user,
                                          **form.benchmark_fields())
    messages.info(request, f"Benchmark {bench.pk} ({bench.proof_kind}) stored; the controller "
                           "submits it to the daemon and its timings appear below when it ends.")
    return redirect("machine-panel", machine_id=machine.pk)


@require_POST
def machine_benchmark_cancel(request: AuthenticatedHttpRequest, machine_id: int,
                             benchmark_id: int) -> HttpResponse:
    if not request.user.is_staff:
        return HttpResponseForbidden("Only staff can cancel benchmark proofs.",
                                     content_type="text/plain; charset=utf-8")
    bench = get_object_or_404(BenchmarkProof, pk=benchmark_id, machine_id=machine_id)
    if bench.status != BenchmarkProof.Status.SUBMITTED or bench.cancel_requested:
        return HttpResponseBadRequest(
            f"Benchmark {bench.pk} is {bench.status}"
            + (", and its cancel was already sent" if bench.cancel_requested else "")
            + ": only a submitted proof can be asked to stop.",
            content_type="text/plain; charset=utf-8")
    bench.cancel_requested = timezone.now()
    bench.save(update_fields=["cancel_requested"])
    messages.warning(request, f"CancelProof will be sent for benchmark {bench.pk}, but upstream "
                              "cannot stop a running proof: it answers was_running=false and "
                              "proves on; the result is still recorded.")
    return redirect("machine-panel", machine_id=machine_id)
