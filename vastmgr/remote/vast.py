"""A Vast.ai REST client (base URL configurable) and the fleet operations built on it.

Every call is recorded as an Event (method, path, status, attempts, seconds waited; never the
API key). Field names, units and paths follow the official `vastai` client.

Retries: 429, 502/503/504 and calls that got no usable response are retried within a total
wait budget per call (`RetryPolicy`). Vast's `Retry-After` (seconds or an HTTP date) is
honoured, otherwise the wait grows exponentially with jitter. Interactive calls (a page is
waiting) get a short budget and, when a 429 outlasts it, a `VastRateLimited` error that says
when to try again; the automation loop gets a long one. A create is never retried when its
outcome is unknown (no response, 5xx): `rent` looks for the instance by its label instead.
"""

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import asyncssh
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from vastmgr.fleet import ledger
from vastmgr.fleet.models import BillingInterval, Event, Machine
from vastmgr.instances.models import SECRET_ENV, DeploySecret
from vastmgr.lib.errors import VastAuthError, VastError, VastOutcomeUnknown, VastRateLimited
from vastmgr.proofs import jobs
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import alerts
from vastmgr.remote.config import RemoteSettings, parse_env
from vastmgr.remote.models import (
    BadMachine,
    MachinePerf,
    ProviderCall,
    RemoteMachine,
    Secret,
    UnmanagedInstance,
    VastSync,
)

RETRY_STATUSES = {429, 502, 503, 504}
PAGE_LIMIT = 25  # the v1 instance list returns at most 25 rows per page
# Vast images start tmux on SSH login unless this file exists; the script carries no secret.
DEFAULT_ONSTART = "touch ~/.no_auto_tmux\n"
# The disk a rent asks for, and so the storage every offer is priced with: $/h shown = charged.
DEFAULT_DISK_GB = 64
# Every instance we create carries this label prefix plus a uuid chosen before the call.
LABEL_PREFIX = "vastmgr-"
# A machine whose create outcome was unknown and that no instance claims by label after this
# long is given up (the create did not happen).
RENT_LOOKUP_GRACE = timedelta(minutes=5)
# Vast's actual_status values on the way up; any other value than "running" means down.
STARTING_STATUSES = {"", "created", "loading", "scheduling", "rebooting"}
# Vast bills an instance's GPUs while it holds them (running, frozen, rebooting; and while
# it cannot tell: unknown, offline); otherwise (being created, loading, stopped, exited)
# only its disk.
GPU_BILLING_STATUSES = {"running", "frozen", "rebooting", "unknown", "offline"}
CHARGES_PAGE_LIMIT = 500  # the server's maximum (official OpenAPI, showCharges)
HOURS_PER_MONTH = 30 * 24  # Vast's storage_cost is $/GB/month (a 30-day month)
# Vast's offer types (`search offers -t`): "bid" is interruptible, priced at the minimum bid.
ON_DEMAND, INTERRUPTIBLE, RESERVED = "on-demand", "bid", "reserved"
OFFER_TYPES = (ON_DEMAND, INTERRUPTIBLE, RESERVED)
# The bid bounds of Vast's API ($/h): create takes up to 128, change bid up to 32.
MIN_BID, MAX_BID = 0.001, 32.0


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call may spend waiting between tries, in total."""

    budget_s: float
    backoff_s: float = 1.0
    factor: float = 2.0
    max_backoff_s: float = 30.0

    def backoff(self, attempt: int, jitter: float) -> float:
        """The wait after `attempt` without a Retry-After: exponential, jittered to 50-100 %
        so that several clients do not retry in step."""
        step = min(self.backoff_s * self.factor ** (attempt - 1), self.max_backoff_s)
        return step * (0.5 + jitter / 2)


# A person is waiting: give up early with a clear message. Vast's documented minimum spacing is
# up to 4.5 s (create), so one Retry-After of that size still fits.
INTERACTIVE = RetryPolicy(budget_s=10.0)
# The automation loop: wait out a long rate-limit window rather than skip a reconcile.
BACKGROUND = RetryPolicy(budget_s=180.0)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


@dataclass
class _Reply:
    status: int | None = None
    payload: object = None
    text: str = ""
    retry_after: float | None = None
    problem: str = ""  # why there is no usable response, or why the body is unreadable

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.problem

    def describe(self) -> str:
        if isinstance(self.payload, dict):
            detail = (self.payload.get("msg") or self.payload.get("detail") or
                      self.payload.get("error"))
            if detail:
                return str(detail)[:300]
        return (self.problem or self.text or "no details")[:300]


@dataclass(frozen=True)
class OfferFilter:
    gpu_name: str = ""
    num_gpus: int | None = None
    min_cpu_ram_gb: float | None = None
    max_dph: float | None = None
    min_reliability: float | None = None
    geolocation: str = ""
    min_gpu_ram_gb: float | None = None
    min_disk_gb: float | None = None
    min_inet_down_mbps: float | None = None
    min_cuda: float | None = None
    min_cpu_cores: int | None = None
    offer_id: int | None = None
    disk_gb: float = DEFAULT_DISK_GB
    limit: int = 50
    order: tuple = (("dph_total", "asc"),)
    # (column, operator, value) in Vast's own terms, e.g. from vast-manager's filter string;
    # they come last, so they override the defaults above.
    conditions: tuple[tuple[str, str, Any], ...] = ()
    offer_type: str = ON_DEMAND

    def __post_init__(self) -> None:
        if self.offer_type not in OFFER_TYPES:
            raise ValueError(f"unknown offer type {self.offer_type!r}: one of {OFFER_TYPES}")

    def query(self) -> dict[str, Any]:
        """The search body, as the official client builds it (units, names, defaults)."""
        q: dict[str, dict[str, Any]] = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
             "rented": {"eq": False}}
        if self.offer_id is not None:
            q["id"] = {"eq": int(self.offer_id)}
        if self.gpu_name:
            # The CLI writes spaces as underscores (RTX_4090) and turns them back before sending.
            q["gpu_name"] = {"eq": self.gpu_name.replace("_", " ").strip()}
        if self.num_gpus:
            q["num_gpus"] = {"eq": self.num_gpus}
        if self.min_cpu_ram_gb is not None:
            q["cpu_ram"] = {"gte": self.min_cpu_ram_gb * 1000}  # MB, ×1000 like the CLI
        if self.max_dph is not None:
            q["dph_total"] = {"lte": self.max_dph}
        if self.min_reliability is not None:
            q["reliability"] = {"gte": self.min_reliability}
        if self.geolocation:
            q["geolocation"] = {"eq": self.geolocation.upper()}
        # vast-manager's default filter: disk_space, gpu_ram, cpu_cores, inet_down, cuda_vers.
        if self.min_gpu_ram_gb is not None:
            q["gpu_ram"] = {"gte": self.min_gpu_ram_gb * 1000}  # MB, ×1000 like the CLI
        if self.min_disk_gb is not None:
            q["disk_space"] = {"gte": self.min_disk_gb}
        if self.min_inet_down_mbps is not None:
            q["inet_down"] = {"gte": self.min_inet_down_mbps}
        if self.min_cuda is not None:
            q["cuda_max_good"] = {"gte": self.min_cuda}
        if self.min_cpu_cores is not None:
            q["cpu_cores_effective"] = {"gte": self.min_cpu_cores}
        for column, operator, value in self.conditions:
            q.setdefault(column, {})[operator] = value
        return {**q, "order": [list(o) for o in self.order], "type": self.offer_type,
                "limit": self.limit, "allocated_storage": self.disk_gb}


@dataclass(frozen=True)
class VastCall:
    """One API call as the client made it: its answer's status (None: none came) and tries."""

    method: str
    path: str
    status: int | None
    attempts: int
    waited_s: float


