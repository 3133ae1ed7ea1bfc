import json
import time

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from cuzk_engine.config import DEFAULT_PRIORITIES
from vastmgr.fleet.controller import fragments
from vastmgr.fleet.controller.liveness import OFFLINE
from vastmgr.fleet.models import Machine

from .forms import TestProofForm
from .models import ProofJob

LIST_LIMIT = 200


def proof_list(request):
    jobs = ProofJob.objects.select_related("machine")
    filters = {key: request.GET.get(key, "") for key in ("status", "kind", "machine")}
    if filters["status"]:
        jobs = jobs.filter(status=filters["status"])
    if filters["kind"]:
        jobs = jobs.filter(kind=filters["kind"])
    if filters["machine"].isdigit():
        jobs = jobs.filter(machine_id=int(filters["machine"]))
    return render(request, "proofs/list.html", {
        "jobs": jobs[:LIST_LIMIT], "filters": filters,
        "statuses": ProofJob.Status.choices, "kinds": ProofJob.Kind.choices,
        "machines": Machine.objects.all(),
    })


def proof_detail(request, job_id):
    job = get_object_or_404(ProofJob.objects.select_related("machine"), pk=job_id)
    return render(request, "proofs/detail.html", {"job": job, "state_html": fragments.render_proof(job)})


def proof_fragment(request, job_id):
    job = get_object_or_404(ProofJob.objects.select_related("machine"), pk=job_id)
    return HttpResponse(fragments.render_proof(job))


def proof_download(request, job_id, name):
    job = get_object_or_404(ProofJob, pk=job_id)
    if name == "proof.bin" and job.proof:
        body, content_type = bytes(job.proof), "application/octet-stream"
    elif name == "vk.json" and job.vk is not None:
        body, content_type = json.dumps(job.vk, indent=1), "application/json"
    elif name == "public_inputs.json" and job.public_inputs is not None:
        body, content_type = json.dumps(job.public_inputs, indent=1), "application/json"
    else:
        raise Http404(f"this job has no {name}")
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{job.pk}-{name}"'
    return response


def new_proof(request):
    form = TestProofForm(request.POST or None, initial={"machine": request.GET.get("machine")})
    if request.method == "POST" and form.is_valid():
        jobs, reason = create_jobs(form, request.user)
        if reason:
            messages.error(request, f"Not started: {reason}.")
        if len(jobs) == 1:
            return redirect("proof", job_id=jobs[0].pk)
        return redirect(reverse("proofs") + f"?kind={jobs[0].kind}")
    return render(request, "proofs/new.html", {"form": form}, status=400 if form.errors else 200)


def create_jobs(form: TestProofForm, user) -> tuple[list[ProofJob], str | None]:
    """Queue the requested proofs; when no engine can take them now, fail them with the reason
    at once, so the operator sees why instead of a job waiting forever."""
    data = form.cleaned_data
    machine = data["machine"]
    priority = data["priority"] or DEFAULT_PRIORITIES.get(data["kind"], "normal")
    with transaction.atomic():
        jobs = [ProofJob.objects.create(machine=machine, pinned=machine is not None,
                                        kind=data["kind"], profile=data["profile"],
                                        seed=seed, priority=priority, requested_by=user)
                for seed in form.seeds()]
    reason = unavailable_reason(machine)
    if reason:
        for job in jobs:
            job.fail(reason)
    return jobs, reason


def unavailable_reason(machine: Machine | None) -> str | None:
    now = time.time()
    hosts = fragments.load_hosts(now, [machine.pk] if machine else None)
    if machine is not None:
        if not machine.enabled:
            return f"machine {machine.name} is disabled"
        if not hosts or hosts[0].connection == OFFLINE:
            seen = hosts[0].seen_ago if hosts else None
            when = "never seen" if seen is None else f"last seen {seen} s ago"
            return f"the engine on {machine.name} is offline ({when})"
        return None
    if not any(h.connection != OFFLINE for h in hosts if h.machine.enabled):
        return "no engine is online to take the job (every machine is offline)"
    return None
