"""The autopilot's planner: a pure function from a snapshot of the fleet to decisions.

It knows nothing of Django, Vast or clocks: the product builds a `Snapshot` from the database
(snapshot.py) and the simulation (sim.py) builds one from its virtual world, and both call
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
from dataclasses import dataclass, field
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


class Action(StrEnum):
    RENT = "rent"
    KEEP = "keep"
    DRAIN = "drain"
    RESUME = "resume"  # a draining host is needed again
    DESTROY = "destroy"


class MachinePhase(StrEnum):
    STARTING = "starting"  # rented, on its way through boot, install, parameters, benchmark
    PROVING = "proving"
    DRAINING = "draining"  # takes no new work; destroyed once its work in flight is done


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


@dataclass(frozen=True)
class Offer:
    offer_id: int
    provider_machine_id: int | None
    gpu_name: str
    gpu_count: int
    price_per_hour: float
    rates: Mapping[str, float]
    measured: bool  # rates from bench history of this GPU model, else the conservative default


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

    @property
    def floor(self) -> int:
        floor = max(self.min_hosts.values(), default=0)
        return floor if floor or self.scale_to_zero else 1


@dataclass(frozen=True)
class Snapshot:
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

    def to_json(self) -> dict:
        return {"action": str(self.action), "summary": self.summary,
                "reasons": list(self.reasons), "numbers": dict(self.numbers),
                "offer_id": self.offer_id, "machine_id": self.machine_id,
                "mark_bad": self.mark_bad, "scaling": self.scaling}

    @classmethod
    def from_json(cls, data: dict) -> Decision:
        return cls(Action(data["action"]), data["summary"], tuple(data["reasons"]),
                   data["numbers"], data.get("offer_id"), data.get("machine_id"),
                   bool(data.get("mark_bad")), bool(data.get("scaling", True)))


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


def offer_from_vast(raw: dict) -> Offer | None:
    """A Vast search result as an offer without rates (None: it has no id or no price, so it
    cannot be rented sensibly)."""
    try:
        return Offer(int(raw["id"]), raw.get("machine_id"), str(raw.get("gpu_name") or "?"),
                     int(raw.get("num_gpus") or 1), float(raw["dph_total"]), {}, False)
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
    return Offer(offer.offer_id, offer.provider_machine_id, offer.gpu_name, offer.gpu_count,
                 offer.price_per_hour, {k: bench * scale / w for k, w in work.items()},
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
    """How many times per hour the fleet clears the mix (0 when it cannot)."""
    return sum(1 / h for h in (hours_for(r, mix) for r in fleet) if 0 < h < math.inf)


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


@dataclass
class _Fleet:
    """The planner's working view while it decides: what will be proving, what bills."""

    proving: list[Host]
    starting: list[Host]
    draining: list[Host]
    billed_elsewhere: float = 0.0

    def serving(self) -> list[Mapping[str, float]]:
        return [h.rates for h in self.proving]

    def count(self) -> int:
        return len(self.proving) + len(self.starting) + len(self.draining)

    def spend(self) -> float:
        return self.billed_elsewhere + sum(
            h.price_per_hour for h in self.proving + self.starting + self.draining)


def plan(snap: Snapshot) -> Plan:
    limits = snap.limits
    decisions: list[Decision] = []
    fleet = _Fleet([h for h in snap.hosts if h.phase == MachinePhase.PROVING],
                   [h for h in snap.hosts if h.phase == MachinePhase.STARTING],
                   [h for h in snap.hosts if h.phase == MachinePhase.DRAINING],
                   snap.billed_elsewhere_per_hour)
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

    changes = _rent(snap, fleet, cooling, since_change)
    if not changes and not any(f.at_risk for f in forecasts):
        changes = _release(snap, fleet, cooling) or _cheaper_floor(snap, fleet, cooling)
    decisions += changes

    if not decisions:
        decisions.append(Decision(
            Action.KEEP, f"keep {fleet.count()} host(s)", _keep_reasons(forecasts, snap),
            {"hosts": fleet.count(), "spend_per_hour": round(spend_now, 4)}))
    return Plan(tuple(decisions), forecasts, spend_now, fleet.spend(), fleet.count())


def _keep_reasons(forecasts: tuple[KindForecast, ...], snap: Snapshot) -> tuple[str, ...]:
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


def shortfalls(snap: Snapshot, counted: list[Mapping[str, float]]) -> list[Shortfall]:
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
                f"(budget {duration(w.budget_s)}, pipeline {duration(snap.pipeline_s)})")))
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