@dataclass
class VastClient:
    api_key: str = field(repr=False)
    base_url: str
    retry: RetryPolicy = INTERACTIVE
    timeout_s: float = 120
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    jitter: Callable[[], float] = field(default=random.random, repr=False)
    wallclock: Callable[[], float] = field(default=time.time, repr=False)
    # Where each call is written down: None, the Event log. The simulated day counts its calls
    # here instead of filling the operator's log with a day that never happened.
    journal: Callable[[VastCall], None] | None = field(default=None, repr=False)

    def __post_init__(self):
        if not self.api_key:
            raise VastAuthError("no Vast API key is set; enter it on the Offers page")
        self.base_url = self.base_url.rstrip("/")

    def __repr__(self) -> str:
        return f"<VastClient {self.base_url}>"

    @classmethod
    def from_settings(cls, *, background: bool = False, **options) -> "VastClient":
        """Sync (reads the database): the stored API key and the configured base URL."""
        return cls(Secret.reveal(Secret.VAST_API_KEY), RemoteSettings.load().vast_url,
                   retry=BACKGROUND if background else INTERACTIVE, **options)

    async def call(self, method: str, path: str, *, body=None, params=None, machine=None,
                   idempotent: bool = True):
        """One API call with retries; returns the JSON payload or raises a VastError."""
        query = {k: json.dumps(v) if isinstance(v, dict | list) else str(v)
                 for k, v in (params or {}).items()}
        waited, attempt, next_wait = 0.0, 0, 0.0
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            # aiohttp resends a PUT once by itself when the connection drops before the answer
            # (PUT is idempotent in HTTP; Vast's create is not). aiohttp's own test client turns
            # that off the same way; test_vast's dropped-create test proves it still holds.
            http._retry_connection = idempotent
            while True:
                attempt += 1
                reply = await self._send(http, method, path, body, query)
                retryable = reply.status is None or reply.status in RETRY_STATUSES
                # 429 is refused before any work; anything else may have created the instance.
                if not retryable or (not idempotent and reply.status != 429):
                    break
                next_wait = reply.retry_after if reply.retry_after is not None else \
                    self.retry.backoff(attempt, self.jitter())
                if waited + next_wait > self.retry.budget_s:
                    break
                await self.sleep(next_wait)
                waited += next_wait
        if self.journal is None:
            await sync_to_async(self._record)(method, path, reply, attempt, waited, machine)
        else:
            self.journal(VastCall(method, path, reply.status, attempt, waited))
        if reply.ok:
            return reply.payload
        raise self._error(method, path, reply, attempt, next_wait, idempotent)

    async def _send(self, http, method, path, body, query) -> _Reply:
        try:
            async with http.request(method, self.base_url + path, json=body, params=query,
                                    headers=self._headers()) as response:
                raw = await response.read()
                status = response.status
                reply = _Reply(status=status, retry_after=parse_retry_after(
                    response.headers.get("Retry-After"), self.wallclock()))
        except (aiohttp.ClientError, TimeoutError) as exc:
            # A dropped connection, a timeout, a truncated body, a malformed HTTP answer.
            return _Reply(problem=f"no usable response ({type(exc).__name__})")
        if raw:
            try:
                reply.payload = json.loads(raw)
            except ValueError:
                reply.text = raw[:300].decode(errors="replace").strip()
                if 200 <= status < 300:
                    reply.problem = f"the response is not JSON: {reply.text[:100]!r}"
        return reply

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}

    def _record(self, method, path, reply: _Reply, attempts, waited, machine) -> None:
        """Every call into the provider log; a failed one is also an error Event."""
        ProviderCall.record(machine=machine, method=method, path=path[:300],
                            status=reply.status, ok=reply.ok, attempts=attempts,
                            waited_s=round(waited, 3),
                            problem="" if reply.ok else reply.describe())
        if reply.ok:
            return
        message = f"vast {method} {path} → {reply.status or 'no response'}"
        if attempts > 1:
            message += f" after {attempts} attempts ({waited:.1f} s waited)"
        Event.record("vast", f"{message}: {reply.describe()}", machine=machine,
                     level=Event.Level.ERROR,
                     data={"method": method, "path": path, "status": reply.status,
                           "attempts": attempts, "waited_s": round(waited, 3)})

    def _error(self, method, path, reply: _Reply, attempts, next_wait, idempotent) -> VastError:
        code = reply.payload.get("error", "") if isinstance(reply.payload, dict) else ""
        status = reply.status
        text = (f"Vast {method} {path} failed ({status or 'no response'}, {attempts} "
                f"attempt{'s' if attempts > 1 else ''}): {reply.describe()}")
        if status in (401, 403) or code == "auth_error":
            return VastAuthError(text + " — the API key was rejected; enter a valid key",
                                 status=status, code=code)
        if status == 429:
            retry_in = max(1, math.ceil(next_wait))
            return VastRateLimited(f"Vast is rate limiting us, retry in {retry_in} s ({text})",
                                   retry_in_s=retry_in, status=status, code=code)
        if not idempotent and (status is None or status >= 500):
            return VastOutcomeUnknown(text, status=status, code=code)
        return VastError(text, status=status, code=code)

    async def search_offers(self, offer_filter: OfferFilter) -> list[dict]:
        payload = await self.call("POST", "/api/v0/bundles/", body=offer_filter.query())
        offers = payload.get("offers") if isinstance(payload, dict) else None
        if not isinstance(offers, list) or not all(isinstance(o, dict) for o in offers):
            raise VastError("Vast's search answer holds no list of offers")
        return offers

    async def offer(self, offer_id: int, *, disk_gb: float = DEFAULT_DISK_GB,
                    offer_type: str = ON_DEMAND) -> dict | None:
        """One offer by id (any rank in the market), priced with `disk_gb` of storage as
        `offer_type` (a bid search gives its minimum bid)."""
        found = await self.search_offers(OfferFilter(offer_id=offer_id, disk_gb=disk_gb,
                                                     limit=1, offer_type=offer_type))
        return next((o for o in found if o.get("id") == offer_id), None)

    async def create_instance(self, offer_id: int, *, image: str, disk_gb: float, label: str,
                              onstart: str = DEFAULT_ONSTART, env: dict | None = None,
                              bid_price: float | None = None, machine=None) -> int:
        """Accept an offer; with `bid_price` ($/h) the instance is interruptible. An
        interruptible instance whose bid is below the machine's minimum is created stopped."""
        body = {"client_id": "me", "image": image, "disk": disk_gb, "label": label,
                "onstart": onstart, "runtype": "ssh_direc ssh_proxy", "env": env or {}}
        if bid_price is not None:
            body["price"] = round(_checked_bid(bid_price), 4)
        payload = await self.call("PUT", f"/api/v0/asks/{int(offer_id)}/", body=body,
                                  machine=machine, idempotent=False)
        if not isinstance(payload, dict) or not payload.get("success") or \
                not isinstance(payload.get("new_contract"), int):
            raise VastOutcomeUnknown(
                f"Vast's create answer names no instance: {_Reply(payload=payload).describe()}")
        return payload["new_contract"]

    async def change_bid(self, instance_id: int, price: float, *, machine=None) -> None:
        """An interruptible instance's new bid ($/h); above the machine's minimum, an
        outbid instance runs again."""
        await self.call("PUT", f"/api/v0/instances/bid_price/{int(instance_id)}/",
                        body={"client_id": "me", "price": round(_checked_bid(price), 4)},
                        machine=machine)

    async def account_ssh_keys(self) -> list[dict]:
        """The account's SSH keys ({id, key, ...}); Vast adds them to every new instance."""
        payload = await self.call("GET", "/api/v0/ssh/")
        if not isinstance(payload, list) or not all(
                isinstance(k, dict) and isinstance(k.get("id"), int) for k in payload):
            raise VastError("Vast's SSH key list holds no list of keys with ids")
        return payload

    async def add_account_ssh_key(self, public_key: str) -> int:
        """Register a public key on the account (before creating instances); its key id."""
        payload = await self.call("POST", "/api/v0/ssh/", body={"ssh_key": public_key})
        key = payload.get("key") if isinstance(payload, dict) else None
        if not isinstance(key, dict) or not isinstance(key.get("id"), int):
            raise VastError("Vast's answer to an SSH key create names no key id")
        return key["id"]

    async def delete_account_ssh_key(self, key_id: int) -> None:
        await self.call("DELETE", f"/api/v0/ssh/{int(key_id)}/")

    async def attach_ssh_key(self, instance_id: int, public_key: str, *, machine=None) -> None:
        await self.call("POST", f"/api/v0/instances/{int(instance_id)}/ssh/",
                        body={"ssh_key": public_key}, machine=machine)

    async def instance(self, instance_id: int, *, machine=None) -> dict | None:
        payload = await self.call("GET", f"/api/v0/instances/{int(instance_id)}/",
                                  params={"owner": "me"}, machine=machine)
        row = payload.get("instances") if isinstance(payload, dict) else None
        return row if isinstance(row, dict) else None

    async def list_instances(self, select_filters: dict | None = None, *,
                             machine=None) -> list[dict]:
        """All instances, following the v1 keyset pagination (v0's list is deprecated)."""
        rows, token = [], None
        while True:
            params = {"limit": PAGE_LIMIT, "order_by": [{"col": "id", "dir": "asc"}]}
            if select_filters:
                params["select_filters"] = select_filters
            if token:
                params["after_token"] = token
            payload = await self.call("GET", "/api/v1/instances/", params=params,
                                      machine=machine)
            page = payload.get("instances") if isinstance(payload, dict) else None
            if not isinstance(page, list) or not all(
                    isinstance(i, dict) and isinstance(i.get("id"), int) for i in page):
                raise VastError("Vast's instance list holds no list of instances with ids")
            rows.extend(page)
            token = payload.get("next_token")
            if not token:
                return rows

    async def charges(self, since: float, until: float) -> dict[int, tuple[float, dict]]:
        """What Vast billed per instance between two times (`GET /api/v0/charges/`, as the
        official `vastai show invoices-v1 --charges` reads it): instance id → (dollars,
        {item type: dollars}) with the items Vast reports (gpu, disk, bwd, bwu)."""
        found: dict[int, tuple[float, dict]] = {}
        token = None
        while True:
            params: dict[str, Any] = {
                "select_filters": {"day": {"gte": int(since), "lte": math.ceil(until)},
                                   "type": {"in": ["instance"]}},
                "limit": CHARGES_PAGE_LIMIT, "latest_first": "false", "format": "table"}
            if token:
                params["after_token"] = token
            payload = await self.call("GET", "/api/v0/charges/", params=params)
            rows = payload.get("results") if isinstance(payload, dict) else None
            if not isinstance(rows, list):
                raise VastError("Vast's charges hold no list of results")
            for row in rows:
                source = row.get("source") if isinstance(row, dict) else None
                if row.get("type") != "instance" or not isinstance(source, str) or \
                        not source.startswith("instance-") or \
                        not source.removeprefix("instance-").isdigit():
                    continue
                items: dict[str, float] = {}
                for item in row.get("items") or []:
                    if isinstance(item, dict) and isinstance(item.get("amount"), int | float):
                        kind = str(item.get("type"))
                        items[kind] = items.get(kind, 0.0) + float(item["amount"])
                amount = row.get("amount")
                if isinstance(amount, int | float) and not isinstance(amount, bool):
                    found[int(source.removeprefix("instance-"))] = (float(amount), items)
            token = payload.get("next_token")
            if not token:
                return found

    async def instances_labelled(self, label: str, *, machine=None) -> list[dict]:
        return [i for i in await self.list_instances({"label": {"eq": label}}, machine=machine)
                if i.get("label") == label]

    async def destroy_instance(self, instance_id: int, *, machine=None) -> None:
        await self.call("DELETE", f"/api/v0/instances/{int(instance_id)}/", body={},
                        machine=machine)


