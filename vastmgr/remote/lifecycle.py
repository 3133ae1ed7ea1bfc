"""Lifecycle automation: state timeouts, the benchmark gate, idle auto-destroy, offline and
failed-job alerts. Time comes from an injectable clock so every rule is testable."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db.models import Max
from django.utils import timezone

from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import alerts, vast
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import BadMachine, MachinePerf, RemoteMachine

MANAGED = (Machine.Provider.SSH, Machine.Provider.VAST)
# A crashed engine is restarted at most this many times per window; then an operator acts.
REVIVE_TRIES = 3
REVIVE_WINDOW = timedelta(hours=1)
REVIVE_EVENT = "engine_revive"


def state_since(machine: Machine) -> datetime:
    """When the machine entered its current state: transition() records an Event every time."""
    latest = (Event.objects.filter(machine=machine, kind="lifecycle", data__to=machine.state)
              .order_by("-time").values_list("time", flat=True).first())
    return latest or machine.created


@dataclass(frozen=True)
class Verdict:
    machine_id: int
    reason: str


def overdue(settings: RemoteSettings, now: datetime) -> list[Verdict]:
    """Machines that sat in a state longer than its timeout.

    `registered` only times out for rented machines: a rented host bills from the first
    minute, while an SSH host an operator added waits for them to provision it.
    """
    verdicts = []
    for machine in Machine.objects.filter(provider__in=MANAGED,
                                          state__in=list(settings.state_timeouts_min)):
        if machine.state == Machine.State.REGISTERED and machine.provider != Machine.Provider.VAST:
            continue
        limit = settings.state_timeouts_min[machine.state]
        if limit is None:
            continue
        age = now - state_since(machine)
        if age > timedelta(minutes=limit):
            verdicts.append(Verdict(machine.pk, f"timed out in {machine.state} after "
                                                f"{age.total_seconds() / 60:.0f} min "
                                                f"(limit {limit:g} min)"))
    return verdicts


def idle(settings: RemoteSettings, now: datetime) -> list[Verdict]:
    """Running machines with no proof in flight for the configured number of minutes."""
    if not settings.auto_destroy_idle_min:
        return []
    limit = timedelta(minutes=settings.auto_destroy_idle_min)
    verdicts = []
    for machine in Machine.objects.filter(provider__in=MANAGED, state=Machine.State.RUNNING):
        jobs = ProofJob.objects.filter(machine=machine)
        if jobs.in_flight().exists():
            continue
        last_work = jobs.aggregate(last=Max("finished_at"))["last"]
        since = max(filter(None, [last_work, state_since(machine)]))
        if now - since > limit:
            verdicts.append(Verdict(machine.pk, f"idle for {settings.auto_destroy_idle_min:g} "
                                                "min (auto-destroy)"))
    return verdicts


def vast_down(settings: RemoteSettings, now: datetime) -> list[Verdict]:
    """Rented machines whose instance has been down (exited, offline...) past the grace period:
    such an instance bills for its disk and rarely recovers. Reconcile sets `vast_down_since`."""
    limit = timedelta(minutes=settings.vast_down_grace_min)
    verdicts = []
    for remote in RemoteMachine.objects.filter(
            machine__provider=Machine.Provider.VAST, vast_down_since__isnull=False).exclude(
            machine__state=Machine.State.KILLED).select_related("machine"):
        assert remote.vast_down_since is not None  # the filter above
        down_for = now - remote.vast_down_since
        minutes = down_for.total_seconds() / 60
        if down_for > limit:
            verdicts.append(Verdict(remote.machine_id, f"{remote.last_error or 'instance down'} "
                                                       f"for {minutes:.0f} min (grace "
                                                       f"{settings.vast_down_grace_min:g} min)"))
    return verdicts


def offline(settings: RemoteSettings, now: datetime) -> list[alerts.Alert]:
    """Running machines not seen for N minutes; one alert per offline spell."""
    found = []
    threshold = now - timedelta(minutes=settings.offline_alert_min)
    for machine in Machine.objects.filter(provider__in=MANAGED, state=Machine.State.RUNNING,
                                          enabled=True):
        remote = RemoteMachine.for_machine(machine)
        seen = machine.last_seen or state_since(machine)
        if seen >= threshold:
            if remote.offline_alerted_at:
                remote.offline_alerted_at = None
                remote.save(update_fields=["offline_alerted_at"])
            continue
        if remote.offline_alerted_at and remote.offline_alerted_at >= seen:
            continue
        remote.offline_alerted_at = now
        remote.save(update_fields=["offline_alerted_at"])
        minutes = (now - seen).total_seconds() / 60
        found.append(alerts.Alert("host_offline", f"{machine.name} offline for {minutes:.0f} min",
                                  machine.pk, {"minutes": round(minutes, 1)}))
    return found


def engines_to_revive(now: datetime) -> list[tuple[int, int]]:
    """Running machines whose engine the controller cannot reach while SSH works, with the
    number of restarts tried in the window. SSH failures are left out: their messages start
    with the machine's name (see ssh.py), and restarting cannot fix them."""
    found = []
    for machine in Machine.objects.filter(provider__in=MANAGED, state=Machine.State.RUNNING,
                                          enabled=True, live__connected=False):
        if machine.live.error.startswith(f"{machine.name}: "):
            continue
        tries = Event.objects.filter(machine=machine, kind=REVIVE_EVENT,
                                     time__gte=now - REVIVE_WINDOW).count()
        if tries < REVIVE_TRIES:
            found.append((machine.pk, tries))
    return found


