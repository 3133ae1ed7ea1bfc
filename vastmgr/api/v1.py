"""The versioned JSON API (/api/v1/): what the pages do, for scripts, with the pages'
permissions: everyone signed in may read and start proofs; acting on machines and renting is
for staff; a proof is cancelled or retried by staff or by whoever started it."""

import time
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from uuid import UUID

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count
from django.forms import Form
from django.http import HttpRequest, HttpResponse, QueryDict
from django.utils import timezone
from ninja import NinjaAPI, Path, Query, Schema, Status
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer, django_auth

from vastmgr.api.models import ApiToken
from vastmgr.api.schemas import (
    Action,
    ActionResult,
    EventOut,
    EventPage,
    FleetSummary,
    MachineIn,
    MachineOut,
    OfferOut,
    Problem,
    ProofFile,
    ProofIn,
    ProofOut,
    ProofPage,
    RentIn,
)
from vastmgr.fleet import ledger
from vastmgr.fleet.liveness import LIVE, machine_connection
from vastmgr.fleet.models import Event, Machine, MachineStatus
from vastmgr.front.fleet_forms import EventListForm
from vastmgr.front.proof_forms import ProofListForm, TestProofForm
from vastmgr.front.proof_table import filtered_jobs
from vastmgr.front.proof_views import (
    ARCHIVE_NAME,
    FILES,
    create_jobs,
    proof_archive,
    proof_files,
    unavailable_reason,
)
from vastmgr.front.readmodel import gpus_on_engines, load_machines
from vastmgr.lib.errors import SecretUnavailable, VastError
from vastmgr.lib.params import MAX_ID
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import vast
from vastmgr.remote.actions import LAUNCHED, why_not
from vastmgr.remote.forms import AddMachineForm, OfferSearchForm
from vastmgr.remote.views import add_ssh_machine, destroy, launch_action


class TokenAuth(HttpBearer):
    """Authorization: Bearer <token> (created on the API tokens page)."""

    def authenticate(self, request: HttpRequest, token: str) -> User | None:
        user = ApiToken.user_for(token)
        if user is not None:
            request.user = user
        return user


api = NinjaAPI(title="vastmgr", version="1", urls_namespace="api-v1",
               auth=[TokenAuth(), django_auth],
               description="The fleet, proofs, offers and events of vastmgr. Authenticate "
                           "with `Authorization: Bearer <token>` (API tokens page) or a "
                           "signed-in session.")



