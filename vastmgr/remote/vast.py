"""A Vast.ai REST client (base URL configurable) and the fleet operations built on it.

Every call is recorded as an Event (method, path, status, attempts; never the API key).
429 and 502/503/504 and dropped connections are retried with exponential backoff, like the
official CLI; other errors surface at once with Vast's own error code and message.
"""

import asyncio
import json
from dataclasses import dataclass
from decimal import Decimal

import aiohttp
import asyncssh
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine

from .conf import RemoteSettings
from .models import BadHost, HostPerf, RemoteHost, Secret

RETRY_STATUSES = {429, 502, 503, 504}
PAGE_LIMIT = 25  # the v1 instance list returns at most 25 rows per page
# Vast images start tmux on SSH login unless this file exists; the script carries no secret.
DEFAULT_ONSTART = "touch ~/.no_auto_tmux\n"


class VastError(RuntimeError):
    def __init__(self, message: str, *, status: int | None = None, code: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code


class VastAuthError(VastError):
    """The API key was rejected (Vast answers 401/403, or 404 `auth_error` on some endpoints)."""


@dataclass(frozen=True)
class OfferFilter:
    gpu_name: str = ""
    num_gpus: int | None = None
    min_cpu_ram_gb: float | None = None
    max_dph: float | None = None
    min_reliability: float | None = None
    geolocation: str = ""
    limit: int = 50

    def query(self) -> dict:
        q = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
             "rented": {"eq": False}}
        if self.gpu_name:
            q["gpu_name"] = {"eq": self.gpu_name}
        if self.num_gpus:
            q["num_gpus"] = {"eq": self.num_gpus}
        if self.min_cpu_ram_gb is not None:
            q["cpu_ram"] = {"gte": self.min_cpu_ram_gb * 1024}  # the API counts megabytes
        if self.max_dph is not None:
            q["dph_total"] = {"lte": self.max_dph}
        if self.min_reliability is not None:
            q["reliability2"] = {"gte": self.min_reliability}
        if self.geolocation:
            q["geolocation"] = {"eq": self.geolocation.upper()}
        return {**q, "order": [["dph_total", "asc"]], "type": "on-demand", "limit": self.limit}


class VastClient:
    def __init__(self, api_key: str, base_url: str, *, attempts: int = 6,
                 backoff_s: float = 0.15, backoff_factor: float = 1.5, timeout_s: float = 120,
                 sleep=asyncio.sleep):
        if not api_key:
            raise VastAuthError("no Vast API key is set; enter it on the Offers page")
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.backoff_factor = backoff_factor
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"<VastClient {self.base_url}>"

    @classmethod
    def from_settings(cls, **options) -> "VastClient":
        """Sync (reads the database): the stored API key and the configured base URL."""
        return cls(Secret.reveal(Secret.VAST_API_KEY), RemoteSettings.load().vast_url, **options)

    async def call(self, method: str, path: str, *, body=None, params=None, machine=None):
        headers = {"Authorization": f"Bearer {self._api_key}", "Accept": "application/json"}
        query = {k: json.dumps(v) if isinstance(v, dict | list) else str(v)
                 for k, v in (params or {}).items()}
        delay = self.backoff_s
        status, payload = None, None
        async with aiohttp.ClientSession(timeout=self.timeout) as http:
            for attempt in range(1, self.attempts + 1):
                try:
                    async with http.request(method, self.base_url + path, json=body,
                                            params=query, headers=headers) as response:
                        status = response.status
                        payload = await response.json(content_type=None) \
                            if await response.read() else None
                except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                    status, payload = None, {"msg": type(exc).__name__}
                except json.JSONDecodeError:
                    payload = {"msg": "the response is not JSON"}
                if (status is None or status in RETRY_STATUSES) and attempt < self.attempts:
                    await self._sleep(delay)
                    delay *= self.backoff_factor
                    continue
                break
        await sync_to_async(self._record)(method, path, status, attempt, payload, machine)
        if status is not None and 200 <= status < 300:
            return payload
        raise self._error(method, path, status, payload, attempt)

    def _record(self, method, path, status, attempts, payload, machine) -> None:
        ok = status is not None and 200 <= status < 300
        message = f"vast {method} {path} → {status or 'no response'}"
        if attempts > 1:
            message += f" after {attempts} attempts"
        if not ok:
            message += f": {_describe(payload)}"
        Event.record("vast", message, machine=machine,
                     level=Event.Level.INFO if ok else Event.Level.ERROR,
                     data={"method": method, "path": path, "status": status,
                           "attempts": attempts})

    def _error(self, method, path, status, payload, attempts) -> VastError:
        code = (payload or {}).get("error", "") if isinstance(payload, dict) else ""
        text = f"Vast {method} {path} failed ({status or 'no response'}"
        text += f", {attempts} attempts): {_describe(payload)}"
        if status in (401, 403) or code == "auth_error":
            return VastAuthError(text + " — the API key was rejected; enter a valid key",
                                 status=status, code=code)
        return VastError(text, status=status, code=code)

    async def search_offers(self, offer_filter: OfferFilter) -> list[dict]:
        payload = await self.call("POST", "/api/v0/bundles/", body=offer_filter.query())
        return list((payload or {}).get("offers") or [])

    async def create_instance(self, offer_id: int, *, image: str, disk_gb: int, label: str,
                              onstart: str = DEFAULT_ONSTART, env: dict | None = None) -> int:
        body = {"client_id": "me", "image": image, "disk": disk_gb, "label": label,
                "onstart": onstart, "runtype": "ssh_direc ssh_proxy", "env": env or {}}
        payload = await self.call("PUT", f"/api/v0/asks/{int(offer_id)}/", body=body)
        if not payload or not payload.get("success") or "new_contract" not in payload:
            raise VastError(f"Vast did not create an instance: {_describe(payload)}")
        return int(payload["new_contract"])

    async def attach_ssh_key(self, instance_id: int, public_key: str, *, machine=None) -> None:
        await self.call("POST", f"/api/v0/instances/{int(instance_id)}/ssh/",
                        body={"ssh_key": public_key}, machine=machine)

    async def instance(self, instance_id: int, *, machine=None) -> dict | None:
        payload = await self.call("GET", f"/api/v0/instances/{int(instance_id)}/",
                                  params={"owner": "me"}, machine=machine)
        return (payload or {}).get("instances") or None

    async def list_instances(self) -> list[dict]:
        """All instances, following the v1 keyset pagination (v0's list is deprecated)."""
        rows, token = [], None
        while True:
            params = {"limit": PAGE_LIMIT, "order_by": [{"col": "id", "dir": "asc"}]}
            if token:
                params["after_token"] = token
            payload = await self.call("GET", "/api/v1/instances/", params=params) or {}
            rows.extend(payload.get("instances") or [])
            token = payload.get("next_token")
            if not token:
                return rows

    async def destroy_instance(self, instance_id: int, *, machine=None) -> None:
        await self.call("DELETE", f"/api/v0/instances/{int(instance_id)}/", body={},
                        machine=machine)


