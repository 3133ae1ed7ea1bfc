"""The autopilot's planner: a pure function from what it is told of the fleet to decisions.

It knows nothing of Django, Vast or clocks: the product builds a `PlannerInput` from the database
(planner_input.py) and the simulated day (devtools/autopilot_day.py) builds one from its virtual
world, and both call
`plan()`. Times are seconds, money dollars, rates proofs per hour.

How much capacity is enough: a host h finishes a mix of proofs n (per kind) alone in
H_h(n) = Σ_k n_k / rate_h(k) hours, so a fleet clears it at Σ_h 1 / H_h(n) "mixes per hour".
Kinds are served most urgent first (the engine's priorities), so kind k waits for the backlog of
its own and every more urgent kind; its forecast drain time is that cumulative mix over the
fleet's speed. A kind is at risk when that is longer than the time left before its oldest
unfinished proof's deadline. A new host helps only after the measured provisioning pipeline, so
the planner rents enough that the work left after the pipeline fits in the time left after it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from cuzk_engine.vocabulary import DEFAULT_PRIORITIES, KINDS, PRIORITY_RANK

# Kinds in the order the engine serves them: most urgent first.
SERVICE_ORDER: tuple[str, ...] = tuple(sorted(KINDS, key=lambda k: PRIORITY_RANK[
    DEFAULT_PRIORITIES[k]]))
# The fleet should be busy at most this share of the time with the steady arrivals, so that a
# deadline is not lost to ordinary variation.
TARGET_UTILISATION = 0.8
# Work of one proof relative to porep-c2 on the same host: partitions × constraints per
# partition, which are about equal across kinds at one profile (`python -m cuzk_engine circuits`).
KIND_WORK: dict[str, float] = {"winning-post": 0.1, "window-post": 0.1, "snap-update": 1.6,
                               "porep-c2": 1.0}
# A kind whose budget is shorter than this many pipeline times is served from warm capacity.
URGENT_PIPELINES = 3
# An idle floor host is swapped for a measured offer this many times cheaper per hour.
SWAP_FACTOR = 2.0
# Rent when the forecast drain exceeds this share of the time left, not only when it is over.
SAFETY = 0.85
# Interruptible (bid) capacity. A bid is placed this much above the machine's minimum bid
# (a little headroom against the smallest competitor), and an outbid host's bid is raised to
# this much above the competitor's, each within the cap (Limits.max_bid_share of the machine's
# on-demand price: beyond it, on-demand is the better buy once preemptions are counted).
BID_MARKUP = 1.1
# How soon a preemption is seen and acted on (the automation's reconcile, or Vast's webhook).
PREEMPTION_NOTICE_S = 120.0
# PoSt: hard, short deadlines, and a missed one costs the miner; only capacity Vast cannot
# take away serves it, whatever its slack.
TRUSTED_ONLY_KINDS = ("winning-post", "window-post")


class Action(StrEnum):
    RENT = "rent"
    KEEP = "keep"
    DRAIN = "drain"
    RESUME = "resume"  # a draining host is needed again
    DESTROY = "destroy"
    BID = "bid"  # raise an outbid interruptible host's bid


class MachinePhase(StrEnum):
    STARTING = "starting"  # rented, on its way through boot, install, parameters, benchmark
    PROVING = "proving"
    DRAINING = "draining"  # takes no new work; destroyed once its work in flight is done
    OUTBID = "outbid"  # interruptible, stopped by a higher bid: proves nothing, its jobs requeued


@dataclass(frozen=True)
class KindWork:
    kind: str
    unfinished: int  # queued, dispatched or running
    oldest_wait_s: float  # age of the oldest unfinished proof (0 when none)
    budget_s: float  # how long a proof of this kind may take from submission to done
    arrivals_per_h: float = 0.0  # recent arrival rate

    @property
    def slack_s(self) -> float:
        """Time left before the oldest unfinished proof's deadline."""
        return self.budget_s - self.oldest_wait_s if self.unfinished else self.budget_s


@dataclass(frozen=True)
class Host:
    machine_id: int
    name: str
    phase: MachinePhase
    price_per_hour: float
    rates: Mapping[str, float]
    in_flight: int = 0
    age_s: float = 0.0  # since it was rented
    idle_s: float = 0.0  # since it last had work in flight (0 while it has some)
    managed: bool = True  # rented by the autopilot, so the autopilot may release it
    provider_machine_id: int | None = None
    interruptible: bool = False  # rented with a bid: Vast may stop it for a higher one
    on_demand_price: float | None = None  # the same machine on demand ($/h), for the bid cap
    bid: float | None = None  # an interruptible host's bid ($/h, the GPU part of its price)
    competitor_bid: float | None = None  # while outbid: the machine's minimum bid now
    outbid_s: float = 0.0  # while outbid: since when


