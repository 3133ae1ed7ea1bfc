"""The autopilot's tick and its hands: plan, then propose (dry run) or carry out (acting alone).

Every change it carries out or proposes is an Event of kind "autopilot" with the decision's
reasons and numbers. Renting goes through `vast.rent` (a machine and its label exist before the
create call, so a rent whose answer was lost is found by label, never retried blindly);
destroying through `vast.destroy`, and only once no proof is in flight on the host (checked
again when it is carried out, not only when it was planned).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from vastmgr.autopilot import planner
from vastmgr.autopilot import planner_input as snapshot
from vastmgr.autopilot.models import EVENT_KIND, Autopilot, ManagedMachine, Proposal
from vastmgr.autopilot.planner import Action, Decision, Plan
from vastmgr.fleet.leases import controller_name
from vastmgr.fleet.ledger import Reading
from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.errors import ProvisionError, VastError
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import vast
from vastmgr.remote.models import BadMachine

log = logging.getLogger(__name__)

LEASE_S = 180.0  # a planner that stopped ticking for this long leaves the lease to another
OFFERS_SEARCHED = 64


class Pilot:
    def __init__(self, client: vast.VastClient | None, *, owner: str | None = None,
                 now: Callable[[], datetime] = timezone.now):
        self.client = client
        self.owner = owner or f"autopilot-{controller_name()}"
        self.now = now
        self.provisioning: dict[int, asyncio.Task] = {}

    async def tick(self) -> Plan | None:
        """One planning pass, where this process holds the lease and the autopilot is on."""
        now = self.now()
        if not await sync_to_async(Autopilot.claim)(self.owner, LEASE_S, now):
            return None
        pilot = await sync_to_async(Autopilot.current)()
        if pilot.mode == Autopilot.Mode.OFF:
            return None
        plan = await self._plan(pilot, now)
        if pilot.mode == Autopilot.Mode.ACT:
            for decision in plan.changes:
                # The off switch holds between two actions of one plan too.
                if await sync_to_async(_mode)() != Autopilot.Mode.ACT:
                    break
                await self.carry_out(decision, by=None)
        else:
            await sync_to_async(_propose)(plan)
        await self.provision_rented()
        return plan

    async def propose_now(self) -> Plan:
        """Plan and propose at once (a person asked for it on the page); never acts."""
        now = self.now()
        pilot = await sync_to_async(Autopilot.current)()
        plan = await self._plan(pilot, now)
        await sync_to_async(_propose)(plan)
        return plan

    async def _plan(self, pilot: Autopilot, now: datetime) -> Plan:
        raw = await self._offers()
        snap = await sync_to_async(snapshot.build)(pilot, raw, now)
        plan = planner.plan(snap)
        await sync_to_async(_store_plan)(plan, now)
        return plan

    async def _offers(self) -> list[dict]:
        if self.client is None:
            return []
        try:
            return await self.client.search_offers(vast.OfferFilter(limit=OFFERS_SEARCHED))
        except VastError as exc:
            await sync_to_async(Event.record)(
                EVENT_KIND, f"autopilot: the offer search failed, planning without offers: "
                            f"{exc}", level=Event.Level.WARNING)
            return []

    async def carry_out(self, decision: Decision, *, by: str | None) -> tuple[bool, str]:
        """Do what the decision says; every outcome, good or bad, is an explained Event."""
        try:
            outcome, machine = await self._act(decision)
            ok = True
        except (VastError, ValueError) as exc:
            outcome, machine, ok = f"failed: {exc}", None, False
        await sync_to_async(_record)(decision, ok, outcome, by, machine, self.now())
        return ok, outcome

    async def _act(self, decision: Decision) -> tuple[str, Machine | None]:
        if decision.action == Action.RENT:
            return await self._rent(decision)
        if decision.machine_id is None:
            raise ValueError(f"{decision.summary}: names no machine")
        machine = await Machine.objects.aget(pk=decision.machine_id)
        if decision.action in (Action.DRAIN, Action.RESUME):
            draining = decision.action == Action.DRAIN
            await ManagedMachine.objects.filter(machine=machine).aupdate(draining=draining)
            return ("no new work for it" if draining else "takes work again"), machine
        if decision.action == Action.DESTROY:
            if await ProofJob.objects.filter(machine=machine).in_flight().aexists():
                # Work arrived since the plan: drain instead, destroy once it is done.
                await ManagedMachine.objects.filter(machine=machine).aupdate(draining=True)
                return "work in flight: drained instead, destroyed once it is done", machine
            if self.client is None:
                raise ValueError("no Vast API key: cannot destroy")
            reason = f"autopilot: {decision.summary}"
            await vast.destroy(self.client, machine, reason)
            if decision.mark_bad and machine.vast_machine_id is not None:
                await sync_to_async(BadMachine.flag)(machine.vast_machine_id, decision.reasons[0],
                                                  machine=machine)
            return "destroyed", machine
        raise ValueError(f"nothing to carry out for {decision.action}")

    async def _rent(self, decision: Decision) -> tuple[str, Machine | None]:
        if self.client is None:
            raise ValueError("no Vast API key: cannot rent")
        assert decision.offer_id is not None
        offer = await self.client.offer(decision.offer_id, disk_gb=vast.DEFAULT_DISK_GB)
        if offer is None:
            raise VastError(f"offer {decision.offer_id} is no longer available")
        price = float(offer.get("dph_total") or 0)
        if price > float(decision.numbers.get("price_per_hour", 0)) * 1.05:
            raise VastError(f"offer {decision.offer_id} now costs ${price:.3f}/h, more than "
                            "planned: not rented")
        # A proposal may be approved long after it was made: the caps are checked again now.
        refusal = await sync_to_async(_caps_refuse)(price, self.now())
        if refusal:
            raise ValueError(refusal)
        started = self.now()
        try:
            machine = await vast.rent(self.client, vast.RentRequest.from_offer(offer))
        except VastError:
            # The create's outcome may be unknown: its machine (with its label) stays for the
            # reconcile to adopt or give up. It is the autopilot's, so count it as such.
            await sync_to_async(_adopt_unknown_rent)(decision.offer_id, offer, started)
            raise
        await ManagedMachine.objects.acreate(machine=machine, offer_id=decision.offer_id,
                                          rented_at=started)
        return f"rented as {machine.name}", machine

    async def provision_rented(self) -> None:
        """Start provisioning rented hosts whose instance is up (SSH endpoint known), once."""
        from vastmgr.remote.provision import Provisioner

        ready = await sync_to_async(_ready_to_provision)()
        for machine_id in ready:
            if machine_id in self.provisioning:
                continue

            async def run(mid: int = machine_id) -> None:
                try:
                    await Provisioner(mid).provision()
                except ProvisionError:
                    pass  # recorded by the provisioner; the stuck-host rule takes it from here
            self.provisioning[machine_id] = asyncio.create_task(run(), name=f"provision-{machine_id}")


def _mode() -> str:
    return Autopilot.current().mode


def _caps_refuse(price: float, now: datetime) -> str:
    pilot = Autopilot.current()
    money = Reading.load(now.timestamp())
    snap_hosts = snapshot.hosts(snapshot.RemoteSettings.load(), now, money)
    spend = snapshot.committed_per_hour(snap_hosts, money)
    rents = ManagedMachine.objects.filter(rented_at__gt=now - timedelta(hours=1)).count()
    if spend + price > pilot.max_dollars_per_hour:
        return (f"the fleet's ${spend:.3f}/h plus ${price:.3f}/h would pass the cap "
                f"${pilot.max_dollars_per_hour:.2f}/h")
    if len(snap_hosts) + 1 > pilot.max_hosts:
        return f"the fleet has {len(snap_hosts)} hosts; the cap is {pilot.max_hosts}"
    if rents >= pilot.max_rents_per_hour:
        return f"{rents} rents in the last hour; the cap is {pilot.max_rents_per_hour}"
    return ""


def _ready_to_provision() -> list[int]:
    return list(ManagedMachine.objects.filter(
        machine__state=Machine.State.REGISTERED, machine__provider=Machine.Provider.VAST)
        .exclude(machine__host="").values_list("machine_id", flat=True))


def _adopt_unknown_rent(offer_id: int, offer: dict, since: datetime) -> None:
    machine = (Machine.objects.filter(provider=Machine.Provider.VAST,
                                      vast_machine_id=offer.get("machine_id"),
                                      created__gte=since, autopilot__isnull=True)
               .exclude(state=Machine.State.KILLED).first())
    if machine is not None:
        ManagedMachine.objects.create(machine=machine, offer_id=offer_id, rented_at=since)


def _store_plan(plan: Plan, now: datetime) -> None:
    Autopilot.objects.filter(pk=1).update(plan=plan.to_json(), planned_at=now)


def _propose(plan: Plan) -> None:
    """Replace the open proposals with this plan's changes, unless they are the same."""
    wanted = [d.to_json() for d in plan.changes]
    with transaction.atomic():
        open_ = list(Proposal.objects.select_for_update().filter(
            status=Proposal.Status.PROPOSED).order_by("id"))
        if [_key(p.decision) for p in open_] == [_key(d) for d in wanted]:
            return
        Proposal.objects.filter(pk__in=[p.pk for p in open_]).update(
            status=Proposal.Status.SUPERSEDED, decided_at=timezone.now())
        for decision in wanted:
            Proposal.objects.create(decision=decision)
            Event.record(EVENT_KIND, f"autopilot proposes: {decision['summary']} — "
                                     f"{'; '.join(decision['reasons'])}",
                         machine=_machine_or_none(decision["machine_id"]),
                         data={"decision": decision, "mode": Autopilot.Mode.DRY_RUN})


