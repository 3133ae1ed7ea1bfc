"""The rest of vast-manager's operator routes, with main.go's bodies and codes, behind the same
authentication as `/api/dashboard`: the manager log, the offer search with its filter string,
deploy (rent an upstream cuzk worker), and an instance's cuzk status.

Errors are main.go's `{"error": msg}`. Where main.go answered 500 (a failed `vastai` call) the
answer here is 409 with Vast's reason: the provider refused, the dashboard did not fail."""

import math

import aiohttp
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, Schema

from vastmgr.api.dashboard import _when, compat
from vastmgr.fleet.models import Event, Machine
from vastmgr.instances.models import UUID_MAX, Instance
from vastmgr.lib.errors import SecretUnavailable, SSHError, VastError
from vastmgr.lib.params import MAX_ID
from vastmgr.remote import ssh_loop as background
from vastmgr.remote import vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.forms import RentForm
from vastmgr.remote.models import BadMachine, MachinePerf
from vastmgr.remote.offer_query import DEFAULT_FILTER, FilterError, conditions
from vastmgr.remote.tunnel import has_engine
from vastmgr.remote.views import rent_offer

MANAGER_LOG_TAIL, MANAGER_LOG_MAX = 500, 5000  # main.go's default tail and its buffer
# main.go's deploy defaults: 250 GB of disk, a minimum of 30 proofs/h.
DEPLOY_DISK_GB, DEPLOY_MIN_RATE = 250, 30.0
OFFERS_LIMIT = 64
# main.go: curl --max-time 3 over ssh -o ConnectTimeout=5.
STATUS_READ_S, STATUS_BUDGET_S = 3.0, 10.0
# What main.go's VastOffer carried, with Go's zero values for what Vast leaves out.
OFFER_FIELDS = {"id": 0, "host_id": 0, "machine_id": 0, "gpu_name": "", "num_gpus": 0,
                "gpu_ram": 0, "gpu_total_ram": 0, "gpu_mem_bw": 0.0, "gpu_lanes": 0,
                "cpu_ram": 0, "cpu_cores": 0, "cpu_cores_effective": 0.0, "cpu_name": "",
                "cpu_ghz": 0.0, "dph_base": 0.0, "dph_total": 0.0, "disk_space": 0.0,
                "disk_bw": 0.0, "inet_down": 0.0, "inet_up": 0.0, "geolocation": "",
                "country_code": "", "cuda_max_good": 0.0, "reliability2": 0.0, "dlperf": 0.0,
                "compute_cap": 0, "pcie_bw": 0.0, "host_run_time": 0.0}


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _positive(raw: str, default: int, most: int) -> int:
    """main.go's `tail`: a positive integer, anything else the default."""
    try:
        value = int(raw)
    except ValueError:
        return default
    return min(value, most) if value > 0 else default


@compat.get("/manager-logs", tags=["vast-manager"])
def manager_logs(request: HttpRequest, tail: str = "") -> list[dict]:
    """The manager log (here: the event log), oldest first, as main.go's
    [{src: "manager", text, ts (ms)}], each text a line as Go's log package wrote it."""
    limit = _positive(tail, MANAGER_LOG_TAIL, MANAGER_LOG_MAX)
    events = reversed(Event.objects.order_by("-time", "-pk")[:limit])
    return [{"src": "manager",
             "text": f"{event.time:%Y/%m/%d %H:%M:%S} [{event.kind}] {event.message}",
             "ts": int(event.time.timestamp() * 1000)} for event in events]


@compat.get("/offers", tags=["vast-manager"])
def offers(request: HttpRequest, filter: str = "") -> HttpResponse | dict:
    """Vast's offers for a `vastai search offers` filter string (vast-manager's default when
    empty), each with known_perf (this machine's best benchmark), is_bad_host, bad_reason."""
    try:
        wanted = conditions(filter or DEFAULT_FILTER)
    except FilterError as exc:
        return _error(f"bad filter: {exc}", 400)
    try:
        client = vast.VastClient.from_settings()
        found = async_to_sync(client.search_offers)(
            vast.OfferFilter(conditions=wanted, limit=OFFERS_LIMIT))
    except (VastError, SecretUnavailable) as exc:
        return _error(f"search failed: {exc}", 409)
    bad = dict(BadMachine.objects.filter(provider=Machine.Provider.VAST).values_list(
        "provider_machine_id", "reason"))
    perf = {p.provider_machine_id: p for p in MachinePerf.objects.filter(
        provider_machine_id__in=[o.get("machine_id") for o in found]).order_by("proofs_per_hour")}
    rows = []
    for offer in found:
        row = {name: offer.get(name, zero) if offer.get(name) is not None else zero
               for name, zero in OFFER_FIELDS.items()}
        if offer.get("reliability2") is None and offer.get("reliability") is not None:
            row["reliability2"] = offer["reliability"]
        known = perf.get(offer.get("machine_id"))
        if known is not None:
            row["known_perf"] = {"machine_id": known.provider_machine_id,
                                 "gpu_name": known.gpu_name, "num_gpus": known.gpu_count,
                                 "bench_rate": known.proofs_per_hour,
                                 "measured_at": _when(known.updated)}
        row["is_bad_host"] = offer.get("machine_id") in bad
        if row["is_bad_host"]:
            row["bad_reason"] = bad[offer["machine_id"]]
        rows.append(row)
    return {"offers": rows, "total": len(rows), "filtered": len(rows)}


