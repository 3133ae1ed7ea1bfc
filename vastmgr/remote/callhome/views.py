"""vast-manager's instance-facing routes, answered as it answered them (see protocol.py)."""

from datetime import UTC, datetime

from django.db import transaction
from django.http import HttpRequest, HttpResponse

from vastmgr.fleet.models import Machine
from vastmgr.instances.models import (
    LOG_PUSH_MAX_BYTES,
    SOURCE_MAX,
    UUID_MAX,
    DeploySecret,
    Instance,
    LogLine,
)
from vastmgr.instances.protocol import ProtocolError, answer, check_owner, decode, error, route
from vastmgr.remote import benchmark_results as aftermath
from vastmgr.remote.models import BadMachine


def _instance(uuid: str, secret: DeploySecret | None, *, lock: bool = False) -> Instance:
    rows = Instance.objects.select_for_update() if lock else Instance.objects
    found = rows.filter(uuid=uuid).first()
    if found is None:
        raise ProtocolError("instance not found", 404)
    check_owner(found, secret)
    return found


@route("POST")
def register(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    body = decode(request, {"label": str, "min_rate": float})
    if not body["label"]:
        return error("label is required", 400)
    if len(body["label"]) > 200:
        return error("label is longer than 200 characters", 400)
    Instance.purge()
    instance = Instance.register(body["label"], body["min_rate"], secret)
    return answer({"uuid": instance.uuid, "runner_id": instance.runner_id})


@route("POST")
def param_done(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    body = decode(request, {"uuid": str})
    with transaction.atomic():
        _instance(body["uuid"], secret, lock=True).params_done()
    return answer({"ok": True})


@route("POST")
def bench_done(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    body = decode(request, {"uuid": str, "rate": float})
    with transaction.atomic():
        instance = _instance(body["uuid"], secret, lock=True)
        passed = instance.bench_done(body["rate"])
    if body["rate"] > 0 or not passed:
        aftermath.after_benchmark(instance.pk, body["rate"], passed)
    return answer({"ok": True, "passed": passed})


@route("GET")
def runner_id(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    uuid = request.GET.get("uuid", "")
    if not uuid:
        return error("uuid query param required", 400)
    return answer({"runner_id": _instance(uuid, secret).runner_id})


@route("POST")
def running(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    body = decode(request, {"uuid": str})
    with transaction.atomic():
        found = Instance.objects.select_for_update().filter(uuid=body["uuid"]).exclude(
            state=Instance.State.KILLED).first()
        if found is None:
            return error("instance not found or already killed", 404)
        check_owner(found, secret)
        found.running()
    return answer({"ok": True})


def _timestamp(when: datetime | None) -> str | None:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when else None


@route("GET")
def status(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    rows = []
    for instance in Instance.objects.all():
        row = {"uuid": instance.uuid, "label": instance.label, "runner_id": instance.runner_id,
               "state": instance.state, "min_rate": instance.min_rate,
               "registered_at": _timestamp(instance.registered_at)}
        optional = {"param_done_at": _timestamp(instance.param_done_at),
                    "bench_done_at": _timestamp(instance.bench_done_at),
                    "bench_rate": instance.bench_rate,
                    "killed_at": _timestamp(instance.killed_at),
                    "kill_reason": instance.kill_reason or None}
        rows.append(row | {k: v for k, v in optional.items() if v is not None})  # omitempty
    return answer(rows)


@route("GET", "POST")
def bad_host(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    if request.method == "GET":
        return answer([{"machine_id": str(bad.provider_machine_id), "reason": bad.reason,
                        "added_at": _timestamp(bad.created)}
                       for bad in BadMachine.objects.filter(provider=Machine.Provider.VAST)])
    body = decode(request, {"machine_id": str, "reason": str})
    if not body["machine_id"]:
        return error("machine_id required", 400)
    if not (body["machine_id"].isascii() and body["machine_id"].isdigit()) or \
            len(body["machine_id"]) > 18:
        return error("machine_id must be a Vast machine id (digits)", 400)
    with transaction.atomic():
        BadMachine.flag(int(body["machine_id"]), body["reason"] or "reported by an instance")
        BadMachine.objects.filter(provider=Machine.Provider.VAST,
                               provider_machine_id=int(body["machine_id"])).update(
            reason=body["reason"] or "reported by an instance")
    return answer({"ok": True})


@route("DELETE")
def bad_machine_delete(request: HttpRequest, secret: DeploySecret | None,
                    machine_id: str) -> HttpResponse:
    if machine_id.isascii() and machine_id.isdigit() and len(machine_id) <= 18:
        BadMachine.objects.filter(provider=Machine.Provider.VAST,
                               provider_machine_id=int(machine_id)).delete()
    return answer({"ok": True})


@route("POST")
def log_push(request: HttpRequest, secret: DeploySecret | None) -> HttpResponse:
    uuid = request.headers.get("X-Instance-UUID", "")
    if not uuid:
        return error("X-Instance-UUID header required", 400)
    if len(uuid) > UUID_MAX:
        return error(f"X-Instance-UUID is longer than {UUID_MAX} characters", 400)
    source = request.headers.get("X-Log-Source", "") or "unknown"
    if len(source) > SOURCE_MAX:
        return error(f"X-Log-Source is longer than {SOURCE_MAX} characters", 400)
    known = Instance.objects.filter(uuid=uuid).first()
    if known is not None:
        check_owner(known, secret)
    # Read at most 256 KB; the rest of a longer body is dropped, as vast-manager did.
    LogLine.push(uuid, source, request.read(LOG_PUSH_MAX_BYTES))
    return HttpResponse(status=204)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return HttpResponse("404 page not found\n", status=404,
                        content_type="text/plain; charset=utf-8")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error("bad request: the body is too large or malformed", 400)


def server_error(request: HttpRequest) -> HttpResponse:
    return error("internal error: the manager could not answer; try again", 500)