def _rent(snap: Snapshot, fleet: _Fleet, cooling: bool, since_change: float
          ) -> list[Decision]:
    """Resume draining hosts, then rent the cheapest offers per proof, until nothing falls
    short and the floor is met, or a limit says no."""
    limits = snap.limits
    short = shortfalls(snap, fleet.serving() + [h.rates for h in fleet.starting])
    if not short and fleet.count() >= limits.floor:
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
        short = shortfalls(snap, fleet.serving() + [h.rates for h in fleet.starting])
    if not short and fleet.count() >= limits.floor:
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
    while offers and (short or fleet.count() < limits.floor):
        mix = short[0].mix if short else {k: 1.0 for k in SERVICE_ORDER}
        if rents_left <= 0:
            refusal = f"max {limits.max_rents_per_hour} rents per hour reached"
            break
        if fleet.count() + 1 > limits.max_hosts:
            refusal = f"max {limits.max_hosts} hosts reached"
            break
        room = limits.max_dollars_per_hour - fleet.spend()
        fitting = [o for o in offers if o.price_per_hour <= room
                   and dollars_per_proof(o.price_per_hour, o.rates, mix) < math.inf]
        if not fitting:
            refusal = (f"no offer fits under the cap ${limits.max_dollars_per_hour:.2f}/h "
                       f"(fleet ${fleet.spend():.3f}/h)")
            break
        # A model with bench history first: an unknown one is a gamble on the benchmark gate.
        offer = min(fitting, key=lambda o: (not o.measured,
                                            dollars_per_proof(o.price_per_hour, o.rates, mix),
                                            o.offer_id))
        offers.remove(offer)
        cost = dollars_per_proof(offer.price_per_hour, offer.rates, mix)
        missing = short[0].extra if short else 0.0
        fleet.starting.append(Host(-offer.offer_id, f"offer {offer.offer_id}",
                                   MachinePhase.STARTING, offer.price_per_hour, offer.rates))
        rents_left -= 1
        source = "bench history" if offer.measured else "conservative default"
        decisions.append(Decision(
            Action.RENT, f"rent {offer.gpu_count}× {offer.gpu_name} at "
                         f"${offer.price_per_hour:.3f}/h (offer {offer.offer_id})",
            (*reasons, (f"est. ${cost:.4f}/proof ({source} of {offer.gpu_count}× "
                       f"{offer.gpu_name})")),
            {"price_per_hour": offer.price_per_hour, "est_dollars_per_proof": round(cost, 6),
             "pipeline_s": round(snap.pipeline_s),
             # How many more times per hour the fleet had to clear the most urgent backlog.
             "missing_clears_per_hour": "∞" if math.isinf(missing) else round(missing, 3),
             "fleet_after_per_hour": round(fleet.spend(), 4), "hosts_after": fleet.count(),
             "max_dollars_per_hour": limits.max_dollars_per_hour},
            offer_id=offer.offer_id))
        short = shortfalls(snap, fleet.serving() + [h.rates for h in fleet.starting])
    if refusal and (short or fleet.count() < limits.floor):
        decisions.append(Decision(
            Action.KEEP, f"cannot rent more: {refusal}", (*reasons, refusal),
            {"hosts": fleet.count(), "spend_per_hour": round(fleet.spend(), 4),
             "max_dollars_per_hour": limits.max_dollars_per_hour,
             "max_hosts": limits.max_hosts}))
    return decisions


def _release(snap: Snapshot, fleet: _Fleet, cooling: bool) -> list[Decision]:
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
    for host in candidates:
        # The floor counts proving hosts only: a replacement on its way proves nothing yet.
        if len(fleet.proving) - 1 < limits.floor:
            break
        if host.in_flight == 0 and host.idle_s < keep_idle:
            continue
        trial = [h.rates for h in fleet.proving if h is not host] + \
            [h.rates for h in fleet.starting]
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


def _cheaper_floor(snap: Snapshot, fleet: _Fleet, cooling: bool) -> list[Decision]:
    """With no work, the fleet is its floor of warm hosts: if one of them costs more than
    SWAP_FACTOR times a measured offer that serves the same kinds, rent that one; the dear
    host is released once the new one proves. A swap costs one pipeline of the new host's
    rent, repaid within minutes by the difference."""
    limits = snap.limits
    if cooling or fleet.starting or fleet.draining or any(w.unfinished for w in snap.work):
        return []
    keep_idle = max(limits.idle_release_s, snap.pipeline_s)
    idle = [h for h in fleet.proving if h.managed and h.in_flight == 0 and h.idle_s >= keep_idle]
    if not idle or len(fleet.proving) > limits.floor:
        return []
    dearest = max(idle, key=lambda h: (h.price_per_hour, h.machine_id))
    kinds = {k: 1.0 for k in SERVICE_ORDER if dearest.rates.get(k, 0) > 0}
    cheaper = [o for o in snap.offers if o.measured and o.provider_machine_id not in snap.bad_machines
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


def duration(seconds: float) -> str:
    """Seconds as people read them in a reason: "45 s", "52 min", "∞"."""
    if math.isinf(seconds):
        return "∞"
    return f"{seconds / 60:.0f} min" if abs(seconds) >= 120 else f"{seconds:.0f} s"


def _percent(share: float) -> str:
    return "∞" if math.isinf(share) else f"{share * 100:.0f} %"