def _key(decision: dict) -> tuple:
    return decision["action"], decision["offer_id"], decision["machine_id"]


def _machine_or_none(machine_id: int | None) -> Machine | None:
    return Machine.objects.filter(pk=machine_id).first() if machine_id else None


def _record(decision: Decision, ok: bool, outcome: str, by: str | None,
            machine: Machine | None, now: datetime) -> None:
    who = f"approved by {by}" if by else "acting alone"
    Event.record(EVENT_KIND, f"autopilot {'did' if ok else 'could not'}: {decision.summary} "
                             f"({who}) — {'; '.join(decision.reasons)} → {outcome}",
                 machine=machine or _machine_or_none(decision.machine_id),
                 level=Event.Level.INFO if ok else Event.Level.ERROR,
                 data={"decision": decision.to_json(), "ok": ok, "outcome": outcome, "by": by})
    if ok and decision.scaling:
        Autopilot.objects.filter(pk=1).update(last_change_at=now)


async def approve(proposal_id: int, user, client: vast.VastClient | None) -> Proposal | None:
    """A person's one click: carry the proposal out now (None: it was no longer open)."""
    proposal = await sync_to_async(Proposal.approve)(proposal_id, user)
    if proposal is None:
        return None
    ok, outcome = await Pilot(client).carry_out(proposal.as_decision,
                                                by=user.get_username())
    await sync_to_async(proposal.conclude)(ok, outcome)
    return proposal