def _describe(payload) -> str:
    if isinstance(payload, dict):
        return str(payload.get("msg") or payload.get("detail") or payload.get("error") or
                   "no details")[:300]
    return "no details"


def ssh_endpoint(instance: dict) -> tuple[str, int] | None:
    """Direct SSH when port 22 is mapped, else Vast's SSH proxy; None while not yet reachable."""
    mapped = (instance.get("ports") or {}).get("22/tcp") or []
    if mapped and instance.get("public_ipaddr"):
        return instance["public_ipaddr"].strip(), int(mapped[0]["HostPort"])
    if instance.get("ssh_host") and instance.get("ssh_port"):
        return instance["ssh_host"], int(instance["ssh_port"])
    return None


# ---------------------------------------------------------------- offers and price per proof

def annotate_offers(offers: list[dict]) -> list[dict]:
    """Add bad-host flags and our price-per-proof estimate from recorded benchmarks."""
    bad = set(BadHost.objects.filter(provider=Machine.Provider.VAST)
              .values_list("provider_machine_id", flat=True))
    annotated = []
    for offer in offers:
        rate, source = estimate_rate(offer.get("machine_id"), offer.get("gpu_name", ""),
                                     offer.get("num_gpus") or 0)
        dph = offer.get("dph_total")
        annotated.append({
            **offer,
            "bad_host": offer.get("machine_id") in bad,
            "proofs_per_hour": rate,
            "rate_source": source,
            "price_per_proof": (dph / rate) if rate and dph is not None else None,
        })
    return annotated


def estimate_rate(machine_id, gpu_name: str, gpu_count: int) -> tuple[float | None, str]:
    """Proofs per hour: this machine's best benchmark, else the mean for the same GPU set."""
    exact = HostPerf.objects.filter(provider_machine_id=machine_id, gpu_name=gpu_name,
                                    gpu_count=gpu_count).first()
    if exact:
        return exact.proofs_per_hour, "this machine"
    similar = list(HostPerf.objects.filter(gpu_name=gpu_name, gpu_count=gpu_count)
                   .values_list("proofs_per_hour", flat=True))
    if similar:
        return sum(similar) / len(similar), f"{len(similar)} similar hosts"
    return None, ""


# ------------------------------------------------------------------ rent, reconcile, destroy

@dataclass(frozen=True)
class RentRequest:
    offer_id: int
    machine_id: int | None
    host_id: int | None
    gpu_name: str
    gpu_count: int
    dph_total: float | None
    image: str = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    disk_gb: int = 64

    @classmethod
    def from_offer(cls, offer: dict, **overrides) -> "RentRequest":
        return cls(offer_id=int(offer["id"]), machine_id=offer.get("machine_id"),
                   host_id=offer.get("host_id"), gpu_name=offer.get("gpu_name", ""),
                   gpu_count=int(offer.get("num_gpus") or 0), dph_total=offer.get("dph_total"),
                   **overrides)


