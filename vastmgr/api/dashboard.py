"""vast-manager's `GET /api/dashboard`, with the field names its main.go produced, for the
scripts written against it. Its instances are the ones that called home (vastmgr.instances),
joined with what we know of their machines; our Vast machines that have not called home are
"loading", as vast-manager showed rented instances not yet registered. Numbers we do not have
(GPU utilisation and temperature, disk, bandwidth...) are 0, as Go's zero value was. Money and
GPU counts come from the ledger, so they are the fleet page's whether or not an instance called
home."""

from datetime import UTC, datetime

from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models import Count
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, NinjaAPI, Schema
from ninja.errors import HttpError

from vastmgr.api.v1 import TokenAuth, django_auth
from vastmgr.fleet import ledger
from vastmgr.fleet.models import Event, Machine
from vastmgr.instances.models import LOG_LINES_PER_INSTANCE, SOURCE_MAX, UUID_MAX, Instance, LogLine
from vastmgr.lib.errors import SecretUnavailable, VastError
from vastmgr.lib.params import MAX_ID
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import vast
from vastmgr.remote.models import BadMachine, MachinePerf
from vastmgr.remote.views import destroy

compat = NinjaAPI(title="vast-manager compatibility", version="vast-manager",
                  urls_namespace="vast-manager", auth=[TokenAuth(), django_auth],
                  docs_url=None, openapi_url=None)

ZERO_FACTS = {"gpu_util": 0.0, "gpu_temp": 0.0, "gpu_ram_mb": 0, "cuda_version": 0.0,
              "inet_down_mbps": 0.0, "inet_up_mbps": 0.0, "cpu_util": 0.0, "mem_usage_gb": 0.0,
              "mem_limit_gb": 0.0, "disk_space_gb": 0.0, "gpu_mem_bw": 0.0,
              "driver_version": "", "reliability": 0.0, "gpu_frac": 0.0, "status_msg": "",
              "geolocation": "", "cpu_ram_mb": 0}