@api.exception_handler(NinjaValidationError)
def invalid_request(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    """A request that does not fit the schema: 422 with a Problem naming each field as the
    caller wrote it (`kind: ...`), not ninja's location (`["body", "body", "kind"]`)."""
    return api.create_response(request, {"detail": "; ".join(
        f"{field_name(error.get('loc', ()))}: {error.get('msg', 'invalid')}"
        for error in exc.errors)}, status=422)


def field_name(location: Sequence[str | int]) -> str:
    """ninja's error location without its source and parameter prefix: ("body", "body",
    "kind") is `kind`, ("query", "num_gpus") is `num_gpus`; list items read `items[2]`."""
    parts = list(location)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form"):
        parts = parts[2:] if parts[0] == "body" and len(parts) > 2 else parts[1:]
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "request"


Id = Path(..., ge=1, le=MAX_ID, description="a machine id")
DENIED = {401: Problem, 403: Problem}


def _user(request: HttpRequest) -> User:
    return request.auth  # type: ignore[attr-defined]  # set by TokenAuth / SessionAuth


def _staff(request: HttpRequest, doing: str) -> User:
    user = _user(request)
    if not user.is_staff:
        raise HttpError(403, f"only staff may {doing}")
    return user


def _form_errors(form: Form) -> str:
    return "; ".join(f"{field}: {error}" if field != "__all__" else str(error)
                     for field, errors in form.errors.items() for error in errors)


def _valid(form: Form) -> dict:
    if not form.is_valid():
        raise HttpError(400, _form_errors(form))
    return form.cleaned_data


def _query(params: Schema) -> QueryDict:
    """Typed query parameters back as a QueryDict, for the pages' own table forms."""
    data = QueryDict(mutable=True)
    for name, value in params.dict().items():
        if value not in (None, ""):
            data[name] = str(value)
    return data


def _machine(machine_id: int) -> Machine:
    machine = Machine.objects.select_related("live").filter(pk=machine_id).first()
    if machine is None:
        raise HttpError(404, f"no machine {machine_id}")
    return machine


# ------------------------------------------------------------------------------- machines

@api.get("/machines", response={200: list[MachineOut], **DENIED}, tags=["machines"])
def list_machines(request: HttpRequest, include_killed: bool = False):
    machines = Machine.objects.select_related("live")
    if not include_killed:
        machines = machines.exclude(state=Machine.State.KILLED)
    return [MachineOut.of(m) for m in machines]


@api.get("/machines/{machine_id}", response={200: MachineOut, 404: Problem, **DENIED},
         tags=["machines"])
def get_machine(request: HttpRequest, machine_id: int = Id):
    return MachineOut.of(_machine(machine_id))


@api.post("/machines", response={201: MachineOut, 400: Problem, **DENIED}, tags=["machines"])
def add_machine(request: HttpRequest, body: MachineIn):
    """Add an SSH host (the Add host page's checks: unique name, a readable key)."""
    user = _staff(request, "add machines")
    data = body.dict()
    form = AddMachineForm({k: "" if v is None else str(v) for k, v in data.items()})
    return Status(201, MachineOut.of(add_ssh_machine(_valid(form), user)))


@api.post("/machines/{machine_id}/actions/{action}",
          response={200: ActionResult, 202: ActionResult, 404: Problem, 409: Problem,
                    **DENIED}, tags=["machines"])
def machine_action(request: HttpRequest, action: Action, machine_id: int = Id):
    """Run an action: `destroy` answers when done; the others start in the background
    (202) and report through the machine's events."""
    user = _staff(request, "act on machines").get_username()
    machine = _machine(machine_id)
    if action == "destroy" and (refused := machine.destroy_refusal()):
        raise HttpError(409, refused)
    if machine.provider == Machine.Provider.LOCAL:
        raise HttpError(409, f"{machine.name} is a local engine without SSH: nothing to "
                             f"{action}")
    if action == "destroy":
        if machine.state == Machine.State.KILLED:
            raise HttpError(409, f"{machine.name} is already destroyed")
        try:
            destroy(machine, f"destroyed by {user} (API)")
        except (VastError, SecretUnavailable) as exc:
            raise HttpError(409, str(exc)) from None
        return Status(200, ActionResult(machine=MachineOut.of(_machine(machine_id)),
                                        message=f"{machine.name} destroyed"))
    if refusal := why_not(machine, action):
        raise HttpError(409, f"{machine.name}: cannot {action} ({refusal})")
    launch_action(machine, action, user)
    kind = "started" if action in LAUNCHED else "connection test started"
    return Status(202, ActionResult(
        machine=MachineOut.of(machine),
        message=f"{kind}; its progress and outcome are the machine's events"))


# --------------------------------------------------------------------------------- proofs

class ProofFilter(Schema):
    status: ProofJob.Status | None = None
    kind: str | None = None
    machine: int | None = Query(None, ge=1, le=MAX_ID)
    q: str | None = Query(None, max_length=100, description="job id (or its start), seed or "
                                                            "machine name")
    sort: str | None = Query(None, description="submitted, kind, profile, seed, status, "
                                               "machine or duration; - for descending")
    page: int = Query(1, ge=1, le=10**6)


def _proof(job_id: UUID) -> ProofJob:
    job = ProofJob.objects.select_related("machine").filter(pk=job_id).first()
    if job is None:
        raise HttpError(404, f"no proof {job_id}")
    return job


def _proof_out(job: ProofJob) -> ProofOut:
    files = list(proof_files(job))
    return ProofOut.of(job, files + ([ARCHIVE_NAME] if len(files) == len(FILES) else []))


@api.post("/proofs", response={201: list[ProofOut], 400: Problem, **DENIED}, tags=["proofs"])
def submit_proofs(request: HttpRequest, body: ProofIn):
    """Queue `count` test proofs. When no engine can take them, they fail at once with the
    reason in `error` (as the New proof page says)."""
    form = TestProofForm({k: "" if v is None else str(v) for k, v in body.dict().items()})
    _valid(form)
    jobs, _ = create_jobs(form, _user(request))
    return Status(201, [_proof_out(job) for job in jobs])


@api.get("/proofs", response={200: ProofPage, 400: Problem, **DENIED}, tags=["proofs"])
def list_proofs(request: HttpRequest, filters: Query[ProofFilter]):
    form = ProofListForm(_query(filters))
    page = form.page_of(filtered_jobs(_valid(form)).select_related("machine"))
    return ProofPage(count=page.paginator.count, page=page.number,
                     pages=page.paginator.num_pages, items=[_proof_out(j) for j in page])


@api.get("/proofs/{job_id}", response={200: ProofOut, 404: Problem, **DENIED}, tags=["proofs"])
def get_proof(request: HttpRequest, job_id: UUID):
    return _proof_out(_proof(job_id))


def _changeable(request: HttpRequest, job_id: UUID) -> ProofJob:
    job = _proof(job_id)
    if not job.may_be_changed_by(_user(request)):
        raise HttpError(403, "only staff or the person who started this proof may change it")
    return job


@api.post("/proofs/{job_id}/cancel", response={200: ProofOut, 404: Problem, 409: Problem,
                                                **DENIED}, tags=["proofs"])
def cancel_proof(request: HttpRequest, job_id: UUID):
    """A queued proof is cancelled at once; a running one is marked and the controller stops
    it on its engine (the status changes when the engine confirms)."""
    with transaction.atomic():
        job = ProofJob.objects.select_for_update().get(pk=_changeable(request, job_id).pk)
        if not job.can_cancel:
            raise HttpError(409, f"this proof is {job.status}: there is nothing to cancel")
        job.request_cancel(_user(request))
    return _proof_out(_proof(job_id))


@api.post("/proofs/{job_id}/retry", response={201: ProofOut, 404: Problem, 409: Problem,
                                               **DENIED}, tags=["proofs"])
def retry_proof(request: HttpRequest, job_id: UUID):
    """A new proof with the same kind, profile, seed and priority."""
    job = _changeable(request, job_id)
    if not job.can_retry:
        raise HttpError(409, f"only a failed or cancelled proof can be retried; this one is "
                             f"{job.status}")
    retry, created = job.retry(_user(request))
    if not created:
        raise HttpError(409, f"this proof was already retried as {retry.pk}")
    if reason := unavailable_reason(retry.machine if retry.pinned else None):
        retry.fail(reason)
    return Status(201, _proof_out(retry))


FILE_CONTENT = {kind: {"schema": {"type": "string", "format": "binary"}}
                for kind in ("application/octet-stream", "application/json", "application/gzip")}


@api.get("/proofs/{job_id}/files/{name}", response={404: Problem, **DENIED}, tags=["proofs"],
         openapi_extra={"responses": {"200": {"description": "the file",
                                              "content": FILE_CONTENT}}})
def download_proof(request: HttpRequest, job_id: UUID, name: ProofFile):
    """proof.bin, vk.json, public_inputs.json, or all three as proof.tar.gz."""
    files = proof_files(_proof(job_id))
    if name == ARCHIVE_NAME and len(files) == len(FILES):
        body, content_type = proof_archive(files), "application/gzip"
    elif name in files:
        body = files[name]
        content_type = "application/octet-stream" if name.endswith(".bin") else \
            "application/json"
    else:
        raise HttpError(404, f"this proof has no {name} (yet)")
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


# --------------------------------------------------------------------------------- offers

class OfferQuery(Schema):
    gpu_name: str | None = Query(None, max_length=100)
    num_gpus: int | None = Query(None, ge=1, le=16)
    min_cpu_ram_gb: float | None = Query(None, ge=0, le=1e6)
    max_dph: float | None = Query(None, ge=0, le=1e6)
    min_reliability: float | None = Query(None, ge=0, le=1)
    geolocation: str | None = Query(None, max_length=2, description="a country code")


@api.get("/offers", response={200: list[OfferOut], 400: Problem, 409: Problem, **DENIED},
         tags=["offers"])
async def search_offers(request: HttpRequest, filters: Query[OfferQuery]):
    """Vast offers with our bad-host flag and price-per-proof estimate."""
    search = OfferSearchForm(_query(filters))
    _valid(search)
    try:
        client = await sync_to_async(vast.VastClient.from_settings)()
        found = await client.search_offers(search.offer_filter())
    except (VastError, SecretUnavailable) as exc:
        raise HttpError(409, str(exc)) from None
    return [OfferOut(**offer) for offer in await sync_to_async(vast.annotate_offers)(found)]


@api.post("/offers/{offer_id}/rent", response={201: MachineOut, 409: Problem, **DENIED},
          tags=["offers"])
def rent_offer(request: HttpRequest, body: RentIn, offer_id: int = Path(..., ge=1, le=MAX_ID)):
    """Rent an offer: a Vast machine is created and provisioned as on the Offers page."""
    _staff(request, "rent machines")
    try:
        client = vast.VastClient.from_settings()
        offer = async_to_sync(client.offer)(offer_id, disk_gb=body.disk_gb)
        if offer is None:
            raise VastError(f"offer {offer_id} is no longer available")
        machine = async_to_sync(vast.rent)(
            client, vast.RentRequest.from_offer(offer, disk_gb=body.disk_gb))
    except (VastError, SecretUnavailable) as exc:
        raise HttpError(409, str(exc)) from None
    return Status(201, MachineOut.of(_machine(machine.pk)))


# --------------------------------------------------------------------------------- events

class EventFilter(Schema):
    machine: int | None = Query(None, ge=1, le=MAX_ID)
    level: Event.Level | None = None
    kind: str | None = Query(None, max_length=40)
    q: str | None = Query(None, max_length=100, description="words in the message")
    sort: str | None = Query(None, description="time, level, kind or machine; - for "
                                               "descending (default -time)")
    page: int = Query(1, ge=1, le=10**6)


@api.get("/events", response={200: EventPage, 400: Problem, **DENIED}, tags=["events"])
def list_events(request: HttpRequest, filters: Query[EventFilter]):
    form = EventListForm(_query(filters))
    _valid(form)
    page = form.page_of(form.events())
    return EventPage(count=page.paginator.count, page=page.number,
                     pages=page.paginator.num_pages, items=[EventOut.of(e) for e in page])


# ---------------------------------------------------------------------------------- fleet

@api.get("/fleet", response={200: FleetSummary, **DENIED}, tags=["fleet"])
def fleet_summary(request: HttpRequest):
    machines = Machine.objects.exclude(state=Machine.State.KILLED)
    now = time.time()
    since = timezone.now() - timedelta(hours=24)
    finished = ProofJob.objects.filter(finished_at__gte=since)
    money = ledger.Reading.load()
    billed = money.billed()
    done_24h = finished.filter(status=ProofJob.Status.DONE).count()
    per_proof = money.per_proof(done_24h)
    on_engines = gpus_on_engines(load_machines(money.now))
    return FleetSummary(
        machines=machines.count(),
        by_state=dict(machines.values_list("state").annotate(n=Count("pk")).values_list(
            "state", "n")),
        connected=MachineStatus.objects.filter(machine__in=machines, connected=True).count(),
        live=sum(1 for m in machines.select_related("live") if machine_connection(
            m.enabled, m.live.connected if hasattr(m, "live") else None, m.last_seen,
            m.live.interval if hasattr(m, "live") else None, now) == LIVE),
        price_per_hour=_dollars(money.dollars_per_hour()), gpus=money.gpus_rented(),
        gpus_on_engines=on_engines, spent=_dollars(money.spend()),
        billed=_dollars(billed.dollars) if billed else None,
        billed_age_s=billed.age_s(money.now) if billed else None,
        cost_per_proof_24h=_dollars(per_proof) if per_proof is not None else None,
        proofs_queued=ProofJob.objects.filter(status=ProofJob.Status.QUEUED).count(),
        proofs_in_flight=ProofJob.objects.filter(status__in=ProofJob.IN_FLIGHT).count(),
        proofs_done_24h=done_24h,
        proofs_failed_24h=finished.filter(status=ProofJob.Status.FAILED).count())


def _dollars(amount: float) -> Decimal:
    """A ledger figure as the API's decimal (to a millionth of a dollar)."""
    return Decimal(str(amount)).quantize(Decimal("0.000001"))