def _checked_bid(price: float) -> float:
    if not MIN_BID <= price <= MAX_BID:
        raise VastError(f"a bid must be between ${MIN_BID} and ${MAX_BID:g}/h, not ${price}/h")
    return price


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
    bad = {b.provider_machine_id: b for b in BadMachine.objects.filter(
        provider=Machine.Provider.VAST)}
    annotated = []
    for offer in offers:
        rate, source = estimate_rate(offer.get("machine_id"), offer.get("gpu_name", ""),
                                     offer.get("num_gpus") or 0)
        dph = offer.get("dph_total")
        bad_host = bad.get(offer["machine_id"]) if offer.get("machine_id") is not None else None
        # Only this very machine's own benchmark counts as known (not similar hosts).
        known = rate if source == THIS_MACHINE else None
        annotated.append({
            **offer,
            "bad_host": bad_host is not None,
            "bad": bad_host,
            "known_perf": known,
            "known_perf_grade": known_perf_grade(known) if known is not None else "",
            "gpu_ram_gb": _thousandth(offer.get("gpu_ram")),
            "cpu_ram_gb": _thousandth(offer.get("cpu_ram")),
            "proofs_per_hour": rate,
            "rate_source": source,
            "price_per_proof": (dph / rate) if rate and dph is not None else None,
        })
    return annotated