class DeployIn(Schema):
    offer_id: int = Field(0, le=MAX_ID)
    machine_id: int = Field(0, le=MAX_ID)
    min_rate: float = Field(0.0, le=1e9)
    disk: int = Field(0, le=MAX_ID)


@compat.post("/deploy", tags=["vast-manager"])
def deploy(request: HttpRequest, body: DeployIn) -> HttpResponse | dict:
    """Rent an offer as an upstream cuzk worker (the configured image, env and onstart; the
    minimum rate in its MIN_RATE), as vast-manager's Deploy did. Staff only."""
    if not request.auth.is_staff:  # type: ignore[attr-defined]  # set by the API's auth
        return _error("only staff may deploy", 403)
    if body.offer_id <= 0:
        return _error("offer_id required", 400)
    disk = body.disk if body.disk > 0 else DEPLOY_DISK_GB
    limits = RentForm.base_fields["disk_gb"]
    if not limits.min_value <= disk <= limits.max_value:  # type: ignore[attr-defined]
        return _error(f"disk must be {limits.min_value} to {limits.max_value} GB", 400)  # type: ignore[attr-defined]
    min_rate = body.min_rate if body.min_rate > 0 else DEPLOY_MIN_RATE
    if body.machine_id > 0:
        reason = BadMachine.objects.filter(provider=Machine.Provider.VAST,
                                        provider_machine_id=body.machine_id).values_list(
            "reason", flat=True).first()
        if reason is not None:
            return _error(f"machine {body.machine_id} is on bad hosts list: {reason}", 409)
    try:
        machine = rent_offer(body.offer_id, disk,
                             vast.Deployment.upstream_defaults(RemoteSettings.load()),
                             min_rate=math.ceil(min_rate))
    except (VastError, SecretUnavailable) as exc:
        return _error(f"deploy failed: {exc}", 409)
    return {"ok": True, "instance_id": machine.vast_instance_id or 0,
            "message": f"rented offer {body.offer_id} as {machine.name} (instance "
                       f"{machine.vast_instance_id}); it must benchmark at least "
                       f"{math.ceil(min_rate)} proofs/h"}


@compat.get("/cuzk-status/{uuid}", tags=["vast-manager"])
def cuzk_status(request: HttpRequest, uuid: str) -> HttpResponse:
    """The instance's engine status JSON, read through its machine's SSH tunnel and passed
    through; 502 {"error"} when it cannot be read (main.go's codes)."""
    instance = Instance.objects.select_related("machine").filter(uuid=uuid[:UUID_MAX]).first()
    machine = instance.machine if instance is not None else None
    if machine is None or machine.state == Machine.State.KILLED or not machine.host or \
            not has_engine(machine):
        return _error("no SSH info for instance", 404)
    try:
        raw = background.run(lambda: _read_status(machine), STATUS_BUDGET_S)
    except (SSHError, SecretUnavailable, aiohttp.ClientError, TimeoutError, OSError) as exc:
        return _error(f"status unreachable over SSH: {exc or type(exc).__name__}", 502)
    response = HttpResponse(raw, content_type="application/json")
    response["Access-Control-Allow-Origin"] = "*"
    return response


async def _read_status(machine: Machine) -> bytes:
    port = await background.pool.get(machine.pk).tunnel(machine.engine_port)
    headers = {"Authorization": f"Bearer {machine.engine_token}"} \
        if machine.engine_token and not machine.is_upstream else {}
    timeout = aiohttp.ClientTimeout(total=STATUS_READ_S)
    async with aiohttp.ClientSession(timeout=timeout) as http, \
            http.get(f"http://127.0.0.1:{port}/status", headers=headers) as answer:
        if answer.status != 200:
            raise aiohttp.ClientResponseError(answer.request_info, (), status=answer.status,
                                              message=f"GET /status answered {answer.status}")
        return await answer.read()
