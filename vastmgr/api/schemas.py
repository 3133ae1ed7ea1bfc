"""What the JSON API takes and returns; the OpenAPI schema is generated from these types."""

import time
from datetime import datetime
from decimal import Decimal
from typing import Literal
from uuid import UUID

from ninja import Field, Schema

from cuzk_engine.vocabulary import KINDS, PRIORITIES, PROFILES
from vastmgr.fleet.ledger import PER_PROOF_RULE
from vastmgr.fleet.liveness import machine_connection
from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import MAX_SEED, ProofJob
from vastmgr.remote.actions import ACTIONS, why_not

Action = Literal["test", "provision", "stop", "start", "restart", "upgrade", "destroy"]
assert set(Action.__args__) == {*ACTIONS, "destroy"}  # type: ignore[attr-defined]
ProofFile = Literal["proof.bin", "vk.json", "public_inputs.json", "proof.tar.gz"]


class Problem(Schema):
    detail: str = Field(description="what was wrong, in words")


class ActionState(Schema):
    action: str
    allowed: bool
    why_not: str = Field(description="why the action is refused now; empty when allowed")


class MachineOut(Schema):
    id: int
    name: str
    provider: str
    state: str
    kill_reason: str
    engine_flavour: str
    enabled: bool
    host: str
    ssh_port: int
    engine_port: int
    gpu_name: str
    gpu_count: int
    price_per_hour: Decimal | None
    bench_rate: float | None = Field(description="proofs per hour measured by its benchmark")
    last_seen: datetime | None
    vast_instance_id: int | None
    vast_machine_id: int | None
    connected: bool | None = Field(
        description="whether the fleet controller's link to its engine is up; null before "
                    "the first look")
    connection: Literal["live", "stale", "offline"] = Field(
        description="whether its engine's figures are current, as every page says: live, "
                    "stale (the link is up but nothing came for 3 intervals) or offline")
    actions: list[ActionState]

    @staticmethod
    def of(machine: Machine) -> "MachineOut":
        live = getattr(machine, "live", None) if hasattr(machine, "live") else None
        return MachineOut(
            id=machine.pk, name=machine.name, provider=machine.provider, state=machine.state,
            kill_reason=machine.kill_reason, engine_flavour=machine.engine_flavour,
            enabled=machine.enabled, host=machine.host, ssh_port=machine.ssh_port,
            engine_port=machine.engine_port, gpu_name=machine.gpu_name,
            gpu_count=machine.gpu_count, price_per_hour=machine.price_per_hour,
            bench_rate=machine.bench_rate, last_seen=machine.last_seen,
            vast_instance_id=machine.vast_instance_id, vast_machine_id=machine.vast_machine_id,
            connected=live.connected if live is not None else None,
            connection=machine_connection(  # type: ignore[arg-type]  # one of the three
                machine.enabled, live.connected if live is not None else None,
                machine.last_seen, live.interval if live is not None else None, time.time()),
            actions=[ActionState(action=a, allowed=not (reason := why_not(machine, a)),
                                 why_not=reason) for a in ACTIONS])


class MachineIn(Schema):
    name: str = Field(max_length=100, description="letters, digits, - and _")
    host: str = Field(max_length=255)
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_user: str = Field("root", max_length=64)
    engine_port: int | None = Field(None, ge=1, le=65535)
    engine_flavour: Literal["cuzk_engine", "cuzk-upstream"] = "cuzk_engine"
    private_key: str = Field("", max_length=20_000,
                             description="an unencrypted private key (stored encrypted), or "
                                         "give key_file")
    key_file: str = Field("", max_length=500)
    price_per_hour: Decimal | None = Field(None, ge=0, le=100, max_digits=8, decimal_places=4)


class ActionResult(Schema):
    machine: MachineOut
    message: str