def _thousandth(megabytes) -> float | None:
    """Vast's MB as GB (the CLI's factor of 1000); None when absent or not a number."""
    if isinstance(megabytes, bool) or not isinstance(megabytes, int | float):
        return None
    return megabytes / 1000


THIS_MACHINE = "this machine"
# vast-manager's known-performance grades (proofs/h): at least GOOD is good, at least OK is ok.
KNOWN_PERF_GOOD, KNOWN_PERF_OK = 40, 25


def known_perf_grade(rate: float) -> str:
    return "good" if rate >= KNOWN_PERF_GOOD else "ok" if rate >= KNOWN_PERF_OK else "low"


def estimate_rate(machine_id, gpu_name: str, gpu_count: int) -> tuple[float | None, str]:
    """Proofs per hour: this machine's best benchmark, else the mean for the same GPU set."""
    exact = MachinePerf.objects.filter(provider_machine_id=machine_id, gpu_name=gpu_name,
                                    gpu_count=gpu_count).first()
    if exact:
        return exact.proofs_per_hour, THIS_MACHINE
    similar = list(MachinePerf.objects.filter(gpu_name=gpu_name, gpu_count=gpu_count)
                   .values_list("proofs_per_hour", flat=True))
    if similar:
        return sum(similar) / len(similar), f"{len(similar)} similar hosts"
    return None, ""


# ------------------------------------------------------------------ rent, reconcile, destroy

# vast-manager handed its image the benchmark's minimum (proofs/h) in this variable; the
# image registers with it, and its call home's bench-done is judged against it.
MIN_RATE_ENV = "MIN_RATE"
# Where Curio's cuzk daemon serves GET /status in its image (cuzk's example status_listen).
UPSTREAM_STATUS_PORT = 9821