def _when(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def _machine_facts(machine: Machine | None, money: ledger.Reading) -> dict:
    if machine is None:
        return {"vast_id": 0, "gpu_name": "", "num_gpus": 0, "dph_total": 0.0, "ssh_cmd": "",
                "host_id": 0, "machine_id": 0, "public_ip": "", "start_date": 0.0}
    started = getattr(getattr(machine, "remote", None), "billing_started", None)
    return {"vast_id": machine.vast_instance_id or 0, "gpu_name": machine.gpu_name,
            "num_gpus": machine.gpu_count, "dph_total": money.dollars_per_hour(machine.pk),
            "ssh_cmd": f"ssh -p {machine.ssh_port} {machine.ssh_user}@{machine.host}"
            if machine.host else "",
            "host_id": machine.vast_host_id or 0, "machine_id": machine.vast_machine_id or 0,
            "public_ip": machine.host, "start_date": started.timestamp() if started else 0.0}


def _row(instance: Instance, log_lines: dict[str, int], money: ledger.Reading) -> dict:
    row = {"uuid": instance.uuid, "label": instance.label, "runner_id": instance.runner_id,
           "state": instance.state, "min_rate": instance.min_rate,
           "registered_at": _when(instance.registered_at)}
    optional = {"param_done_at": _when(instance.param_done_at),
                "bench_done_at": _when(instance.bench_done_at),
                "bench_rate": instance.bench_rate, "killed_at": _when(instance.killed_at),
                "kill_reason": instance.kill_reason or None}
    row |= {k: v for k, v in optional.items() if v is not None}
    facts = _machine_facts(instance.machine, money)
    rate, lines = instance.bench_rate or 0, log_lines.get(instance.uuid, 0)
    return row | ZERO_FACTS | facts | {
        "price_per_proof": facts["dph_total"] / rate if rate > 0 else 0.0,
        "log_lines": lines, "has_logs": lines > 0}


def _done_24h(now: float) -> int:
    since = datetime.fromtimestamp(now, UTC) - ledger.PER_PROOF_WINDOW
    return ProofJob.objects.filter(status=ProofJob.Status.DONE, finished_at__gte=since).count()


def _vast_data_age() -> float | None:
    """Seconds since our last successful look at Vast's instance list (the reconcile)."""
    last = Event.objects.filter(kind="vast", data__path="/api/v1/instances/",
                                data__status=200).order_by("-time").first()
    return (timezone.now() - last.time).total_seconds() if last else None


@compat.get("/dashboard", tags=["vast-manager"])
def dashboard(request: HttpRequest) -> dict:
    instances = list(Instance.objects.select_related("machine", "machine__remote"))
    counts = dict(LogLine.objects.filter(uuid__in=[i.uuid for i in instances])
                  .values_list("uuid").annotate(n=Count("pk")).values_list("uuid", "n"))
    money = ledger.Reading.load()
    rows = [_row(i, counts, money) for i in instances]
    called_home = {i.machine_id for i in instances if i.machine_id}
    loading = Machine.objects.filter(provider=Machine.Provider.VAST).exclude(
        state=Machine.State.KILLED).exclude(pk__in=called_home).select_related("remote")
    for machine in loading:
        rows.append({"uuid": "", "label": machine.name, "runner_id": 0, "state": "loading",
                     "min_rate": 0.0, "registered_at": "", "price_per_proof": 0.0,
                     "has_logs": False, "log_lines": 0}
                    | ZERO_FACTS | _machine_facts(machine, money))
    summary = {"total": len(rows), "running": 0, "benching": 0, "fetching": 0, "loading": 0,
               "killed": 0, "total_proofs_hour": 0.0,
               # Money and GPUs from the ledger: every billing rental, called home or not.
               "total_dph": money.dollars_per_hour(), "total_gpus": money.gpus_rented(),
               "total_spent": money.spend(),
               "avg_price_per_proof": money.per_proof(_done_24h(money.now)) or 0.0}
    bucket = {"running": "running", "bench_done": "benching", "params_done": "benching",
              "registered": "fetching", "killed": "killed", "loading": "loading"}
    for row in rows:
        summary[bucket[row["state"]]] += 1
        if row["state"] == "running":
            summary["total_proofs_hour"] += row.get("bench_rate", 0.0)
    return {"instances": rows,
            "bad_machines": [{"machine_id": str(b.provider_machine_id), "reason": b.reason,
                           "added_at": _when(b.created)}
                          for b in BadMachine.objects.filter(provider=Machine.Provider.VAST)],
            "summary": summary, "updated_at": _when(timezone.now()),
            "vast_cache_age_s": _vast_data_age()}


@compat.get("/instance-logs/{uuid}", tags=["vast-manager"])
def instance_logs(request: HttpRequest, uuid: str, source: str = "",
                  tail: int = 1000) -> list[dict]:
    """An instance's pushed lines, oldest first: [{src, text, ts (ms)}]; `source` filters
    ("all" or empty: every source); a tail that is not positive means 1000, as in main.go."""
    limit = min(tail, LOG_LINES_PER_INSTANCE) if tail > 0 else 1000  # no buffer holds more
    lines = LogLine.tail(uuid[:UUID_MAX], source[:SOURCE_MAX], limit)
    return [line.as_json() for line in lines]


@compat.get("/host-perf", tags=["vast-manager"])
def host_perf(request: HttpRequest) -> list[dict]:
    """The best benchmark per Vast machine and GPU set (one per machine, as main.go kept)."""
    return [{"machine_id": perf.provider_machine_id, "gpu_name": perf.gpu_name,
             "num_gpus": perf.gpu_count, "bench_rate": perf.proofs_per_hour,
             "measured_at": _when(perf.updated)}
            for perf in MachinePerf.objects.filter(provider_machine_id__isnull=False)]


class KillIn(Schema):
    vast_id: int = Field(0, ge=0, le=MAX_ID)
    uuid: str = Field("", max_length=UUID_MAX)


@compat.post("/kill", tags=["vast-manager"])
def kill(request: HttpRequest, body: KillIn) -> dict:
    """Destroy a Vast instance (our machine's, through its machine) and mark the called-home
    instance killed, as vast-manager's Kill button did. Staff only."""
    user = request.auth  # type: ignore[attr-defined]  # set by the API's authentication
    if not user.is_staff:
        raise HttpError(403, "only staff may kill instances")
    reason = f"killed by {user.get_username()} (vast-manager API)"
    try:
        if body.vast_id > 0:
            machine = Machine.objects.filter(provider=Machine.Provider.VAST,
                                             vast_instance_id=body.vast_id).exclude(
                state=Machine.State.KILLED).first()
            if machine is not None:
                destroy(machine, reason)
            else:
                client = vast.VastClient.from_settings()
                async_to_sync(client.destroy_instance)(body.vast_id)
    except (VastError, SecretUnavailable) as exc:
        raise HttpError(409, str(exc)) from None
    if body.uuid:
        with transaction.atomic():
            found = Instance.objects.select_for_update().filter(uuid=body.uuid).exclude(
                state=Instance.State.KILLED).first()
            if found is not None:
                found.kill("manually killed via UI")
                found.note(reason)
    return {"ok": True}