class ProofIn(Schema):
    kind: Literal[KINDS]  # type: ignore[valid-type]
    profile: Literal[PROFILES] = "tiny"  # type: ignore[valid-type]
    seed: int | None = Field(None, ge=0, le=MAX_SEED,
                             description="empty: a random seed per proof")
    count: int = Field(1, ge=1, le=20)
    priority: Literal[PRIORITIES] | None = None  # type: ignore[valid-type]
    machine: int | None = Field(None, ge=1, le=2**63 - 1,
                                description="a machine id; empty: the least-loaded one")


class ProofOut(Schema):
    id: UUID
    kind: str
    profile: str
    seed: int
    priority: str
    status: str
    machine: int | None
    machine_name: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    verified: bool | None = Field(description="the dashboard's own re-verification")
    error: str
    cancel_requested: bool
    retry_of: UUID | None
    timings: dict[str, float]
    duration_s: float | None = Field(
        description="an ended proof's duration, as every page shows it: from its submission on "
                    "the engine until nothing of it ran any more (null while in flight)")
    files: list[str] = Field(description="what /files/{name} can download now")

    @staticmethod
    def of(job: ProofJob, files: list[str]) -> "ProofOut":
        return ProofOut(
            id=job.pk, kind=job.kind, profile=job.profile, seed=job.seed, priority=job.priority,
            status=job.status, machine=job.machine_id,
            machine_name=job.machine.name if job.machine else None,
            submitted_at=job.submitted_at, started_at=job.started_at,
            finished_at=job.finished_at, verified=job.verified, error=job.error,
            cancel_requested=job.cancel_requested, retry_of=job.retry_of_id,
            timings={k: float(v) for k, v in (job.timings or {}).items()
                     if isinstance(v, int | float)},
            duration_s=None if job.engine_duration is None
            else job.engine_duration.total_seconds(),
            files=files)


class Page(Schema):
    count: int
    page: int
    pages: int


class ProofPage(Page):
    items: list[ProofOut]


class EventOut(Schema):
    id: int
    time: datetime
    level: str
    kind: str
    message: str
    machine: int | None
    machine_name: str | None

    @staticmethod
    def of(event: Event) -> "EventOut":
        return EventOut(id=event.pk, time=event.time, level=event.level, kind=event.kind,
                        message=event.message, machine=event.machine_id,
                        machine_name=event.machine.name if event.machine else None)


class EventPage(Page):
    items: list[EventOut]


class OfferOut(Schema):
    id: int
    machine_id: int | None = None
    host_id: int | None = None
    gpu_name: str = ""
    num_gpus: int = 0
    gpu_ram: float | None = Field(None, description="MB per GPU")
    cpu_ram: float | None = Field(None, description="MB")
    cpu_cores: float | None = None
    disk_space: float | None = Field(None, description="GB")
    inet_down: float | None = Field(None, description="Mbps")
    dph_total: float | None = Field(None, description="$/h, disk included")
    reliability: float | None = None
    geolocation: str | None = None
    cuda_max_good: float | None = None
    bad_host: bool
    proofs_per_hour: float | None = Field(description="known or estimated benchmark rate")
    rate_source: str
    price_per_proof: float | None


class RentIn(Schema):
    disk_gb: int = Field(64, ge=10, le=10_000)


class FleetSummary(Schema):
    machines: int = Field(description="machines not killed")
    by_state: dict[str, int]
    connected: int = Field(description="machines whose engine link is up")
    live: int = Field(description="machines whose engine is live (its figures are current), as "
                                  "the pages count them")
    price_per_hour: Decimal = Field(description="$/h billing now (the ledger)")
    gpus: int = Field(description="GPUs rented now (the ledger)")
    gpus_on_engines: int = Field(description="GPUs the running machines' engines report")
    spent: Decimal = Field(description="all the fleet ever billed, estimated by the ledger "
                                       "(killed and destroyed rentals included)")
    billed: Decimal | None = Field(description="what Vast billed, as last pulled (None: never)")
    billed_age_s: float | None = Field(description="seconds since that bill was pulled")
    cost_per_proof_24h: Decimal | None = Field(description=PER_PROOF_RULE)
    proofs_queued: int
    proofs_in_flight: int
    proofs_done_24h: int
    proofs_failed_24h: int