@dataclass(frozen=True)
class Offer:
    offer_id: int
    provider_machine_id: int | None
    gpu_name: str
    gpu_count: int
    price_per_hour: float
    rates: Mapping[str, float]
    measured: bool  # rates from bench history of this GPU model, else the conservative default
    interruptible: bool = False  # a bid: price_per_hour is with the bid the planner would place
    on_demand_price: float | None = None  # the same machine on demand ($/h)
    bid: float | None = None  # the bid to place ($/h, Vast's `price`)


@dataclass(frozen=True)
class Limits:
    max_dollars_per_hour: float
    max_hosts: int
    max_rents_per_hour: int
    min_hosts: Mapping[str, int] = field(default_factory=dict)  # per kind
    cooldown_s: float = 300.0
    pipeline_margin_s: float = 600.0
    # An idle host is kept at least this long (and at least one pipeline time: bringing a new
    # host up costs about that much rent, so holding it that long costs at most twice the best).
    idle_release_s: float = 300.0
    scale_to_zero: bool = True
    # Bids: off, or at most this share of the machine's on-demand price (the bid cap).
    interruptible: bool = False
    max_bid_share: float = 0.7

    @property
    def floor(self) -> int:
        floor = max(self.min_hosts.values(), default=0)
        return floor if floor or self.scale_to_zero else 1


@dataclass(frozen=True)
class PlannerInput:
    """Everything the planner is told, at one moment (a plain value: not an engine snapshot)."""

    now_s: float
    work: tuple[KindWork, ...]
    hosts: tuple[Host, ...]
    offers: tuple[Offer, ...]
    limits: Limits
    pipeline_s: float  # measured time from rent to proving (per provider, from history)
    bad_machines: frozenset[int] = frozenset()
    rents_last_hour: int = 0
    last_change_s: float | None = None
    # $/h billing now for machines not among `hosts` (the ledger's): counted against the cap.
    billed_elsewhere_per_hour: float = 0.0
    preemptions_per_h: float = 0.0  # measured chance per hour that a bid host is outbid


@dataclass(frozen=True)
class Decision:
    action: Action
    summary: str
    reasons: tuple[str, ...]
    numbers: Mapping[str, float | int | str]
    offer_id: int | None = None
    machine_id: int | None = None
    mark_bad: bool = False  # destroy, and never rent this provider machine again
    # A scaling choice starts the cool-down; finishing a drain or removing a broken host not.
    scaling: bool = True
    bid: float | None = None  # rent interruptibly at this bid, or raise an outbid host's to it

    def to_json(self) -> dict:
        return {"action": str(self.action), "summary": self.summary,
                "reasons": list(self.reasons), "numbers": dict(self.numbers),
                "offer_id": self.offer_id, "machine_id": self.machine_id,
                "mark_bad": self.mark_bad, "scaling": self.scaling, "bid": self.bid}

    @classmethod
    def from_json(cls, data: dict) -> Decision:
        return cls(Action(data["action"]), data["summary"], tuple(data["reasons"]),
                   data["numbers"], data.get("offer_id"), data.get("machine_id"),
                   bool(data.get("mark_bad")), bool(data.get("scaling", True)),
                   data.get("bid"))


@dataclass(frozen=True)
class KindForecast:
    kind: str
    unfinished: int
    drain_s: float  # math.inf when no host can serve it
    slack_s: float
    budget_s: float

    @property
    def at_risk(self) -> bool:
        return self.unfinished > 0 and self.drain_s > self.slack_s * SAFETY

    def to_json(self) -> dict:
        return {"kind": self.kind, "unfinished": self.unfinished,
                "drain_s": None if math.isinf(self.drain_s) else round(self.drain_s, 1),
                "slack_s": round(self.slack_s, 1), "budget_s": self.budget_s,
                "at_risk": self.at_risk}


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    forecasts: tuple[KindForecast, ...]
    spend_per_hour: float  # the fleet now (draining and starting hosts bill too)
    spend_after_per_hour: float  # once the decisions are carried out
    hosts_after: int

    @property
    def changes(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.action != Action.KEEP)

    def to_json(self) -> dict:
        return {"decisions": [d.to_json() for d in self.decisions],
                "forecasts": [f.to_json() for f in self.forecasts],
                "spend_per_hour": round(self.spend_per_hour, 4),
                "spend_after_per_hour": round(self.spend_after_per_hour, 4),
                "hosts_after": self.hosts_after}


