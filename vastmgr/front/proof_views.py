import io
import json
import tarfile
import time
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from cuzk_engine.vocabulary import DEFAULT_PRIORITIES
from vastmgr.fleet.liveness import OFFLINE
from vastmgr.fleet.models import Machine
from vastmgr.front import proof_table, readmodel
from vastmgr.front.proof_forms import TestProofForm
from vastmgr.front.proof_panel import render_proof
from vastmgr.lib.http import AuthenticatedHttpRequest
from vastmgr.proofs.models import ProofJob

ARCHIVE_NAME = "proof.tar.gz"
FILES = ("proof.bin", "vk.json", "public_inputs.json")


def proof_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    context = proof_table.table_context(request.GET)
    context.update(percentiles=ProofJob.duration_percentiles(),
                   table_html=render_to_string("proofs/fragments/proof_table.html", context),
                   # htmx posts of the rows' actions (also pushed rows) come back here
                   next_vals=json.dumps({"next": request.get_full_path()}))
    return render(request, "proofs/list.html", context, status=200 if context["valid"] else 400)


def proof_table_fragment(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The list's table, polled while the list's socket is down."""
    context = proof_table.table_context(request.GET)
    return render(request, "proofs/fragments/proof_table.html", context,
                  status=200 if context["valid"] else 400)


def proof_detail(request: AuthenticatedHttpRequest, job_id: UUID) -> HttpResponse:
    job = get_object_or_404(ProofJob.objects.select_related("machine"), pk=job_id)
    return render(request, "proofs/detail.html", {"job": job, "state_html": render_proof(job)})


def proof_fragment(request: AuthenticatedHttpRequest, job_id: UUID) -> HttpResponse:
    job = get_object_or_404(ProofJob.objects.select_related("machine"), pk=job_id)
    return HttpResponse(render_proof(job))


def proof_download(request: AuthenticatedHttpRequest, job_id: UUID, name: str) -> HttpResponse:
    """One file under its plain name, or all three in one tar.gz that `python -m cuzk_engine
    verify DIR` accepts once unpacked into DIR."""
    job = get_object_or_404(ProofJob, pk=job_id)
    files = proof_files(job)
    if name == ARCHIVE_NAME and len(files) == len(FILES):
        body, content_type = proof_archive(files), "application/gzip"
        filename = f"proof-{str(job.pk)[:8]}.tar.gz"
    elif name in files:
        body, filename = files[name], name
        content_type = "application/octet-stream" if name.endswith(".bin") else "application/json"
    else:
        raise Http404(f"This proof has no {name} (yet).")
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def proof_files(job: ProofJob) -> dict[str, bytes]:
    files = {}
    if job.proof:
        files["proof.bin"] = bytes(job.proof)
    if job.vk is not None:
        files["vk.json"] = json.dumps(job.vk, indent=1).encode()
    if job.public_inputs is not None:
        files["public_inputs.json"] = json.dumps(job.public_inputs, indent=1).encode()
    return files


def proof_archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _job_for_action(request: AuthenticatedHttpRequest, job_id: UUID) -> ProofJob:
    job = get_object_or_404(ProofJob, pk=job_id)
    if not job.may_be_changed_by(request.user):
        raise PermissionDenied("Only staff or the person who started this proof may change it.")
    return job


def _back_to(request: AuthenticatedHttpRequest, fallback: str) -> HttpResponse:
    """After an action: where the form said (the list keeps its filters), else the proof."""
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts=None) or not target.startswith("/"):
        target = fallback
    if request.headers.get("HX-Request"):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = target
        return response
    return redirect(target)


@require_POST
def proof_cancel(request: AuthenticatedHttpRequest, job_id: UUID) -> HttpResponse:
    with transaction.atomic():
        job = _job_for_action(request, job_id)
        job = ProofJob.objects.select_for_update().get(pk=job.pk)
        if not job.can_cancel:
            messages.error(request, f"This proof is {job.status}: there is nothing to cancel.")
        else:
            job.request_cancel(request.user)
            transaction.on_commit(proof_table.tell_list_pages)
            messages.info(request, "Proof cancelled." if job.is_final else
                          "Cancel requested: the controller is stopping it on its engine; the status "
                          "changes when the engine confirms.")
    return _back_to(request, reverse("proof", args=[job.pk]))


@require_POST
def proof_retry(request: AuthenticatedHttpRequest, job_id: UUID) -> HttpResponse:
    job = _job_for_action(request, job_id)
    if not job.can_retry:
        messages.error(request, f"Only a failed or cancelled proof can be retried; this one is {job.status}.")
        return _back_to(request, reverse("proof", args=[job.pk]))
    retry, created = job.retry(request.user)
    if created:
        proof_table.tell_list_pages()
    if not created:
        messages.info(request, "This proof was already retried (another tab or person): "
                               "here is that retry.")
    elif reason := unavailable_reason(retry.machine if retry.pinned else None):
        retry.fail(reason)
        messages.error(request, f"Not started: {reason}.")
    else:
        where = f" on {retry.machine}" if retry.pinned else ""
        messages.info(request, f"Retry queued as a new proof{where}.")
    return _back_to(request, reverse("proof", args=[retry.pk]))


def new_proof(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = TestProofForm(request.POST or None, initial={"machine": request.GET.get("machine")})
    if request.method == "POST" and form.is_valid():
        jobs, reason = create_jobs(form, request.user)
        if reason:
            messages.error(request, f"Not started: {reason}.")
        else:
            where = f"on {jobs[0].machine.name}" if jobs[0].machine else "on the least-loaded engine"
            messages.success(request, f"Queued {len(jobs)} {jobs[0].kind}/{jobs[0].profile} "
                                      f"proof{'s' if len(jobs) > 1 else ''} {where}.")
        if len(jobs) == 1:
            return redirect("proof", job_id=jobs[0].pk)
        return redirect(reverse("proofs") + f"?kind={jobs[0].kind}")
    return render(request, "proofs/new.html", {"form": form}, status=400 if form.errors else 200)


def create_jobs(form: TestProofForm, user: User) -> tuple[list[ProofJob], str | None]:
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
    proof_table.tell_list_pages()
    return jobs, reason


def unavailable_reason(machine: Machine | None) -> str | None:
    now = time.time()
    hosts = readmodel.load_machines(now, [machine.pk] if machine else None)
    if machine is not None:
        if reason := machine.unusable_reason():
            return reason
        if not hosts or hosts[0].connection == OFFLINE:
            seen = hosts[0].seen_ago if hosts else None
            when = "never seen" if seen is None else f"last seen {seen} s ago"
            return f"the engine on {machine.name} is offline ({when})"
        return None
    if not any(h.connection != OFFLINE for h in hosts if h.machine.enabled and h.machine.can_prove):
        return "no engine is online to take the job (every machine is offline)"
    return None