@dataclass(frozen=True)
class Deployment:
    """What a rented instance runs: our engine (a CUDA base image, provisioned over SSH
    afterwards), or an upstream cuzk image that sets itself up and calls home."""

    flavour: str = Machine.Flavour.CUZK_ENGINE
    image: str = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    env: dict[str, str] = field(default_factory=dict)
    onstart: str = DEFAULT_ONSTART

    @classmethod
    def upstream_defaults(cls, settings: RemoteSettings) -> "Deployment":
        """An upstream cuzk worker as the settings describe it (vast-manager's deploy)."""
        return cls(flavour=Machine.Flavour.CUZK_UPSTREAM, image=settings.upstream_image,
                   env=parse_env(settings.upstream_env), onstart=settings.upstream_onstart)

    @property
    def upstream(self) -> bool:
        return self.flavour == Machine.Flavour.CUZK_UPSTREAM

    def instance_env(self, callhome_secret: str, min_rate: int | None) -> dict[str, str]:
        """The instance's environment: the operator's, the call-home secret, and for an
        upstream image the minimum rate as vast-manager sent it (`30.0`)."""
        env = {**self.env, SECRET_ENV: callhome_secret}
        if self.upstream and min_rate is not None:
            env[MIN_RATE_ENV] = f"{min_rate:.1f}"
        return env


@dataclass(frozen=True)
class RentRequest:
    offer_id: int
    machine_id: int | None
    host_id: int | None
    gpu_name: str
    gpu_count: int
    dph_total: float | None
    disk_gb: int = DEFAULT_DISK_GB
    min_bench_rate: int | None = None  # None: the configured minimum
    deployment: Deployment = Deployment()
    bid_price: float | None = None  # $/h: an interruptible rental at this bid

    @classmethod
    def from_offer(cls, offer: dict, **overrides) -> "RentRequest":
        return cls(offer_id=int(offer["id"]), machine_id=offer.get("machine_id"),
                   host_id=offer.get("host_id"), gpu_name=offer.get("gpu_name", ""),
                   gpu_count=int(offer.get("num_gpus") or 0), dph_total=offer.get("dph_total"),
                   **overrides)


def bid_refusal(bid: float, on_demand: dict, as_bid: dict | None) -> str:
    """Why `bid` ($/h for the GPUs) is not placed on an offer ("" when it is), from the same
    offer searched on demand and as a bid: at least the machine's minimum bid now (below it
    Vast creates the instance stopped, billing its disk for nothing), and below the machine's
    own on-demand price, the cap (interruptible capacity at that price is only worse)."""
    minimum = as_bid.get("min_bid") if as_bid else None
    price = on_demand.get("dph_base")
    if not isinstance(minimum, int | float) or not isinstance(price, int | float):
        return "Vast gives no minimum bid or no on-demand price for it: not rented"
    if bid < minimum:
        return (f"the bid ${bid:.4f}/h is below the machine's minimum bid ${minimum:.4f}/h now "
                "(Vast would create it stopped)")
    if bid >= price:
        return (f"the bid ${bid:.4f}/h is not below the machine's on-demand price "
                f"${price:.4f}/h: rent it on demand")
    return ""


def priced_at_bid(offer: dict, bid: float) -> dict:
    """The on-demand `offer` as an interruptible rental at `bid` bills it: its disk and
    the bid (Vast's dph_total is the GPUs' dph_base plus the disk)."""
    return {**offer, "dph_base": bid, "dph_total": offer["dph_total"] - offer["dph_base"] + bid}


async def rent(client: VastClient, request: RentRequest) -> Machine:
    """Create an instance for a Machine row made first, with a label and an SSH key of its own.

    The machine and its label exist before the create call, so an instance whose create
    response was lost is found by its label (here, or by the next reconcile) and never bills
    unseen.
    """
    if request.machine_id is not None and await BadMachine.objects.filter(
            provider=Machine.Provider.VAST, provider_machine_id=request.machine_id).aexists():
        raise VastError(f"Vast machine {request.machine_id} is on the bad-machines list")
    key = asyncssh.generate_private_key("ssh-ed25519")
    machine, label = await sync_to_async(_register_renting)(request, key)
    # The instance presents this secret when it calls home (vastmgr.instances).
    callhome = await sync_to_async(DeploySecret.issue)(machine=machine, note=label)
    deployment = request.deployment
    try:
        instance_id = await client.create_instance(
            request.offer_id, image=deployment.image, disk_gb=request.disk_gb, label=label,
            onstart=deployment.onstart or DEFAULT_ONSTART,
            env=deployment.instance_env(callhome, request.min_bench_rate),
            bid_price=request.bid_price, machine=machine)
    except VastOutcomeUnknown as exc:
        instance_id = await _find_created(client, machine, label, exc)
    except VastError as exc:
        await sync_to_async(_give_up)(machine.pk, f"rent failed: {exc}")
        raise
    machine = await sync_to_async(_attach_instance)(machine.pk, instance_id, request)
    await client.attach_ssh_key(instance_id, key.export_public_key().decode().strip(),
                                machine=machine)
    instance = await client.instance(instance_id, machine=machine)
    if instance:
        await sync_to_async(_apply_instance)(machine, instance)
    return machine