def offer_from_vast(raw: dict, on_demand_price: float | None = None) -> Offer | None:
    """A Vast search result as an offer without rates (None: it has no id or no price, so it
    cannot be rented sensibly). A result of a bid search (`is_bid`, priced at the machine's
    minimum bid) becomes an interruptible offer at the bid the planner would place."""
    try:
        offer = Offer(int(raw["id"]), raw.get("machine_id"), str(raw.get("gpu_name") or "?"),
                      int(raw.get("num_gpus") or 1), float(raw["dph_total"]), {}, False)
        if not raw.get("is_bid"):
            return offer
        minimum = float(raw["min_bid"])
        storage = offer.price_per_hour - float(raw["dph_base"])
        bid = round(minimum * BID_MARKUP, 4)
        return replace(offer, price_per_hour=bid + storage, interruptible=True,
                       on_demand_price=on_demand_price, bid=bid)
    except (KeyError, TypeError, ValueError):
        return None


def estimate_offer(offer: Offer, bench_per_gpu: list[float], *, bench_kind: str,
                   min_bench_rate: float, work: Mapping[str, float]) -> Offer | None:
    """The offer with rates estimated from the bench history of its GPU model (the median,
    per GPU, times its GPU count), else the lowest rate the benchmark gate accepts. A model
    whose history is below that gate is left out: its hosts would be destroyed at the gate.
    `work` is each kind's work relative to `bench_kind`."""
    per_gpu = sorted(bench_per_gpu)[len(bench_per_gpu) // 2] if bench_per_gpu else None
    if per_gpu is not None and per_gpu * max(offer.gpu_count, 1) < min_bench_rate:
        return None
    bench = per_gpu * max(offer.gpu_count, 1) if per_gpu is not None else min_bench_rate
    scale = work[bench_kind]
    return replace(offer, rates={k: bench * scale / w for k, w in work.items()},
                   measured=per_gpu is not None)


def hours_for(rates: Mapping[str, float], mix: Mapping[str, float]) -> float:
    """Hours one host needs for the mix alone (inf when it cannot serve a kind in it)."""
    total = 0.0
    for kind, count in mix.items():
        if count <= 0:
            continue
        rate = rates.get(kind, 0.0)
        if rate <= 0:
            return math.inf
        total += count / rate
    return total


def speed(fleet: list[Mapping[str, float]], mix: Mapping[str, float]) -> float:
    """How many times per hour the fleet clears the mix (0 when it cannot).

    Hosts that serve only part of the mix (interruptible ones, which take no PoSt) work on
    the part B they serve; the part A only the others serve goes to those first, and then
    they help with B: as fluid work, the mix is clear after T = max(a, (1 + s_tB·a) /
    (s_pB + s_tB)) hours, with a = 1/s_tA the time the full hosts need for A."""
    full = [r for r in fleet if hours_for(r, mix) < math.inf]
    partial = [r for r in fleet if hours_for(r, mix) == math.inf]
    s_full = sum(1 / h for h in (hours_for(r, mix) for r in full) if h > 0)
    shared = {k for k, n in mix.items() if n > 0 and partial and
              all(r.get(k, 0.0) > 0 for r in partial)}
    if not shared:
        return s_full
    part_b = {k: n for k, n in mix.items() if k in shared}
    part_a = {k: n for k, n in mix.items() if k not in shared and n > 0}
    s_pb = sum(1 / h for h in (hours_for(r, part_b) for r in partial) if 0 < h < math.inf)
    s_tb = sum(1 / h for h in (hours_for(r, part_b) for r in full) if 0 < h < math.inf)
    if part_a:
        s_ta = sum(1 / h for h in (hours_for(r, part_a) for r in full) if 0 < h < math.inf)
        if s_ta <= 0:
            return 0.0
        a = 1 / s_ta
    else:
        a = 0.0
    if s_pb + s_tb <= 0:
        return 0.0
    return 1 / max(a, (1 + s_tb * a) / (s_pb + s_tb))


def dollars_per_proof(price_per_hour: float, rates: Mapping[str, float],
                      mix: Mapping[str, float]) -> float:
    count = sum(mix.values())
    hours = hours_for(rates, mix)
    return price_per_hour * hours / count if count and hours < math.inf else math.inf


def forecast(work: tuple[KindWork, ...], fleet: list[Mapping[str, float]]
             ) -> tuple[KindForecast, ...]:
    by_kind = {w.kind: w for w in work}
    ahead: dict[str, float] = {}
    found = []
    for kind in SERVICE_ORDER:
        w = by_kind.get(kind)
        if w is None:
            continue
        ahead[kind] = w.unfinished
        s = speed(fleet, ahead)
        drain = 0.0 if not any(ahead.values()) else (3600 / s if s > 0 else math.inf)
        found.append(KindForecast(kind, w.unfinished, drain, w.slack_s, w.budget_s))
    return tuple(found)


def interruptible_kinds(snap: PlannerInput) -> frozenset[str]:
    """Kinds that may count on interruptible capacity: not served from warm capacity (PoSt),
    and with slack left to see a preemption and bring a replacement up."""
    cover = PREEMPTION_NOTICE_S + snap.pipeline_s
    return frozenset(w.kind for w in snap.work if w.kind not in TRUSTED_ONLY_KINDS
                     and w.budget_s * SAFETY >= URGENT_PIPELINES * snap.pipeline_s
                     and w.slack_s * SAFETY >= cover)


@dataclass
class _Fleet:
    """The planner's working view while it decides: what will be proving, what bills."""

    proving: list[Host]
    starting: list[Host]
    draining: list[Host]
    billed_elsewhere: float = 0.0
    outbid: list[Host] = field(default_factory=list)
    # Kinds an interruptible host counts for (interruptible_kinds); others see it as absent.
    bid_kinds: frozenset[str] = frozenset()

    def rates(self, host: Host) -> Mapping[str, float]:
        if not host.interruptible:
            return host.rates
        return {k: r for k, r in host.rates.items() if k in self.bid_kinds}

    def serving(self) -> list[Mapping[str, float]]:
        return [self.rates(h) for h in self.proving]

    def counted(self, without: Host | None = None) -> list[Mapping[str, float]]:
        """Capacity proving or on its way (what shortfalls are judged on)."""
        return [self.rates(h) for h in self.proving + self.starting if h is not without]

    def count(self) -> int:
        return len(self.proving) + len(self.starting) + len(self.draining) + len(self.outbid)

    def trusted(self) -> int:
        """Hosts Vast cannot take away: what the floor for PoSt counts."""
        return sum(1 for h in self.proving + self.starting + self.draining
                   if not h.interruptible)

    def spend(self) -> float:
        return self.billed_elsewhere + sum(
            h.price_per_hour for h in self.proving + self.starting + self.draining + self.outbid)


def plan(snap: PlannerInput) -> Plan:
    limits = snap.limits
    decisions: list[Decision] = []
    fleet = _Fleet([h for h in snap.hosts if h.phase == MachinePhase.PROVING],
                   [h for h in snap.hosts if h.phase == MachinePhase.STARTING],
                   [h for h in snap.hosts if h.phase == MachinePhase.DRAINING],
                   outbid=[h for h in snap.hosts if h.phase == MachinePhase.OUTBID],
                   bid_kinds=interruptible_kinds(snap),
                   billed_elsewhere=snap.billed_elsewhere_per_hour)
    spend_now = fleet.spend()
    forecasts = forecast(snap.work, fleet.serving())
    since_change = math.inf if snap.last_change_s is None else snap.now_s - snap.last_change_s
    cooling = since_change < limits.cooldown_s

    # 1. Hosts that never reached proving within the measured pipeline plus margin: their
    # provider machine failed us. Not a scaling choice, so no cool-down holds it back.
    deadline = snap.pipeline_s + limits.pipeline_margin_s
    for host in list(fleet.starting):
        if host.managed and host.age_s > deadline:
            fleet.starting.remove(host)
            decisions.append(Decision(
                Action.DESTROY, f"destroy {host.name}: not proving after "
                                f"{host.age_s / 60:.0f} min",
                ((f"rented {host.age_s / 60:.1f} min ago, still not proving; measured pipeline "
                 f"{snap.pipeline_s / 60:.1f} min + margin {limits.pipeline_margin_s / 60:.0f} "
                 "min"), "its provider machine is marked bad"),
                {"age_s": round(host.age_s), "pipeline_s": round(snap.pipeline_s),
                 "margin_s": limits.pipeline_margin_s, "price_per_hour": host.price_per_hour},
                machine_id=host.machine_id, mark_bad=True, scaling=False))

    # 2. Draining hosts whose work is done: the release decided earlier completes now.
    for host in list(fleet.draining):
        if host.in_flight == 0 and host.managed:
            fleet.draining.remove(host)
            decisions.append(Decision(
                Action.DESTROY, f"destroy {host.name}: drained",
                ("drained: no proof in flight",),
                {"price_per_hour": host.price_per_hour}, machine_id=host.machine_id,
                scaling=False))

    decisions += _outbid(snap, fleet)
    changes = _rent(snap, fleet, cooling, since_change)
    if not changes and not any(f.at_risk for f in forecasts):
        changes = _release(snap, fleet, cooling) or _cheaper_floor(snap, fleet, cooling)
    decisions += changes

    if not decisions:
        decisions.append(Decision(
            Action.KEEP, f"keep {fleet.count()} host(s)", _keep_reasons(forecasts, snap),
            {"hosts": fleet.count(), "spend_per_hour": round(spend_now, 4)}))
    return Plan(tuple(decisions), forecasts, spend_now, fleet.spend(), fleet.count())


def _keep_reasons(forecasts: tuple[KindForecast, ...], snap: PlannerInput) -> tuple[str, ...]:
    reasons = [f"{f.kind}: {f.unfinished} unfinished, drain {duration(f.drain_s)} within "
               f"{duration(f.slack_s)} left" for f in forecasts if f.unfinished]
    return tuple(reasons) or ("no work waiting",)


def _needed_speed(ahead: Mapping[str, float], w: KindWork, pipeline_s: float,
                  fleet: list[Mapping[str, float]]) -> float:
    """Extra mixes per hour new hosts must bring so the mix `ahead` is done within the time
    left (or, when the oldest proof is already beyond saving by a new host, within a whole
    budget, so the newer ones are saved), given that they prove only after `pipeline_s`."""
    now = speed(fleet, ahead)
    usable = w.slack_s * SAFETY - pipeline_s
    if usable <= 0:
        usable = w.budget_s * SAFETY - pipeline_s
    if usable <= 0:
        return 0.0  # no host rented now arrives in time: the floor of warm hosts is for this
    left = 1 - now * pipeline_s / 3600  # share of the mix still to do when new hosts arrive
    if left <= 0:
        return 0.0
    return max(left / (usable / 3600) - now, 0.0)


@dataclass(frozen=True)
class Shortfall:
    mix: Mapping[str, float]
    extra: float  # mixes per hour missing (math.inf: nothing can serve it)
    reason: str
    kind: str = ""  # the kind at risk ("": the steady arrivals of the urgent kinds)


def shortfalls(snap: PlannerInput, counted: list[Mapping[str, float]]) -> list[Shortfall]:
    """What the fleet `counted` (proving and starting hosts) lacks, most urgent kind first."""
    by_kind = {w.kind: w for w in snap.work}
    found = []
    ahead: dict[str, float] = {}
    for kind in SERVICE_ORDER:
        w = by_kind.get(kind)
        if w is None:
            continue
        ahead[kind] = w.unfinished
        if not w.unfinished:
            continue
        s = speed(counted, ahead)
        if not s and w.budget_s * SAFETY <= snap.pipeline_s:
            continue  # no rent arrives in time; the floor of warm hosts is for this kind
        extra = _needed_speed(ahead, w, snap.pipeline_s, counted) if s else math.inf
        if extra > 0:
            drain = 3600 / s if s else math.inf
            found.append(Shortfall(dict(ahead), extra, (
                f"{kind}: backlog {w.unfinished}, drain ETA {duration(drain)} > "
                f"{duration(w.slack_s * SAFETY)} usable of {duration(w.slack_s)} left "
                f"(budget {duration(w.budget_s)}, pipeline {duration(snap.pipeline_s)})"),
                kind))
    # Kinds whose budget is too short for a rented host to arrive in time: their steady flow
    # must find capacity already there. The others are planned from their backlog (a burst's
    # arrival rate says nothing about the next hour).
    arrivals = {w.kind: w.arrivals_per_h for w in snap.work if w.arrivals_per_h > 0
                and w.budget_s * SAFETY < URGENT_PIPELINES * snap.pipeline_s}
    if arrivals:
        s = speed(counted, arrivals)
        load = 1 / s if s else math.inf  # hours of fleet time per hour of arrivals
        if load > TARGET_UTILISATION:
            found.append(Shortfall(arrivals, s * (load / TARGET_UTILISATION - 1) if s
                                   else math.inf,
                                   f"arrivals keep the fleet {_percent(load)} busy > target "
                                   f"{_percent(TARGET_UTILISATION)}"))
    return found


def _rent(snap: PlannerInput, fleet: _Fleet, cooling: bool, since_change: float
          ) -> list[Decision]:
    """Resume draining hosts, then rent the cheapest offers per proof, until nothing falls
    short and the floor is met, or a limit says no."""
    limits = snap.limits
    short = shortfalls(snap, fleet.counted())
    if not short and fleet.trusted() >= limits.floor:
        return []
    reasons = tuple(s.reason for s in short) or (
        f"below the minimum of {limits.floor} host(s)",)
    decisions: list[Decision] = []
    for host in list(fleet.draining):
        if not short:
            break
        fleet.draining.remove(host)
        fleet.proving.append(host)
        decisions.append(Decision(
            Action.RESUME, f"resume {host.name}: its capacity is needed again", reasons,
            {"price_per_hour": host.price_per_hour}, machine_id=host.machine_id))
        short = shortfalls(snap, fleet.counted())
    if not short and fleet.trusted() >= limits.floor:
        return decisions
    if cooling:
        return decisions + [Decision(
            Action.KEEP, "wait: cool-down after the last change",
            (*reasons, (f"cool-down: last change {since_change:.0f} s ago < "
                       f"{limits.cooldown_s:.0f} s")),
            {"since_change_s": round(since_change), "cooldown_s": limits.cooldown_s})]
    offers = [o for o in snap.offers if o.provider_machine_id not in snap.bad_machines]
    rents_left = limits.max_rents_per_hour - snap.rents_last_hour
    refusal = "" if offers else "no offer that is not on the bad-machines list"
    while offers and (short or fleet.trusted() < limits.floor):
        mix = short[0].mix if short else {k: 1.0 for k in SERVICE_ORDER}
        # A bid helps when the kind at risk may run on interruptible capacity (the more
        # urgent kinds ahead of it stay on the hosts Vast cannot take away).
        bids_serve = limits.interruptible and bool(short) and short[0].kind in fleet.bid_kinds
        bid_mix = {k: n for k, n in mix.items() if k in fleet.bid_kinds}
        if rents_left <= 0:
            refusal = f"max {limits.max_rents_per_hour} rents per hour reached"
            break
        if fleet.count() + 1 > limits.max_hosts:
            refusal = f"max {limits.max_hosts} hosts reached"
            break
        room = limits.max_dollars_per_hour - fleet.spend()
        fitting = [o for o in offers if o.price_per_hour <= room
                   and (not o.interruptible or (bids_serve and _bid_within_cap(o, limits)))
                   and _cost(snap, o, bid_mix if o.interruptible else mix) < math.inf]
        if not fitting:
            refusal = (f"no offer fits under the cap ${limits.max_dollars_per_hour:.2f}/h "
                       f"(fleet ${fleet.spend():.3f}/h)")
            break
        # A model with bench history first: an unknown one is a gamble on the benchmark gate.
        if not short and limits.interruptible:
            # Only the floor is missing: with bids for the heavy work, the floor's own work is
            # PoSt, light and steady, so the cheapest host per hour serves it best.
            offer = min(fitting, key=lambda o: (not o.measured, o.interruptible,
                                                o.price_per_hour, o.offer_id))
        else:
            offer = min(fitting, key=lambda o: (not o.measured, _cost(
                snap, o, bid_mix if o.interruptible else mix), o.offer_id))
        # One machine is offered on demand and as a bid: renting it takes both.
        offers = [o for o in offers if o.offer_id != offer.offer_id]
        cost = _cost(snap, offer, bid_mix if offer.interruptible else mix)
        missing = short[0].extra if short else 0.0
        fleet.starting.append(Host(-offer.offer_id, f"offer {offer.offer_id}",
                                   MachinePhase.STARTING, offer.price_per_hour, offer.rates,
                                   interruptible=offer.interruptible, bid=offer.bid))
        rents_left -= 1
        source = "bench history" if offer.measured else "conservative default"
        how = (f"interruptible, bid ${offer.bid:.3f}/h" if offer.interruptible else "on demand")
        why_kind = _kind_reason(offer, fleet, bids_serve, snap)
        decisions.append(Decision(
            Action.RENT, f"rent {offer.gpu_count}× {offer.gpu_name} at "
                         f"${offer.price_per_hour:.3f}/h (offer {offer.offer_id}, {how})",
            (*reasons, why_kind,
             (f"est. ${cost:.4f}/proof ({source} of {offer.gpu_count}× "
              f"{offer.gpu_name}{', preemptions counted' if offer.interruptible else ''})")),
            {"price_per_hour": offer.price_per_hour, "est_dollars_per_proof": round(cost, 6),
             "interruptible": int(offer.interruptible),
             "pipeline_s": round(snap.pipeline_s),
             # How many more times per hour the fleet had to clear the most urgent backlog.
             "missing_clears_per_hour": "∞" if math.isinf(missing) else round(missing, 3),
             "fleet_after_per_hour": round(fleet.spend(), 4), "hosts_after": fleet.count(),
             "max_dollars_per_hour": limits.max_dollars_per_hour},
            offer_id=offer.offer_id, bid=offer.bid))
        short = shortfalls(snap, fleet.counted())
    if refusal and (short or fleet.trusted() < limits.floor):
        decisions.append(Decision(
            Action.KEEP, f"cannot rent more: {refusal}", (*reasons, refusal),
            {"hosts": fleet.count(), "spend_per_hour": round(fleet.spend(), 4),
             "max_dollars_per_hour": limits.max_dollars_per_hour,
             "max_hosts": limits.max_hosts}))
    return decisions


def _release(snap: PlannerInput, fleet: _Fleet, cooling: bool) -> list[Decision]:
    """Drain (work in flight) or destroy (idle long enough) managed proving hosts the fleet
    does not need."""
    limits = snap.limits
    keep_idle = max(limits.idle_release_s, snap.pipeline_s)
    candidates = [h for h in fleet.proving if h.managed]
    if not candidates or cooling:
        return []
    # Dearest per hour first: once the rest meets every deadline, that saves the most.
    candidates.sort(key=lambda h: (-h.price_per_hour, h.machine_id))
    decisions = []
    # With bids for the heavy work, the floor is the trusted hosts cheapest per hour: those
    # are never released, the dearer ones first.
    floor_hosts = {h.machine_id for h in sorted(
        (h for h in fleet.proving if not h.interruptible),
        key=lambda h: (h.price_per_hour, h.machine_id))[:limits.floor]
        } if limits.interruptible else set()
    for host in candidates:
        # The floor counts trusted proving hosts only: a replacement on its way proves nothing
        # yet, and Vast may take an interruptible one away.
        trusted_proving = sum(1 for h in fleet.proving if not h.interruptible)
        if not host.interruptible and (trusted_proving - 1 < limits.floor
                                       or host.machine_id in floor_hosts):
            continue
        if host.in_flight == 0 and host.idle_s < keep_idle:
            continue
        trial = fleet.counted(without=host)
        if shortfalls(snap, trial) or any(f.at_risk for f in forecast(snap.work, trial)):
            continue
        fleet.proving.remove(host)
        numbers = {"price_per_hour": host.price_per_hour, "idle_s": round(host.idle_s),
                   "in_flight": host.in_flight, "hosts_after": fleet.count()}
        saved = f"saves ${host.price_per_hour:.3f}/h"
        if host.in_flight:
            fleet.draining.append(host)
            decisions.append(Decision(
                Action.DRAIN, f"drain {host.name}: not needed once its work is done",
                (f"{host.in_flight} proof(s) in flight: no new work, destroyed when done",
                 "the rest of the fleet meets every deadline without it", saved),
                numbers, machine_id=host.machine_id))
        else:
            decisions.append(Decision(
                Action.DESTROY, f"destroy {host.name}: idle and not needed",
                (f"idle {host.idle_s / 60:.1f} min ≥ {keep_idle / 60:.1f} min",
                 "the rest of the fleet meets every deadline without it", saved),
                numbers, machine_id=host.machine_id))
    return decisions


def _cheaper_floor(snap: PlannerInput, fleet: _Fleet, cooling: bool) -> list[Decision]:
    """With no work, the fleet is its floor of warm hosts: if one of them costs more than
    SWAP_FACTOR times a measured offer that serves the same kinds, rent that one; the dear
    host is released once the new one proves. A swap costs one pipeline of the new host's
    rent, repaid within minutes by the difference."""
    limits = snap.limits
    if cooling or fleet.starting or fleet.draining or any(w.unfinished for w in snap.work):
        return []
    keep_idle = max(limits.idle_release_s, snap.pipeline_s)
    idle = [h for h in fleet.proving if h.managed and h.in_flight == 0 and h.idle_s >= keep_idle
            and not h.interruptible]
    if not idle or len(fleet.proving) > limits.floor:
        return []
    dearest = max(idle, key=lambda h: (h.price_per_hour, h.machine_id))
    kinds = {k: 1.0 for k in SERVICE_ORDER if dearest.rates.get(k, 0) > 0}
    cheaper = [o for o in snap.offers if o.measured and not o.interruptible
               and o.provider_machine_id not in snap.bad_machines
               and o.price_per_hour * SWAP_FACTOR <= dearest.price_per_hour
               and hours_for(o.rates, kinds) < math.inf
               and fleet.spend() + o.price_per_hour <= limits.max_dollars_per_hour]
    if not cheaper or fleet.count() + 1 > limits.max_hosts or \
            snap.rents_last_hour >= limits.max_rents_per_hour:
        return []
    offer = min(cheaper, key=lambda o: (o.price_per_hour, o.offer_id))
    return [Decision(
        Action.RENT, f"rent {offer.gpu_count}× {offer.gpu_name} at ${offer.price_per_hour:.3f}/h "
                     f"(offer {offer.offer_id}) to replace {dearest.name}",
        (f"no work: the fleet is its floor of {limits.floor} host(s)",
         f"{dearest.name} costs ${dearest.price_per_hour:.3f}/h ≥ {SWAP_FACTOR:g}× this offer",
         f"{dearest.name} is released once the new host proves"),
        {"price_per_hour": offer.price_per_hour, "replaces_per_hour": dearest.price_per_hour,
         "pipeline_s": round(snap.pipeline_s), "hosts_after": fleet.count() + 1,
         "max_dollars_per_hour": limits.max_dollars_per_hour},
        offer_id=offer.offer_id)]


def _bid_within_cap(offer: Offer, limits: Limits) -> bool:
    return offer.bid is not None and (offer.on_demand_price is None or offer.bid <= (
        limits.max_bid_share * offer.on_demand_price))


def _cost(snap: PlannerInput, offer: Offer, mix: Mapping[str, float]) -> float:
    """Est. $/proof; for a bid, with what preemptions cost: each one stops the host for the
    time to see it and bring a replacement up, at the measured rate per hour."""
    cost = dollars_per_proof(offer.price_per_hour, offer.rates, mix)
    if offer.interruptible:
        cost *= 1 + snap.preemptions_per_h * (PREEMPTION_NOTICE_S + snap.pipeline_s) / 3600
    return cost


def _kind_reason(offer: Offer, fleet: _Fleet, bids_serve: bool, snap: PlannerInput) -> str:
    if offer.interruptible:
        return (f"interruptible: {', '.join(sorted(fleet.bid_kinds))} have slack for a "
                f"preemption and a re-rent ({duration(PREEMPTION_NOTICE_S + snap.pipeline_s)});"
                f" measured {snap.preemptions_per_h:.2f} preemptions/h")
    if not snap.limits.interruptible:
        return "on demand: bids are off"
    if not bids_serve:
        return ("on demand: the work needs capacity Vast cannot take away (PoSt, or slack "
                "too short for a preemption and a re-rent)")
    return "on demand: cheaper per proof than any bid within the cap"


def _outbid(snap: PlannerInput, fleet: _Fleet) -> list[Decision]:
    """Each outbid host: raise its bid when the competitor's is within the cap, else rent
    elsewhere (destroy it; the rent loop replaces its capacity) when its capacity is missed
    now, else wait a while for the competitor to leave."""
    limits = snap.limits
    decisions = []
    keep_waiting = max(limits.idle_release_s, snap.pipeline_s)
    for host in list(fleet.outbid):
        cap = limits.max_bid_share * host.on_demand_price if host.on_demand_price else None
        raise_to = round(host.competitor_bid * BID_MARKUP, 4) if host.competitor_bid else None
        storage = host.price_per_hour - (host.bid or 0.0)
        numbers: dict[str, float | int | str] = {
            "bid": host.bid or 0.0, "competitor_bid": host.competitor_bid or 0.0,
            "bid_cap": round(cap, 4) if cap else "none", "outbid_s": round(host.outbid_s)}
        if raise_to is not None and cap is not None and raise_to <= cap and \
                fleet.spend() - host.price_per_hour + raise_to + storage <= \
                limits.max_dollars_per_hour:
            fleet.outbid.remove(host)
            fleet.starting.append(replace(host, phase=MachinePhase.STARTING, bid=raise_to,
                                          price_per_hour=raise_to + storage))
            decisions.append(Decision(
                Action.BID, f"raise the bid of {host.name} to ${raise_to:.3f}/h",
                (f"outbid: the machine's minimum bid is now ${host.competitor_bid:.3f}/h",
                 (f"${raise_to:.3f}/h is within the cap of ${cap:.3f}/h "
                 f"({limits.max_bid_share:g}× its on-demand ${host.on_demand_price:.3f}/h)")),
                {**numbers, "raise_to": raise_to}, machine_id=host.machine_id,
                scaling=False, bid=raise_to))
            continue
        over = ("the competitor's bid is unknown" if raise_to is None else
                f"${raise_to:.3f}/h would exceed the cap" +
                (f" of ${cap:.3f}/h" if cap is not None else " (no on-demand price known)"))
        needed = shortfalls(snap, fleet.counted())
        if host.managed and (needed or host.outbid_s >= keep_waiting):
            fleet.outbid.remove(host)
            why = (f"its capacity is needed now: {needed[0].reason}" if needed else
                   f"outbid {duration(host.outbid_s)} ≥ {duration(keep_waiting)}")
            decisions.append(Decision(
                Action.DESTROY, f"destroy {host.name}: outbid, rent elsewhere",
                (f"outbid: {over}", why), numbers, machine_id=host.machine_id,
                scaling=False))
        else:
            decisions.append(Decision(
                Action.KEEP, f"wait for {host.name}: outbid",
                (f"outbid: {over}", ("no capacity is missed without it: waiting up to "
                 f"{duration(keep_waiting)} for the competitor to leave")), numbers,
                machine_id=host.machine_id))
    return decisions


def duration(seconds: float) -> str:
    """Seconds as people read them in a reason: "45 s", "52 min", "∞"."""
    if math.isinf(seconds):
        return "∞"
    return f"{seconds / 60:.0f} min" if abs(seconds) >= 120 else f"{seconds:.0f} s"


def _percent(share: float) -> str:
    return "∞" if math.isinf(share) else f"{share * 100:.0f} %"
