"""A day of proving on a virtual clock, to judge the autopilot against two baselines.

The world: a demand trace (bursts of porep-c2, window-post every 30 minutes, rare winning-post,
a trickle of snap-update), a market of offers whose price and speed differ per GPU model and per
machine, boot-and-provisioning times drawn from a log-normal distribution, some machines that
never boot and some that bench below the minimum (the lifecycle's benchmark gate destroys them
and marks them bad, as judge_benchmark does in the product). Hosts prove one partition at a
time, the most urgent first; jobs go to hosts by the product's own dispatch policy
(`proofs.placement.place`): urgent ones (critical, high) at once, the others while a host holds
less than its workers plus a look-ahead, so a host that comes up takes a share of a backlog.

The market is the strict Vast fake (`remote/fake_vast.py`) served on 127.0.0.1 on the virtual
clock, spoken to by the product's own Vast client: every tick searches its offers and, while a
rented host is on its way, lists the instances (as the automation's reconcile does); renting is
a create, a host is up once Vast reports its instance running (plus install, parameters and
benchmark), a machine that never boots stays loading until a policy destroys it.

Each policy sees the world every TICK_S through the same `planner.PlannerInput` the product builds
and returns `planner.Decision`s; the autopilot policy *is* `planner.plan`. Everything is seeded:
one seed gives one trace and one market, shared by every policy.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cuzk_engine.vocabulary import DEFAULT_PRIORITIES, PRIORITY_RANK
from devtools.fake_vast import FakeVast
from vastmgr.autopilot import planner
from vastmgr.autopilot.pilot import OFFERS_SEARCHED
from vastmgr.autopilot.planner import (
    Action,
    Decision,
    Host,
    KindWork,
    Limits,
    MachinePhase,
    Offer,
    PlannerInput,
)
from vastmgr.lib.errors import VastError
from vastmgr.proofs import placement
from vastmgr.remote import vast

TICK_S = 60.0
DAY_S = 24 * 3600.0
WORKERS = 2  # device workers of a simulated host's engine (one device, the default two)
WORK = planner.KIND_WORK
PARTITIONS = {"winning-post": 1, "window-post": 1, "snap-update": 16, "porep-c2": 10}
# How long each kind may take from submission to done.
BUDGETS_S = {"winning-post": 30.0, "window-post": 25 * 60.0, "snap-update": 6 * 3600.0,
             "porep-c2": 90 * 60.0}
# GPU model: $/h and porep-c2 proofs/h of a typical machine (RTX 3060s bench below minimum).
MARKET = {"RTX 3060": (0.07, 30.0), "RTX 3090": (0.17, 70.0), "RTX A6000": (0.42, 90.0),
          "RTX 4090": (0.33, 140.0), "A100 SXM4": (1.05, 180.0), "H100 SXM": (2.05, 300.0)}
MIN_BENCH_RATE = 50.0  # porep-c2 proofs/h; also the conservative default for an unknown model
PRIOR_PIPELINE_S = 15 * 60.0  # until the first host has come up
HISTORY = ("RTX 3090", "RTX 4090", "A100 SXM4")  # models benched on earlier days
WARM_UP_S = 3600.0  # policies start an hour before the first proof, as a fleet already running
ARRIVAL_WINDOW_S = 15 * 60.0
# Of a machine's rent-to-proving time: Vast reports its instance loading, then running; the
# rest is install, parameters and the benchmark.
BOOT_SHARE = (0.15, 0.4)
API_KEY = "simulated-day-vast-key-0123456789"
# A machine's minimum bid as a share of its on-demand price (Vast's interruptible discount).
BID_SHARE = (0.3, 0.55)
# An interruptible host that gets its GPU back restarts its engine (parameters are on disk).
RESTART_S = 60.0
# The outbid rate the planner assumes before it has seen any: 0.1 per hour over 10 hours.
PRIOR_PREEMPTIONS, PRIOR_BID_HOURS = 1.0, 10.0
# Kinds the dispatcher keeps off interruptible hosts (the planner counts bids for them never).
TRUSTED_ONLY = planner.TRUSTED_ONLY_KINDS


def rates_from(porep_per_h: float) -> dict[str, float]:
    return {kind: porep_per_h / work for kind, work in WORK.items()}


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    at: float

    @property
    def deadline(self) -> float:
        return self.at + BUDGETS_S[self.kind]

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[DEFAULT_PRIORITIES[self.kind]]


@dataclass(frozen=True)
class Machine:
    """A provider machine behind one offer, with the truths no one sees before renting it."""

    offer: Offer
    true_rate: float  # porep-c2 proofs/h
    never_boots: bool
    pipeline_s: float
    min_bid: float = 0.0  # its minimum bid ($/h) for an interruptible rental

    @property
    def boot_s(self) -> tuple[float, float] | None:
        """When Vast reports its instance loading, then running (None: it never boots)."""
        if self.never_boots:
            return None
        return BOOT_SHARE[0] * self.pipeline_s, BOOT_SHARE[1] * self.pipeline_s

    @property
    def provisioning_s(self) -> float:
        return (1 - BOOT_SHARE[1]) * self.pipeline_s


@dataclass(frozen=True)
class World:
    jobs: tuple[Job, ...]
    machines: tuple[Machine, ...]


def make_world(seed: int = 7, *, offers: int = 60) -> World:
    rng = random.Random(seed)
    arrivals: list[tuple[float, str]] = []
    for window in range(48):  # window-post: a batch at the start of each 30-minute window
        arrivals += [(window * 1800.0 + rng.uniform(0, 60), "window-post")
                     for _ in range(rng.randint(10, 24))]
    t = rng.expovariate(1 / 3600)
    while t < DAY_S:  # winning-post: rare (about one an hour)
        arrivals.append((t, "winning-post"))
        t += rng.expovariate(1 / 3600)
    t = rng.expovariate(1 / 600)
    while t < DAY_S:  # snap-update: a trickle
        arrivals.append((t, "snap-update"))
        t += rng.expovariate(1 / 600)
    for _ in range(6):  # porep-c2: bursts of a few hundred within minutes
        start, size = rng.uniform(0, DAY_S - 4 * 3600), rng.randint(120, 420)
        arrivals += [(start + rng.uniform(0, 600), "porep-c2") for _ in range(size)]
    arrivals.sort()
    jobs = tuple(Job(i, kind, at) for i, (at, kind) in enumerate(arrivals))
    machines = []
    models = list(MARKET)
    for i in range(offers):
        gpu = models[i % len(models)]
        price, rate = MARKET[gpu]
        count = rng.choice((1, 1, 1, 2))
        offer = Offer(40_000 + i, 900_000 + i, gpu, count,
                      round(price * count * rng.uniform(0.8, 1.35), 4), {}, False)
        machines.append(Machine(offer, rate * count * rng.uniform(0.75, 1.15),
                                never_boots=rng.random() < 0.08,
                                pipeline_s=rng.lognormvariate(math.log(8 * 60), 0.35)))
    # Minimum bids from their own draws, so the on-demand world is the same as before bids.
    bids = random.Random(f"bids-{seed}")
    machines = [replace(m, min_bid=round(m.offer.price_per_hour * bids.uniform(*BID_SHARE), 4))
                for m in machines]
    return World(jobs, tuple(machines))


@dataclass
class SimMachine:
    id: int
    machine: Machine
    instance_id: int
    rented_at: float
    booted: bool = False  # Vast has reported its instance running
    ready_at: float | None = None  # proving since
    draining: bool = False
    ended_at: float | None = None
    jobs: list[list] = field(default_factory=list)  # [job, partitions left]
    busy_until: float | None = None
    idle_since: float = 0.0
    price: float = 0.0  # $/h now: the offer's on demand, the bid when interruptible
    bid: float | None = None  # interruptible: the bid placed
    outbid_since: float | None = None  # stopped by a higher bid since
    competitor_bid: float | None = None
    restarting: bool = False  # got its GPU back, its engine not up yet
    generation: int = 0  # bumped when a preemption cancels the events scheduled before it
    spent: float = 0.0  # dollars billed up to bill_from
    bill_from: float = 0.0

    @property
    def proving(self) -> bool:
        return (self.ready_at is not None and self.ended_at is None and
                self.outbid_since is None and not self.restarting)

    def bill(self, now: float) -> None:
        """Add what it cost since bill_from (an outbid host bills no GPU; storage is free
        in this world)."""
        if self.outbid_since is None and self.ended_at is None:
            self.spent += self.price * (now - self.bill_from) / 3600
        self.bill_from = now


@dataclass
class Result:
    name: str
    met: dict[str, int]
    total: dict[str, int]
    dollars: float
    proofs: int
    peak_hosts: int
    mean_hosts: float
    peak_dollars_per_hour: float
    max_rents_in_an_hour: int
    decisions: list[tuple[float, Decision]]
    vast_calls: list[vast.VastCall]
    preemptions: int = 0
    requeued: int = 0
    interruptible_rents: int = 0
    duplicates: int = 0  # proofs finished twice (must stay 0)

    def to_json(self) -> dict:
        return {"policy": self.name, "dollars": round(self.dollars, 2),
                "dollars_per_proof": round(self.dollars / max(self.proofs, 1), 5),
                "proofs": self.proofs, "deadlines_met": {
                    k: f"{self.met.get(k, 0)}/{n}" for k, n in sorted(self.total.items())},
                "missed": {k: n - self.met.get(k, 0) for k, n in sorted(self.total.items())},
                "peak_hosts": self.peak_hosts, "mean_hosts": round(self.mean_hosts, 2),
                "peak_dollars_per_hour": round(self.peak_dollars_per_hour, 3),
                "max_rents_in_an_hour": self.max_rents_in_an_hour,
                "actions": sum(1 for _, d in self.decisions if d.action != Action.KEEP),
                "preemptions": self.preemptions, "jobs_requeued": self.requeued,
                "interruptible_rents": self.interruptible_rents,
                "duplicate_proofs": self.duplicates,
                "vast_calls": len(self.vast_calls),
                "vast_calls_failed": sum(1 for c in self.vast_calls
                                         if c.status is None or c.status >= 400)}


Policy = Callable[[PlannerInput], list[Decision]]


class Simulation:
    """One policy's day; `market` is the fake Vast serving the world's offers."""

    def __init__(self, world: World, limits: Limits, market: FakeVast):
        self.world = world
        self.limits = limits
        self.market = market
        self.calls: list[vast.VastCall] = []
        self.client = vast.VastClient(API_KEY, market.url, journal=self.calls.append)
        self.machines = {m.offer.offer_id: m for m in world.machines}
        self.now = -WARM_UP_S
        self.hosts: dict[int, SimMachine] = {}
        # (rank, at, id, job), in order: queued in the dashboard, not yet on a host
        self.queue: list[tuple[int, float, int, Job]] = []
        self.done: dict[int, float] = {}
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        # GPU model → per-GPU bench rates seen (MachinePerf): earlier days left one of some models.
        self.bench: dict[str, list[float]] = {gpu: [MARKET[gpu][1]] for gpu in HISTORY}
        self.pipelines: list[float] = []
        self.bad: set[int] = set()
        self.rents: list[float] = []
        self.last_change: float | None = None
        self.arrived: list[Job] = []
        self.decisions: list[tuple[float, Decision]] = []
        self.preemptions: list[float] = []
        self.requeued = 0
        self.duplicates = 0

    # ------------------------------------------------------------------ the world's events

    def _at(self, when: float, what: str, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, what, payload))

    async def run(self, policy: Policy, name: str) -> Result:
        for job in self.world.jobs:
            self._at(job.at, "arrive", job)
        tick = -WARM_UP_S
        while tick <= DAY_S:
            self._at(tick, "tick", None)
            tick += TICK_S
        samples: list[tuple[int, float]] = []
        while self.events:
            self.now, _, what, payload = heapq.heappop(self.events)
            self.market.clock = self.now
            if what == "arrive":
                assert isinstance(payload, Job)
                self.arrived.append(payload)
                bisect.insort(self.queue, (payload.rank, payload.at, payload.id, payload))
                self._dispatch()
            elif what in ("ready", "restarted", "partition"):
                assert isinstance(payload, tuple)
                host = self.hosts[payload[0]]
                if payload[1] != host.generation:
                    continue  # scheduled before a preemption stopped the host
                if what == "ready":
                    await self._ready(host)
                elif what == "restarted":
                    host.restarting = False
                    host.idle_since = self.now
                    self._dispatch()
                else:
                    self._partition_done(host)
            elif what == "tick":
                await self._watch_instances()
                for decision in policy(await self.snapshot()):
                    await self.apply(decision)
                live = [h for h in self.hosts.values() if h.ended_at is None]
                samples.append((len(live), sum(h.price for h in live
                                               if h.outbid_since is None)))
        for host in self.hosts.values():  # the day is over: stop every bill
            if host.ended_at is None:
                host.bill(self.now)
                host.ended_at = self.now
        return self._result(name, samples)

    async def _watch_instances(self) -> None:
        """As the automation's reconcile: which rented instances Vast reports running now,
        and which interruptible ones it stopped for a higher bid (or gave back)."""
        watched = {h.instance_id: h for h in self.hosts.values() if h.ended_at is None
                   and (not h.booted or h.bid is not None)}
        if not watched:
            return
        for row in await self.client.list_instances():
            host = watched.get(row["id"])
            if host is None:
                continue
            status = row.get("actual_status")
            if host.bid is not None and status == "stopped" and host.outbid_since is None:
                self._preempt(host, row)
            elif status == "running" and host.outbid_since is not None:
                self._resumed(host)
            if status == "running" and not host.booted:
                host.booted = True
                self._at(self.now + host.machine.provisioning_s, "ready",
                         (host.id, host.generation))

    def _preempt(self, host: SimMachine, row: dict) -> None:
        """Outbid: the host stops; its jobs go back to the queue whole (a partition's
        progress lives in the stopped container), once each."""
        host.bill(self.now)
        host.outbid_since = self.now
        host.competitor_bid = float(row.get("min_bid") or 0) or None
        host.generation += 1
        host.busy_until = None
        for job, _ in host.jobs:
            bisect.insort(self.queue, (job.rank, job.at, job.id, job))
            self.requeued += 1
        host.jobs = []
        self.preemptions.append(self.now)
        self._dispatch()

    def _resumed(self, host: SimMachine) -> None:
        """The GPU is back (a raised bid, or the competitor left): the engine restarts; a
        host stopped on its way up goes on with its provisioning."""
        host.outbid_since = None
        host.competitor_bid = None
        host.bill_from = self.now
        if host.ready_at is not None:
            host.restarting = True
            self._at(self.now + RESTART_S, "restarted", (host.id, host.generation))
        elif host.booted:
            self._at(self.now + host.machine.provisioning_s, "ready",
                     (host.id, host.generation))

    async def _ready(self, host: SimMachine) -> None:
        if host.ended_at is not None:
            return
        self.pipelines.append(self.now - host.rented_at)
        offer = host.machine.offer
        measured = host.machine.true_rate * random.Random(host.id).uniform(0.95, 1.05)
        self.bench.setdefault(offer.gpu_name, []).append(measured / offer.gpu_count)
        if measured < MIN_BENCH_RATE:  # the lifecycle's benchmark gate
            self.bad.add(host.machine.offer.provider_machine_id or 0)
            await self._destroy(host)
            return
        host.ready_at = self.now
        host.idle_since = self.now
        self._dispatch()

    def _dispatch(self) -> None:
        """The product's own dispatch policy (`placement.place`) over the hosts proving:
        PoSt first over the hosts Vast cannot take away, then the rest over all."""
        proving = {h.id: h for h in self.hosts.values() if h.proving and not h.draining}
        if not self.queue or not proving:
            return
        trusted = {i: h for i, h in proving.items() if h.bid is None}
        for kinds, engines in ((TRUSTED_ONLY, trusted), (None, proving)):
            waiting = [e for e in self.queue if kinds is None or e[3].kind in kinds]
            if kinds is None:
                waiting = [e for e in waiting if e[3].kind not in TRUSTED_ONLY]
            if not waiting or not engines:
                continue
            placements = placement.place(
                (placement.Waiting(entry, DEFAULT_PRIORITIES[entry[3].kind])
                 for entry in waiting),
                [placement.Engine(h.id, WORKERS, len(h.jobs)) for h in engines.values()])
            placed = {p.job for p in placements}
            self.queue = [entry for entry in self.queue if entry not in placed]
            for p in placements:
                host = engines[p.engine]
                job = p.job[3]
                host.jobs.append([job, PARTITIONS[job.kind]])
                self._start_next(host)

    def _start_next(self, host: SimMachine) -> None:
        if host.busy_until is not None or not host.jobs:
            return
        host.jobs.sort(key=lambda entry: (entry[0].rank, entry[0].at))
        job = host.jobs[0][0]
        hours = WORK[job.kind] / host.machine.true_rate / PARTITIONS[job.kind]
        host.busy_until = self.now + hours * 3600
        self._at(host.busy_until, "partition", (host.id, host.generation))

    def _partition_done(self, host: SimMachine) -> None:
        host.busy_until = None
        entry = host.jobs[0]
        entry[1] -= 1
        if entry[1] == 0:
            host.jobs.pop(0)
            if entry[0].id in self.done:
                self.duplicates += 1
            self.done[entry[0].id] = self.now
            if not host.jobs:
                host.idle_since = self.now
        self._start_next(host)
        self._dispatch()

    async def _destroy(self, host: SimMachine) -> None:
        await self.client.destroy_instance(host.instance_id)
        host.bill(self.now)
        host.ended_at = self.now

    # ------------------------------------------------------------------ what a policy sees

    def pipeline_s(self) -> float:
        if not self.pipelines:
            return PRIOR_PIPELINE_S
        ordered = sorted(self.pipelines)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]  # the 90th percentile

    def offer_rates(self, offer: Offer) -> Offer | None:
        return planner.estimate_offer(offer, self.bench.get(offer.gpu_name, []),
                                      bench_kind="porep-c2", min_bench_rate=MIN_BENCH_RATE,
                                      work=WORK)

    async def snapshot(self) -> PlannerInput:
        unfinished = [j for j in self.arrived if j.id not in self.done]
        recent = [j for j in self.arrived if j.at > self.now - ARRIVAL_WINDOW_S]
        work = []
        for kind in WORK:
            mine = [j for j in unfinished if j.kind == kind]
            work.append(KindWork(
                kind, len(mine), max((self.now - j.at for j in mine), default=0.0),
                BUDGETS_S[kind],
                sum(1 for j in recent if j.kind == kind) * 3600 / ARRIVAL_WINDOW_S))
        hosts = []
        for host in self.hosts.values():
            if host.ended_at is not None:
                continue
            phase = (MachinePhase.OUTBID if host.outbid_since is not None else
                     MachinePhase.STARTING if host.ready_at is None or host.restarting else
                     MachinePhase.DRAINING if host.draining else MachinePhase.PROVING)
            estimate = self.offer_rates(host.machine.offer)
            rates = (rates_from(host.machine.true_rate) if host.ready_at is not None
                     else estimate.rates if estimate else {})
            hosts.append(Host(host.id, f"host-{host.id}", phase,
                              0.0 if host.outbid_since is not None else host.price, rates,
                              len(host.jobs), self.now - host.rented_at,
                              0.0 if host.jobs else self.now - host.idle_since,
                              provider_machine_id=host.machine.offer.provider_machine_id,
                              interruptible=host.bid is not None,
                              on_demand_price=host.machine.offer.price_per_hour, bid=host.bid,
                              competitor_bid=host.competitor_bid,
                              outbid_s=(self.now - host.outbid_since
                                        if host.outbid_since is not None else 0.0)))
        raw = await self.client.search_offers(vast.OfferFilter(limit=OFFERS_SEARCHED))
        on_demand = {o["id"]: o["dph_total"] for o in raw}
        if self.limits.interruptible:  # the pilot's second search: the same market as bids
            raw += await self.client.search_offers(vast.OfferFilter(
                limit=OFFERS_SEARCHED, offer_type=vast.INTERRUPTIBLE))
        offers = tuple(o for o in (self.offer_rates(bare) for bare in filter(None, (
            planner.offer_from_vast(r, on_demand.get(r["id"])) for r in raw))) if o is not None)
        return PlannerInput(self.now, tuple(work), tuple(hosts), offers, self.limits,
                        self.pipeline_s(), frozenset(self.bad),
                        sum(1 for t in self.rents if t > self.now - 3600), self.last_change,
                        self.preemptions_per_h())

    def preemptions_per_h(self) -> float:
        """Outbids seen per hour of interruptible rent so far, from a prior of 0.1/h."""
        hours = sum(((h.ended_at if h.ended_at is not None else self.now) - h.rented_at)
                    for h in self.hosts.values() if h.bid is not None) / 3600
        return (len(self.preemptions) + PRIOR_PREEMPTIONS) / (hours + PRIOR_BID_HOURS)

    # ------------------------------------------------------------------ carrying out

    async def apply(self, decision: Decision) -> None:
        self.decisions.append((self.now, decision))
        if decision.action == Action.KEEP:
            return
        if decision.scaling:
            self.last_change = self.now
        if decision.action == Action.RENT:
            await self._rent(decision)
            return
        assert decision.machine_id is not None
        host = self.hosts[decision.machine_id]
        if decision.action == Action.BID:
            assert decision.bid is not None
            try:
                await self.client.change_bid(host.instance_id, decision.bid)
            except VastError:
                return
            host.bill(self.now)
            host.bid = host.price = decision.bid
        elif decision.action == Action.DRAIN:
            host.draining = True
        elif decision.action == Action.RESUME:
            host.draining = False
            self._dispatch()
        elif decision.action == Action.DESTROY:
            assert not host.jobs, "a host with work in flight was destroyed"
            if decision.mark_bad:
                self.bad.add(host.machine.offer.provider_machine_id or 0)
            await self._destroy(host)

    async def _rent(self, decision: Decision) -> None:
        """As the pilot rents: the offer looked up again, then a create with a label."""
        assert decision.offer_id is not None
        try:
            offer = await self.client.offer(decision.offer_id, offer_type=(
                vast.ON_DEMAND if decision.bid is None else vast.INTERRUPTIBLE))
            if offer is None:
                return  # gone since the search: the product records the failure, rents nothing
            request = vast.RentRequest.from_offer(offer)
            host_id = len(self.hosts) + 1
            instance_id = await self.client.create_instance(
                request.offer_id, image=request.deployment.image, disk_gb=request.disk_gb,
                label=f"{vast.LABEL_PREFIX}sim-{host_id}", bid_price=decision.bid)
        except VastError:
            return  # counted in the calls; nothing was rented
        machine = self.machines[request.offer_id]
        host = SimMachine(host_id, machine, instance_id, self.now,
                          price=decision.bid if decision.bid is not None
                          else machine.offer.price_per_hour, bid=decision.bid,
                          bill_from=self.now)
        self.hosts[host.id] = host
        self.rents.append(self.now)

    def _result(self, name: str, samples: list[tuple[int, float]]) -> Result:
        met: dict[str, int] = {}
        total: dict[str, int] = {}
        for job in self.world.jobs:
            total[job.kind] = total.get(job.kind, 0) + 1
            if self.done.get(job.id, math.inf) <= job.deadline:
                met[job.kind] = met.get(job.kind, 0) + 1
        dollars = sum(h.spent for h in self.hosts.values())
        rents = sorted(self.rents)
        return Result(name, met, total, dollars, len(self.done),
                      max((n for n, _ in samples), default=0),
                      statistics.fmean(n for n, _ in samples) if samples else 0.0,
                      max((d for _, d in samples), default=0.0),
                      max((sum(1 for u in rents if t <= u < t + 3600) for t in rents),
                          default=0),
                      self.decisions, self.calls, len(self.preemptions), self.requeued,
                      sum(1 for h in self.hosts.values() if h.bid is not None),
                      self.duplicates)


# ---------------------------------------------------------------------- the two baselines


def _best_offers(snap: PlannerInput) -> list[Offer]:
    mix = {kind: 1.0 for kind in WORK}
    return sorted((o for o in snap.offers if o.provider_machine_id not in snap.bad_machines),
                  key=lambda o: planner.dollars_per_proof(o.price_per_hour, o.rates, mix))


def _rent(offer: Offer, why: str) -> Decision:
    return Decision(Action.RENT, f"rent offer {offer.offer_id}", (why,),
                    {"price_per_hour": offer.price_per_hour}, offer_id=offer.offer_id)


def _replace_stuck(snap: PlannerInput) -> list[Decision]:
    """The same fault rule for every policy: a host not proving after pipeline + margin goes."""
    limit = snap.pipeline_s + snap.limits.pipeline_margin_s
    return [Decision(Action.DESTROY, f"destroy {h.name}", ("never came up",), {},
                     machine_id=h.machine_id, mark_bad=True, scaling=False)
            for h in snap.hosts if h.phase == MachinePhase.STARTING and h.age_s > limit]


def fixed_fleet(size: int) -> Policy:
    """Rent `size` hosts, the cheapest per proof, and keep them all day (replacing failures)."""
    def policy(snap: PlannerInput) -> list[Decision]:
        decisions = _replace_stuck(snap)
        alive = sum(1 for h in snap.hosts) - len(decisions)
        decisions += [_rent(o, f"fixed fleet of {size}")
                      for o in _best_offers(snap)[:max(size - alive, 0)]]
        return decisions
    return policy


def threshold_scaler(per_host: int = 25, idle_s: float = 600.0, floor: int = 1) -> Policy:
    """A queue-length scaler: one more host while unfinished work per host exceeds
    `per_host`; release a host idle for `idle_s`; never below `floor`."""
    def policy(snap: PlannerInput) -> list[Decision]:
        decisions = _replace_stuck(snap)
        hosts = [h for h in snap.hosts if h.machine_id not in {d.machine_id for d in decisions}]
        unfinished = sum(w.unfinished for w in snap.work)
        if len(hosts) < floor or unfinished > per_host * max(len(hosts), 1):
            best = _best_offers(snap)
            if best and len(hosts) < snap.limits.max_hosts:
                decisions.append(_rent(best[0], f"{unfinished} unfinished > {per_host}/host"))
            return decisions
        idle = [h for h in hosts if h.phase == MachinePhase.PROVING and h.in_flight == 0
                and h.idle_s >= idle_s]
        if idle and len(hosts) > floor:
            decisions.append(Decision(Action.DESTROY, f"destroy {idle[0].name}", ("idle",), {},
                                      machine_id=idle[0].machine_id))
        return decisions
    return policy


def autopilot(snap: PlannerInput) -> list[Decision]:
    return list(planner.plan(snap).decisions)


def lower_bound(world: World, *, bids: bool = False) -> float:
    """Perfect foresight, no boot, no idle: every proof on the machine with the best $/proof
    that boots and passes the gate (at its on-demand price, or with `bids` at its minimum bid,
    never outbid, PoSt included). No on-demand schedule (with `bids`: no schedule at all) that
    does the work can pay less."""
    best = min((m.min_bid if bids else m.offer.price_per_hour) / m.true_rate
               for m in world.machines if not m.never_boots and m.true_rate >= MIN_BENCH_RATE)
    return sum(WORK[job.kind] for job in world.jobs) * best


def peak_fleet_size(world: World) -> int:
    """Hosts of the best $/proof model needed to clear the largest burst within its budget, as
    someone sizing a fixed fleet for the peak would (plus one for PoSt while it runs)."""
    worst = 0.0
    for job in world.jobs:
        window = [j for j in world.jobs
                  if job.at <= j.at < job.at + BUDGETS_S["porep-c2"]]
        worst = max(worst, sum(WORK[j.kind] for j in window))
    usable = [m for m in world.machines if not m.never_boots and m.true_rate >= MIN_BENCH_RATE]
    rate = min(usable, key=lambda m: m.offer.price_per_hour / m.true_rate).true_rate
    hours = BUDGETS_S["porep-c2"] / 3600
    return math.ceil(worst / (rate * hours)) + 1


DEFAULT_LIMITS = Limits(max_dollars_per_hour=6.0, max_hosts=16, max_rents_per_hour=20,
                        min_hosts={"winning-post": 1, "window-post": 1}, cooldown_s=120.0,
                        pipeline_margin_s=600.0, idle_release_s=300.0, scale_to_zero=False)
BID_LIMITS = replace(DEFAULT_LIMITS, interruptible=True)


async def simulate(world: World, limits: Limits, policy: Policy, name: str, *,
                   seed: int = 7, preemption_rate: float = 0.0) -> tuple[Simulation, Result]:
    """One policy's day against its own fake Vast, which offers the world's machines (and, at
    `preemption_rate` per hour, outbids the interruptible ones from a market seeded by
    `seed`)."""
    market = FakeVast(API_KEY, relist=True, market_seed=seed, preemption_rate=preemption_rate)
    for machine in world.machines:
        offer = machine.offer
        market.add_offer(id=offer.offer_id, machine_id=offer.provider_machine_id,
                         gpu_name=offer.gpu_name, num_gpus=offer.gpu_count,
                         dph_base=offer.price_per_hour, storage_cost=0.0,
                         min_bid=machine.min_bid)
        market.boots[offer.provider_machine_id or 0] = machine.boot_s
    await market.start()
    try:
        run = Simulation(world, limits, market)
        return run, await run.run(policy, name)
    finally:
        await market.stop()


def compare(seed: int = 7, limits: Limits = DEFAULT_LIMITS,
            preemption_rates: tuple[float, ...] = (0.0,)) -> dict:
    """Every policy on one world; JSON-ready. The on-demand policies do not depend on the
    preemption rate, so they run once; the autopilot with bids runs once per rate."""
    world = make_world(seed)
    size = peak_fleet_size(world)
    on_demand = [(autopilot, "autopilot on-demand only"),
                 (fixed_fleet(size), f"fixed fleet of {size}"),
                 (threshold_scaler(), "queue threshold")]
    runs = [asyncio.run(simulate(world, limits, policy, name, seed=seed))
            for policy, name in on_demand]
    with_bids = replace(limits, interruptible=True)
    by_rate = {rate: asyncio.run(simulate(world, with_bids, autopilot, "autopilot", seed=seed,
                                          preemption_rate=rate))
               for rate in preemption_rates}
    return {"seed": seed, "jobs": len(world.jobs), "offers": len(world.machines),
            "limits": {"max_dollars_per_hour": limits.max_dollars_per_hour,
                       "max_hosts": limits.max_hosts,
                       "max_rents_per_hour": limits.max_rents_per_hour,
                       "max_bid_share": with_bids.max_bid_share},
            "lower_bound_dollars": round(lower_bound(world), 2),
            "lower_bound_bids_dollars": round(lower_bound(world, bids=True), 2),
            "results": [result.to_json() for _, result in runs],
            "autopilot_by_preemption_rate": [
                {"preemption_rate": rate, **result.to_json()}
                for rate, (_, result) in by_rate.items()],
            # Not JSON: each policy's (run, result), for tests that look inside a day.
            "_runs": runs + list(by_rate.values())}