def _register_renting(request: RentRequest, key: asyncssh.SSHKey) -> tuple[Machine, str]:
    label = f"{LABEL_PREFIX}{uuid.uuid4()}"
    with transaction.atomic():
        machine = Machine.objects.create(
            name=f"vast-{label[len(LABEL_PREFIX):][:13]}", provider=Machine.Provider.VAST,
            vast_machine_id=request.machine_id, vast_host_id=request.host_id,
            gpu_name=request.gpu_name, gpu_count=request.gpu_count,
            price_per_hour=_price(request.dph_total),
            engine_flavour=request.deployment.flavour,
            **({"engine_port": UPSTREAM_STATUS_PORT} if request.deployment.upstream else {}),
        )
        remote = RemoteMachine.objects.create(
            machine=machine, vast_label=label, min_bench_rate=request.min_bench_rate,
            bid_price=None if request.bid_price is None else _price(request.bid_price))
        Secret.store(remote.ssh_key_secret_name, key.export_private_key().decode())
        what = f" (image {request.deployment.image})" if request.deployment.upstream else ""
        if request.bid_price is not None:
            what += f", interruptible at a bid of ${request.bid_price:.4f}/h"
        Event.record("vast", f"renting offer {request.offer_id} as {label}{what}",
                     machine=machine, data={"offer_id": request.offer_id, "label": label,
                                            "flavour": request.deployment.flavour})
    return machine, label


async def _find_created(client: VastClient, machine: Machine, label: str,
                        exc: VastOutcomeUnknown) -> int:
    """After a create without a usable answer: adopt the instance carrying our label, if any."""
    try:
        found = await client.instances_labelled(label, machine=machine)
    except VastError as lookup:
        await sync_to_async(Event.record)(
            "vast", f"{machine.name}: the create's outcome is unknown ({exc}) and the lookup by "
                    f"label failed ({lookup}); the next reconcile adopts or gives it up",
            machine=machine, level=Event.Level.WARNING, data={"label": label})
        raise VastError(f"{exc} — whether an instance was created is not known yet; the next "
                        f"reconcile adopts it (label {label}) or gives the machine up") from exc
    if not found:
        await sync_to_async(_give_up)(machine.pk, f"rent failed: {exc}")
        raise exc
    instance_id = int(found[0]["id"])
    await sync_to_async(Event.record)(
        "vast", f"{machine.name}: the create's answer was lost ({exc}); instance "
                f"{instance_id} carries our label {label}: adopted",
        machine=machine, level=Event.Level.WARNING,
        data={"instance_id": instance_id, "label": label})
    return instance_id


def _give_up(machine_id: int, reason: str) -> None:
    machine = Machine.objects.get(pk=machine_id)
    if machine.state != Machine.State.KILLED:
        machine.kill(reason)


def _attach_instance(machine_id: int, instance_id: int, request: RentRequest | None) -> Machine:
    """Bind an instance to its machine (idempotent: rent and reconcile may both do it)."""
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        if machine.vast_instance_id == instance_id:
            return machine
        machine.vast_instance_id = instance_id
        fields = ["vast_instance_id", "updated"]
        name = f"vast-{instance_id}"
        if not Machine.objects.filter(name=name).exists():
            machine.name = name
            fields.append("name")
        machine.save(update_fields=fields)
        RemoteMachine.objects.filter(machine=machine, billing_started__isnull=True).update(
            billing_started=timezone.now())
        offer = f"offer {request.offer_id}" if request else "a lost create"
        Event.record("vast", f"rented {offer} as instance {instance_id}", machine=machine,
                     data={"offer_id": request.offer_id if request else None,
                           "instance_id": instance_id})
    return machine


def _price(dph) -> Decimal | None:
    return Decimal(str(dph)).quantize(Decimal("0.0001")) if dph is not None else None


# What the fleet table shows of an instance record (Vast's names and units: gpu_util in %,
# gpu_temp in °C, cpu_ram and gpu_ram in MB, mem_usage and mem_limit in GB, start_date in s).
VAST_FACTS = ("gpu_name", "num_gpus", "gpu_ram", "gpu_util", "gpu_temp", "cpu_ram",
              "mem_usage", "mem_limit", "start_date", "cuda_max_good", "inet_down", "inet_up",
              "disk_space", "reliability2", "geolocation", "min_bid")


def _apply_facts(machine: Machine, instance: dict, listed_at: datetime) -> None:
    """Keep the instance's hardware facts as listed; a value Vast did not send stays absent."""
    facts = {key: instance[key] for key in VAST_FACTS if instance.get(key) is not None}
    RemoteMachine.objects.filter(machine=machine).update(vast_facts=facts, vast_seen_at=listed_at)


def _apply_instance(machine: Machine, instance: dict) -> None:
    """Copy the provider's view (SSH endpoint once running, price) onto the Machine, and
    bill what the provider bills now (a price change at extension, a stop or a start, made
    here or on Vast's side)."""
    changed = []
    endpoint = ssh_endpoint(instance) if instance.get("actual_status") == "running" else None
    if endpoint and (machine.host, machine.ssh_port) != endpoint:
        machine.host, machine.ssh_port = endpoint
        changed += ["host", "ssh_port"]
    price = _price(instance.get("dph_total"))
    if price is not None and machine.price_per_hour != price:
        machine.price_per_hour = price
        changed.append("price_per_hour")
    if changed:
        machine.save(update_fields=[*changed, "updated"])
    _bill_as_listed(machine, instance)