async def rent(client: VastClient, request: RentRequest) -> Machine:
    """Create an instance, a Machine row for it, and an SSH key only this machine uses."""
    if request.machine_id is not None and await BadHost.objects.filter(
            provider=Machine.Provider.VAST, provider_machine_id=request.machine_id).aexists():
        raise VastError(f"Vast machine {request.machine_id} is on the bad-hosts list")
    instance_id = await client.create_instance(
        request.offer_id, image=request.image, disk_gb=request.disk_gb,
        label=f"vastmgr-offer-{request.offer_id}")
    key = asyncssh.generate_private_key("ssh-ed25519")
    machine = await sync_to_async(_register_rented)(request, instance_id, key)
    await client.attach_ssh_key(instance_id, key.export_public_key().decode().strip(),
                                machine=machine)
    instance = await client.instance(instance_id, machine=machine)
    if instance:
        await sync_to_async(_apply_instance)(machine, instance)
    return machine


def _register_rented(request: RentRequest, instance_id: int, key: asyncssh.SSHKey) -> Machine:
    with transaction.atomic():
        machine = Machine.objects.create(
            name=f"vast-{instance_id}", provider=Machine.Provider.VAST,
            vast_instance_id=instance_id, vast_machine_id=request.machine_id,
            vast_host_id=request.host_id, gpu_name=request.gpu_name,
            gpu_count=request.gpu_count,
            price_per_hour=Decimal(str(request.dph_total)) if request.dph_total else None,
        )
        remote = RemoteHost.objects.create(machine=machine, billing_started=timezone.now())
        Secret.store(remote.ssh_key_secret_name, key.export_private_key().decode())
        Event.record("vast", f"rented offer {request.offer_id} as instance {instance_id}",
                     machine=machine, data={"offer_id": request.offer_id,
                                            "instance_id": instance_id})
    return machine


def _apply_instance(machine: Machine, instance: dict) -> None:
    """Copy the provider's view (SSH endpoint, price) onto the Machine."""
    changed = []
    endpoint = ssh_endpoint(instance)
    if endpoint and (machine.host, machine.ssh_port) != endpoint:
        machine.host, machine.ssh_port = endpoint
        changed += ["host", "ssh_port"]
    if instance.get("dph_total") is not None:
        price = Decimal(str(instance["dph_total"])).quantize(Decimal("0.0001"))
        if machine.price_per_hour != price:
            machine.price_per_hour = price
            changed.append("price_per_hour")
    if changed:
        machine.save(update_fields=[*changed, "updated"])


async def reconcile(client: VastClient) -> dict:
    """Match provider instances with Machine rows; a vanished instance kills its machine."""
    instances = {int(i["id"]): i for i in await client.list_instances()}
    return await sync_to_async(_reconcile_rows)(instances)


def _reconcile_rows(instances: dict[int, dict]) -> dict:
    summary = {"updated": 0, "killed": 0, "unmanaged": []}
    known = set()
    live = Machine.objects.filter(provider=Machine.Provider.VAST,
                                  vast_instance_id__isnull=False).exclude(
        state=Machine.State.KILLED)
    for machine in live:
        known.add(machine.vast_instance_id)
        instance = instances.get(machine.vast_instance_id)
        if instance is None:
            end_billing(machine)
            machine.kill("the instance disappeared from Vast")
            summary["killed"] += 1
            continue
        _apply_instance(machine, instance)
        summary["updated"] += 1
    killed_ids = set(Machine.objects.filter(provider=Machine.Provider.VAST,
                                            state=Machine.State.KILLED)
                     .values_list("vast_instance_id", flat=True))
    for instance_id in sorted(set(instances) - known - killed_ids):
        summary["unmanaged"].append(instance_id)
        Event.record("vast", f"instance {instance_id} is not managed by vastmgr",
                     level=Event.Level.WARNING, data={"instance_id": instance_id})
    return summary


def end_billing(machine: Machine) -> None:
    RemoteHost.objects.filter(machine=machine, billing_ended__isnull=True).update(
        billing_ended=timezone.now())


async def destroy(client: VastClient, machine: Machine, reason: str) -> None:
    """Destroy the instance (already gone counts as done) and kill the machine with `reason`."""
    if machine.vast_instance_id is not None:
        try:
            await client.destroy_instance(machine.vast_instance_id, machine=machine)
        except VastError as exc:
            if exc.status != 404 or exc.code == "auth_error":
                raise
    await sync_to_async(_kill_destroyed)(machine.pk, reason)


def _kill_destroyed(machine_id: int, reason: str) -> None:
    machine = Machine.objects.get(pk=machine_id)
    end_billing(machine)
    if machine.state != Machine.State.KILLED:
        machine.kill(reason)