def failed_jobs(since: datetime, until: datetime) -> list[alerts.Alert]:
    jobs = ProofJob.objects.filter(status=ProofJob.Status.FAILED, finished_at__gt=since,
                                   finished_at__lte=until).select_related("machine")
    return [alerts.Alert("job_failed", f"{job.kind} proof {job.id} failed on "
                                       f"{job.machine or 'no machine'}: {job.error[:200]}",
                         job.machine_id, {"job": str(job.id)}) for job in jobs]


def judge_benchmark(machine: Machine, rate: float, settings: RemoteSettings
                    ) -> alerts.Alert | None:
    """Record a benchmark; below the minimum rate the host goes on the bad-machines list.

    Returns the bad-benchmark alert (the caller kills or destroys the machine), else moves the
    machine to `benchmarked` and returns None.
    """
    machine.bench_rate = rate
    machine.save(update_fields=["bench_rate", "updated"])
    if machine.gpu_name:
        MachinePerf.record(provider_machine_id=machine.vast_machine_id, gpu_name=machine.gpu_name,
                        gpu_count=machine.gpu_count, rate=rate)
    remote = RemoteMachine.objects.filter(machine=machine).first()
    # A rent may have asked for more (or less) than the configured minimum.
    minimum = remote.min_bench_rate if remote and remote.min_bench_rate else \
        settings.min_bench_rate
    if rate >= minimum:
        machine.transition(Machine.State.BENCHMARKED)
        return None
    reason = f"benchmark {rate:.1f} proofs/h is below the minimum {minimum:g}"
    if machine.vast_machine_id is not None:
        BadMachine.flag(machine.vast_machine_id, reason, machine=machine)
    return alerts.Alert("bad_benchmark", f"{machine.name}: {reason}", machine.pk,
                        {"rate": rate, "minimum": minimum})


class Automation:
    """One pass of the rules per tick; vast machines are destroyed, others only killed."""

    def __init__(self, settings: RemoteSettings | None = None, *,
                 now: Callable[[], datetime] = timezone.now,
                 vast_client: vast.VastClient | None = None):
        self.settings = settings or RemoteSettings.load()
        self.now = now
        self.vast_client = vast_client
        self._jobs_checked_until = now()

    async def tick(self) -> None:
        now = self.now()
        verdicts = await sync_to_async(overdue)(self.settings, now)
        verdicts += await sync_to_async(idle)(self.settings, now)
        verdicts += await sync_to_async(vast_down)(self.settings, now)
        for verdict in verdicts:
            await self.retire(verdict.machine_id, verdict.reason)
        found = await sync_to_async(offline)(self.settings, now)
        found += await sync_to_async(failed_jobs)(self._jobs_checked_until, now)
        self._jobs_checked_until = now
        for alert in found:
            await alerts.send(alert, self.settings.alert_webhook_url)

    async def benchmark_done(self, machine_id: int, rate: float) -> bool:
        """Apply the benchmark gate; True when the machine passed."""
        machine = await Machine.objects.aget(pk=machine_id)
        alert = await sync_to_async(judge_benchmark)(machine, rate, self.settings)
        if alert is None:
            return True
        await alerts.send(alert, self.settings.alert_webhook_url)
        await self.retire(machine_id, alert.message.split(": ", 1)[1])
        return False

    async def retire(self, machine_id: int, reason: str) -> None:
        machine = await Machine.objects.aget(pk=machine_id)
        if machine.state == Machine.State.KILLED:
            return
        if machine.provider == Machine.Provider.VAST and self.vast_client is not None:
            await vast.destroy(self.vast_client, machine, reason)
            return
        await sync_to_async(_kill)(machine, reason)


def _kill(machine: Machine, reason: str) -> None:
    vast.end_billing(machine)
    machine.kill(reason)