def _bill_as_listed(machine: Machine, instance: dict) -> None:
    """Bill as Vast does: the disk from creation (storage_cost $/GB/month × disk_space GB),
    the whole $/h (dph_total: GPUs and disk) only while the instance holds its GPUs."""
    status = instance.get("actual_status") or ""
    if status in GPU_BILLING_STATUSES:
        if machine.price_per_hour is None:
            return
        current = (BillingInterval.objects.filter(machine=machine, ended_at__isnull=True)
                   .values_list("kind", "cause").first())
        cause = ("price change" if current and current[0] == BillingInterval.Kind.RUNNING
                 else "start" if current and current[1] == "stop" else "running")
        ledger.bill(machine, BillingInterval.Kind.RUNNING, machine.price_per_hour,
                    gpus=int(instance.get("num_gpus") or machine.gpu_count), cause=cause)
        return
    storage, disk = instance.get("storage_cost"), instance.get("disk_space")
    rate = storage * disk / HOURS_PER_MONTH if isinstance(storage, int | float) and \
        isinstance(disk, int | float) else 0.0
    ledger.bill(machine, BillingInterval.Kind.STORED, rate,
                cause="stop" if status == "stopped" else status or "created")


def _apply_status(machine: Machine, instance: dict, now: datetime) -> list[alerts.Alert]:
    """Record `actual_status`; an instance that went down marks its machine and alerts once."""
    remote = RemoteMachine.for_machine(machine)
    status = "outbid" if is_outbid(instance) else instance.get("actual_status") or ""
    down = status not in ("running", "outbid") and status not in STARTING_STATUSES
    found = []
    if status != remote.vast_status:
        # Polling saw it first (a webhook that told us already left the status as it is).
        remote.vast_status_signal = RemoteMachine.SIGNAL_POLLING
        remote.vast_status_at = now
        if status == "outbid":
            message = (f"{machine.name}: outbid — Vast stopped interruptible instance "
                       f"{machine.vast_instance_id} for a higher bid"
                       f"{': ' + instance['status_msg'] if instance.get('status_msg') else ''}")
            # One Event: the alert's own, which the notifier carries (see _record_unmanaged).
            found.append(alerts.Alert("instance_outbid", message, machine.pk, {
                "actual_status": instance.get("actual_status"),
                "min_bid": instance.get("min_bid"), "signal": RemoteMachine.SIGNAL_POLLING}))
            requeue_outbid(machine, RemoteMachine.SIGNAL_POLLING)
    if down and remote.vast_down_since is None:
        detail = f": {instance['status_msg']}" if instance.get("status_msg") else ""
        remote.vast_down_since = now
        remote.last_error = f"Vast instance {machine.vast_instance_id} is {status}{detail}"
        found.append(alerts.Alert("instance_down", f"{machine.name}: {remote.last_error}",
                                  machine.pk, {"actual_status": status}))
    elif not down and remote.vast_down_since is not None:
        remote.vast_down_since = None
        remote.last_error = ""
        Event.record("vast", f"{machine.name}: Vast instance {machine.vast_instance_id} is "
                             f"{status or 'starting'} again", machine=machine)
    remote.vast_status = status
    remote.save(update_fields=["vast_status", "vast_down_since", "last_error",
                               "vast_status_signal", "vast_status_at"])
    return found


def requeue_outbid(machine: Machine, signal: str) -> int:
    """An outbid machine's jobs in flight go back to the queue at once, not after the offline
    grace: its engine is stopped, and another machine can prove them (the engine's request-id
    idempotency makes a late result from this one harmless). How many went back."""
    reason = f"outbid on Vast (told by {signal})"
    return sum(1 for job_id in ProofJob.objects.in_flight().filter(machine=machine)
               .values_list("pk", flat=True)
               if jobs.requeue(job_id, machine.pk, reason) is not None)


def is_outbid(instance: dict) -> bool:
    """An interruptible instance Vast stopped for a higher bid: stopped, though its renter
    still wants it running (a stop we asked for has intended_status "stopped")."""
    return bool(instance.get("is_bid")) and instance.get("actual_status") == "stopped" and \
        instance.get("intended_status", "running") == "running"


@dataclass
class ReconcilePlan:
    summary: dict
    orphans: dict = field(default_factory=dict)  # instance id → label, to destroy
    alerts: list = field(default_factory=list)


async def reconcile(client: VastClient, *, webhook_url: str = "") -> dict:
    """Match provider instances with Machine rows, read every instance's `actual_status`,
    adopt instances carrying a machine's label, destroy our orphans, and list (and alert on)
    instances no machine manages."""
    listed_at = timezone.now()
    instances = await client.list_instances()
    plan = await sync_to_async(_reconcile_rows)(instances, listed_at)
    for instance_id, label in plan.orphans.items():
        try:
            await client.destroy_instance(instance_id)
        except VastError as exc:
            # It stays on the fleet page's list (its alert fired when it was first seen);
            # the next reconcile tries again.
            await sync_to_async(_orphan_survived)(instance_id, exc)
            continue
        await sync_to_async(_orphan_destroyed)(instance_id, label)
        plan.summary["destroyed"].append(instance_id)
    for alert in plan.alerts:
        await alerts.send(alert, webhook_url)
    return plan.summary


@transaction.atomic
def _reconcile_rows(instances: list[dict], now: datetime) -> ReconcilePlan:
    """`now` is when the list was taken: a machine bound to an instance after that is not
    judged on this list. One transaction: a reader that sees this listing's time sees
    everything it changed (the billing intervals above all), never half of it."""
    plan = ReconcilePlan({"updated": 0, "killed": 0, "adopted": [], "destroyed": [],
                          "unmanaged": []})
    VastSync.mark(now)
    by_id = {int(i["id"]): i for i in instances}
    by_label = {i["label"]: i for i in instances if i.get("label")}
    claimed = set()
    for machine in Machine.objects.filter(provider=Machine.Provider.VAST).exclude(
            state=Machine.State.KILLED).select_related("remote"):
        instance = _claim(machine, by_id, by_label, now, plan)
        if instance is None:
            continue
        claimed.add(int(instance["id"]))
        plan.alerts += _apply_status(machine, instance, now)
        _apply_instance(machine, instance)
        _apply_facts(machine, instance, now)
        plan.summary["updated"] += 1
    killed_ids = set(Machine.objects.filter(provider=Machine.Provider.VAST,
                                            state=Machine.State.KILLED,
                                            vast_instance_id__isnull=False)
                     .values_list("vast_instance_id", flat=True))
    unmanaged = {}
    for instance_id, instance in by_id.items():
        if instance_id in claimed:
            continue
        label = instance.get("label") or ""
        if label.startswith(LABEL_PREFIX) or instance_id in killed_ids:
            plan.orphans[instance_id] = label
            unmanaged[instance_id] = (instance, "ours, but no machine wants it: destroying")
        else:
            unmanaged[instance_id] = (instance, "not created by vastmgr")
            plan.summary["unmanaged"].append(instance_id)
    plan.alerts += _record_unmanaged(unmanaged, now)
    return plan


def _claim(machine: Machine, by_id: dict, by_label: dict, now: datetime,
           plan: ReconcilePlan) -> dict | None:
    """The instance of a live machine: by id, else by the label chosen before its create."""
    if machine.vast_instance_id is not None:
        instance = by_id.get(machine.vast_instance_id)
        remote = getattr(machine, "remote", None)
        bound_since_listing = remote and remote.billing_started and remote.billing_started >= now
        if instance is None and not bound_since_listing:
            end_billing(machine)
            # Not routine: destroyed outside vastmgr, or lost by Vast; the operator should know.
            Event.record("vast", f"{machine.name}: instance {machine.vast_instance_id} is no "
                                 "longer listed by Vast (destroyed elsewhere, or lost): the "
                                 "machine is marked killed", machine=machine,
                         level=Event.Level.WARNING,
                         data={"instance_id": machine.vast_instance_id})
            machine.kill("the instance disappeared from Vast")
            plan.summary["killed"] += 1
        return instance
    label = getattr(getattr(machine, "remote", None), "vast_label", "")
    if not label:
        return None  # an instance-less machine that was never rented by label
    instance = by_label.get(label)
    if instance is not None:
        _attach_instance(machine.pk, int(instance["id"]), None)
        machine.refresh_from_db()
        Event.record("vast", f"{machine.name}: instance {instance['id']} carries our label "
                             f"{label}: adopted", machine=machine, level=Event.Level.WARNING,
                     data={"instance_id": instance["id"], "label": label})
        plan.summary["adopted"].append(int(instance["id"]))
    elif now - machine.created > RENT_LOOKUP_GRACE:
        machine.kill(f"no Vast instance carries its label {label}: the rent created none")
        plan.summary["killed"] += 1
    return instance


def _record_unmanaged(unmanaged: dict[int, tuple[dict, str]], now: datetime
                      ) -> list[alerts.Alert]:
    """Keep the fleet page's list of billing instances without a machine; alert on new ones."""
    UnmanagedInstance.objects.exclude(instance_id__in=list(unmanaged)).delete()
    found = []
    for instance_id, (instance, reason) in unmanaged.items():
        row, created = UnmanagedInstance.objects.update_or_create(
            instance_id=instance_id, defaults={
                "label": (instance.get("label") or "")[:300],
                "actual_status": instance.get("actual_status") or "",
                "dph_total": instance.get("dph_total"), "reason": reason, "seen_at": now})
        if created:
            price = f", ${row.dph_total:.4f}/h" if row.dph_total is not None else ""
            message = (f"Vast instance {instance_id} (label {row.label or 'none'!r}{price}) is "
                       f"billing and no machine manages it: {reason}")
            # One Event: the alert's own (kind `alert`), which the notifier and the webhook
            # carry; a `vast` Event beside it told the Events page and on-call the same twice.
            found.append(alerts.Alert("unmanaged_instance", message, None,
                                      {"instance_id": instance_id, "label": row.label}))
    return found


def _orphan_destroyed(instance_id: int, label: str) -> None:
    UnmanagedInstance.objects.filter(instance_id=instance_id).delete()
    Event.record("vast", f"destroyed instance {instance_id} ({label or 'no label'}): it was ours "
                         "but no machine wants it", level=Event.Level.WARNING,
                 data={"instance_id": instance_id, "label": label})


def _orphan_survived(instance_id: int, exc: VastError) -> None:
    UnmanagedInstance.objects.filter(instance_id=instance_id).update(
        reason=f"ours, but no machine wants it, and destroying it failed: {exc}"[:1000])


def end_billing(machine: Machine) -> None:
    """The rental is over (destroyed, killed, gone from Vast): it bills nothing from now."""
    now = timezone.now()
    RemoteMachine.objects.filter(machine=machine, billing_ended__isnull=True).update(
        billing_ended=now)
    ledger.stop_billing(machine, now)


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


async def pull_bills(client: VastClient, *, tolerance: float) -> int:
    """Pull what Vast billed for each of our rentals since the first one began, keep it in the
    ledger and hold it against the estimate there (one Event when they differ by more than
    `tolerance`). Returns how many rentals were billed."""
    first = await BillingInterval.objects.filter(machine__provider=Machine.Provider.VAST) \
        .order_by("started_at").values_list("started_at", flat=True).afirst()
    if first is None:
        return 0
    fetched_at = timezone.now()
    charges = await client.charges(first.timestamp() - 86400, fetched_at.timestamp())
    ours: set[int] = {i async for i in Machine.objects.filter(
        provider=Machine.Provider.VAST, vast_instance_id__in=list(charges))
        .values_list("vast_instance_id", flat=True)}
    await sync_to_async(ledger.record_bills)(
        {i: c for i, c in charges.items() if i in ours}, fetched_at, tolerance=tolerance)
    return len(ours)
