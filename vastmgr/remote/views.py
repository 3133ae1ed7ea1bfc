
from decimal import Decimal

import asyncssh
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib import messages
from django.contrib.auth.models import User
from django.db import transaction
from django.http import (
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseForbidden,
    HttpResponseNotFound,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from vastmgr.fleet import ledger
from vastmgr.fleet.models import BillingInterval, Event, Machine
from vastmgr.lib.errors import ProvisionError, SecretUnavailable, SSHError
from vastmgr.lib.http import AuthenticatedHttpRequest, staff_only
from vastmgr.remote import ssh_loop as background
from vastmgr.remote import vast
from vastmgr.remote.actions import ACTIONS, LAUNCHED, offered, why_not
from vastmgr.remote.config import RemoteSettings, parse_env
from vastmgr.remote.forms import (
    MAX_BULK_RENT,
    AddMachineForm,
    ApiKeyForm,
    BadMachineForm,
    BulkIgnoreForm,
    CommandForm,
    OfferSearchForm,
    RentForm,
    masked_env,
    min_bench_rate,
)
from vastmgr.remote.models import (
    BadMachine,
    ProviderCall,
    RemoteMachine,
    RentPreference,
    Secret,
    VastSync,
)
from vastmgr.remote.provision import Provisioner, run_on_machines
from vastmgr.remote.tunnel import has_engine

# A page waits this long for a host, connecting included; then it says so.
LOG_TIMEOUT_S = 10
TEST_TIMEOUT_S = 30
LOG_POLL_S = 5
COMMAND_OUTPUT_LINES = 200
# Destroying gives running proofs this long to finish before the engine is killed, and waits
# this long in all for the host to confirm the engine is gone.
DESTROY_GRACE_S = 10
ENGINE_STOP_TIMEOUT_S = 90

PROVIDER_LOG_ROWS = 500  # the newest calls shown: about four hours of routine listings


@staff_only
def add_machine(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = AddMachineForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        machine = add_ssh_machine(form.cleaned_data, request.user)
        if request.POST.get("then") == "test":
            _test_connection(request, machine)
        return redirect("remote:machine", machine.pk)
    return render(request, "remote/add_machine.html", {"form": form})


def add_ssh_machine(data: dict, user: User) -> Machine:
    """The machine and its remote row from AddMachineForm's cleaned data (the page and the API)."""
    with transaction.atomic():
        # A destroyed machine keeps its rows and history under a name of its own.
        for old in Machine.objects.filter(name=data["name"], state=Machine.State.KILLED):
            old.name = f"{old.name[:Machine.NAME_MAX_LENGTH - 24]}~destroyed-{old.pk}"
            old.save(update_fields=["name", "updated"])
        machine = Machine.objects.create(
            name=data["name"], provider=Machine.Provider.SSH, host=data["host"],
            ssh_port=data["ssh_port"], ssh_user=data["ssh_user"],
            engine_port=data["engine_port"], price_per_hour=data["price_per_hour"],
            engine_flavour=data["engine_flavour"], engine_url=data.get("engine_url", ""))
        remote = RemoteMachine.objects.create(machine=machine, key_file=data["key_file"].strip(),
                                           billing_started=machine.created)
        if machine.price_per_hour is not None:
            ledger.bill(machine, BillingInterval.Kind.RUNNING, machine.price_per_hour,
                        gpus=machine.gpu_count, cause="added", at=machine.created)
        if data["private_key"].strip():
            Secret.store(remote.ssh_key_secret_name, data["private_key"])
        Event.record("remote", f"{machine.name}: SSH host added by {user.get_username()}",
                     machine=machine)
        if machine.is_upstream:
            # Its daemon is already running; there is nothing of ours to provision.
            machine.transition(Machine.State.RUNNING, reason="upstream cuzk daemon, watched",
                               user=user)
    return machine


def _test_connection(request: AuthenticatedHttpRequest, machine: Machine) -> None:
    """Reach the host now (pinning its key on first contact) and check its requirements; the
    outcome is a message on the next page and an Event, the machine saved either way."""
    link = background.pool.get(machine.pk)
    link.retry_now()  # the operator asked for this host now
    try:
        found = background.run(lambda: _provisioner(machine.pk).test_connection(),
                               TEST_TIMEOUT_S)
    except (ProvisionError, SSHError, SecretUnavailable) as exc:
        messages.error(request, f"Connection test failed: {exc}. The host is saved: fix it "
                                "and press Test connection again.")
    except TimeoutError as exc:
        messages.error(request, f"Connection test: {machine.name} gave {exc}. The host is "
                                "saved: press Test connection to try again.")
    else:
        messages.info(request, f"Connection test passed: {found}. Next: Provision.")


def machine_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    machine = get_object_or_404(Machine, pk=pk)
    remote = RemoteMachine.for_machine(machine)
    return render(request, "remote/machine.html", {
        "machine": machine, "remote": remote, "money": ledger.machine_money(machine.pk),
        "events": machine.events.all()[:100], "actions": offered(machine),
        "log": _log_state(machine),
    })


def provider_log(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Every call to the provider's API, newest first (the Events page says what happened)."""
    calls = ProviderCall.objects.select_related("machine")[:PROVIDER_LOG_ROWS]
    return render(request, "remote/provider_log.html",
                  {"calls": calls, "rows": PROVIDER_LOG_ROWS, "keep_days": ProviderCall.KEEP.days})


def machine_events(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    machine = get_object_or_404(Machine, pk=pk)
    return render(request, "remote/_events.html", {"events": machine.events.all()[:100]})


def _log_state(machine: Machine) -> dict:
    """The engine log panel before its first poll: what it waits for, or why there is none."""
    if not has_engine(machine):
        return {"text": "no engine log yet: the host has not been provisioned", "poll_s": None}
    return {"text": "…", "poll_s": 0}


@staff_only
def machine_log(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """The engine log's tail over the machine's pooled SSH connection (no login per poll). The
    panel polls again in 5 s, or, while the host cannot be reached, when the link will next
    try it: a dead host is not asked every 5 s."""
    machine = get_object_or_404(Machine, pk=pk)
    if machine.provider == Machine.Provider.LOCAL:
        return HttpResponseNotFound(f"{machine.name} is a local engine without SSH: its log is "
                                    "in the terminal that runs it.",
                                    content_type="text/plain; charset=utf-8")
    log = _log_state(machine)
    if log["poll_s"] is not None:
        link = background.pool.get(machine.pk)
        try:
            log["text"] = background.run(lambda: _provisioner(machine.pk).log_tail(200),
                                         LOG_TIMEOUT_S)
            log["poll_s"] = LOG_POLL_S
        except (SSHError, SecretUnavailable, TimeoutError) as exc:
            log["text"] = f"log unavailable: {exc}"
            log["poll_s"] = max(LOG_POLL_S, round(link.waiting()))
    return render(request, "remote/_engine_log.html", {"machine": machine, "log": log})


def _provisioner(machine_id: int) -> Provisioner:
    return Provisioner(machine_id, link=background.pool.get(machine_id))


@staff_only
@require_POST
def machine_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    machine = get_object_or_404(Machine, pk=pk)
    user = request.user.get_username()
    if action == "destroy" and (refused := machine.destroy_refusal()):
        # A stale page or a hand-made post: refused, never a kill of what cannot be destroyed.
        return HttpResponse(f"Not destroyed: {refused}.", status=409,
                            content_type="text/plain; charset=utf-8")
    refusal = why_not(machine, action) if action in ACTIONS else ""
    if machine.provider == Machine.Provider.LOCAL and (action in ACTIONS or action == "clear-host-key"):
        messages.error(request, f"{machine.name} is a local engine without SSH: there is "
                                f"nothing to {action.replace('-', ' ')} over SSH.")
    elif action == "clear-host-key":
        machine.ssh_host_key = ""
        machine.save(update_fields=["ssh_host_key", "updated"])
        try:  # the next connection pins whatever key the host presents
            background.run(lambda: background.pool.drop(machine.pk), LOG_TIMEOUT_S)
        except TimeoutError:
            pass  # the old connection is still closing; the next one is new either way
        Event.record("ssh_host_key", f"{machine.name}: pinned host key cleared by {user}",
                     machine=machine, level=Event.Level.WARNING)
    elif action == "destroy":
        try:
            destroy(machine, f"destroyed by {user}")
        except (vast.VastError, SecretUnavailable) as exc:
            messages.error(request, str(exc))
    elif refusal:
        messages.error(request, f"{machine.name}: cannot {action} ({refusal})")
    elif action == "test":
        _test_connection(request, machine)
    elif action in LAUNCHED:
        launch_action(machine, action, user)
        messages.info(request, f"{action} started; progress appears in the events below")
    else:
        messages.error(request, f"unknown action {action!r}")
    # The fleet page's destroy dialog returns there.
    return _back(request, reverse("remote:machine", args=[machine.pk]))


def launch_action(machine: Machine, action: str, user: str) -> None:
    """Start one of LAUNCHED in the background; its progress and outcome are Events."""
    Event.record("remote", f"{machine.name}: {action} requested by {user}", machine=machine)
    background.pool.get(machine.pk).retry_now()  # the operator asked for this host now

    async def run() -> None:
        try:
            await getattr(_provisioner(machine.pk), ACTIONS[action])()
        except ProvisionError as exc:
            if not exc.recorded:
                await sync_to_async(Event.record)(
                    "remote", f"{machine.name}: {action} failed at {exc}", machine=machine,
                    level=Event.Level.ERROR)
        except SSHError:
            pass  # the link recorded it as an Event
    background.launch(f"{action} {machine.name}", run, machine=machine)


def destroy(machine: Machine, reason: str) -> None:
    if machine.provider == Machine.Provider.VAST:
        async_to_sync(vast.destroy)(vast.VastClient.from_settings(), machine, reason)
    elif machine.state != Machine.State.KILLED:
        if machine.provider == Machine.Provider.SSH and machine.engine_token:
            _stop_engine(machine)
        vast.end_billing(machine)
        machine.kill(reason)


def _stop_engine(machine: Machine) -> None:
    """An SSH host outlives its machine row: stop the engine provisioning started there (a
    token means it was configured), or say in an Event why it may still run."""
    try:
        background.run(lambda: _stop_remote_engine(machine.pk), ENGINE_STOP_TIMEOUT_S)
    except (SSHError, ProvisionError, SecretUnavailable, asyncssh.Error, OSError,
            TimeoutError) as exc:
        Event.record("remote", f"{machine.name}: the engine could not be stopped "
                               f"({exc or type(exc).__name__}); it may still run on the host",
                     machine=machine, level=Event.Level.WARNING)


async def _stop_remote_engine(machine_id: int) -> None:
    try:
        await _provisioner(machine_id).stop_engine(DESTROY_GRACE_S)
    finally:
        await background.pool.drop(machine_id)


@staff_only
def run_command(request: AuthenticatedHttpRequest) -> HttpResponse:
    """A command on the chosen hosts at once: exit status and the output's tail per host (or
    why it could not run), one audit Event; the page answers within the chosen timeout."""
    form = CommandForm(request.POST or None)
    results = []
    if request.method == "POST" and form.is_valid():
        machines = list(form.cleaned_data["machines"])
        output: dict[int, list[str]] = {m.pk: [] for m in machines}

        async def on_line(machine_id: int, line: str) -> None:
            output[machine_id].append(line)
            del output[machine_id][:-COMMAND_OUTPUT_LINES]
        timeout = form.cleaned_data["timeout"]
        try:
            statuses = background.run(lambda: run_on_machines(
                [m.pk for m in machines], form.cleaned_data["command"],
                user=request.user.get_username(), on_line=on_line, pool=background.pool,
                timeout=timeout), timeout + 10)  # each host's own bound, then the audit Event
        except TimeoutError as exc:
            statuses = {}
            messages.error(request, f"the hosts gave {exc}; their output so far is below")
        results = [(m, statuses.get(m.pk), "\n".join(output[m.pk])) for m in machines]
    return render(request, "remote/command.html", {"form": form, "results": results})


def offers(request: AuthenticatedHttpRequest) -> HttpResponse:
    key_form = ApiKeyForm()
    search = OfferSearchForm(request.GET or None)
    results, error = [], ""
    rent = rent_defaults(request.user)
    if search.is_bound and search.is_valid():
        try:
            client = vast.VastClient.from_settings()
            # Priced with the disk this user rents with: the $/h shown is what is charged.
            found = async_to_sync(client.search_offers)(search.offer_filter(rent["disk_gb"]))
            results = vast.annotate_offers(found)
        except (vast.VastError, SecretUnavailable) as exc:
            error = str(exc)
    # The dialog rents as the offers were searched: a bid search opens it on a bid.
    rent["offer_type"] = (search.cleaned_data.get("offer_type") if search.is_bound and
                          search.is_valid() else "") or vast.ON_DEMAND
    hidden = 0
    if search.is_bound and search.is_valid() and search.cleaned_data["hide_bad"]:
        shown = [o for o in results if not o["bad_host"]]
        hidden, results = len(results) - len(shown), shown
    return render(request, "remote/offers.html", {
        "key_form": key_form, "key_set": Secret.is_set(Secret.VAST_API_KEY),
        "search": search, "offers": results, "hidden_bad": hidden, "error": error,
        "has_estimates": any(o["proofs_per_hour"] for o in results),
        "rent": rent, "max_rent": MAX_BULK_RENT, "vast_age": VastSync.age_s(),
        "vast_stale_after": VastSync.STALE_AFTER_S,
    }, status=400 if search.is_bound and not search.is_valid() else 200)


def rent_defaults(user: User) -> dict:
    """The rent dialog's starting values: this user's last choice, else vast-manager's. The
    env's values are secrets: the dialog gets their names only."""
    saved = RentPreference.objects.filter(user=user).first()
    price = saved.max_price_per_proof if saved else RentForm.DEFAULT_MAX_PRICE_PER_PROOF
    configured = RemoteSettings.load()
    env_error = ""
    try:
        env = upstream_env(saved)
    except SecretUnavailable as exc:
        env, env_error = {}, str(exc)
    return {"max_price_per_proof": price.normalize(),  # 0.004, not 0.00400
            "disk_gb": saved.disk_gb if saved else vast.DEFAULT_DISK_GB,
            "engine_flavour": saved.engine_flavour if saved else Machine.Flavour.CUZK_ENGINE,
            # An upstream worker's image, env and onstart: the user's last, else the settings'.
            "image": saved.image if saved and saved.image else configured.upstream_image,
            "env": masked_env(env), "env_error": env_error,
            "onstart": saved.onstart if saved and saved.image else configured.upstream_onstart}


def upstream_env(saved: RentPreference | None) -> dict[str, str]:
    """The env the rent dialog starts from: the user's last upstream rental's (`saved`), else
    the settings'. SecretUnavailable when the stored one cannot be decrypted."""
    if saved and saved.image:
        return saved.env()
    return parse_env(RemoteSettings.load().upstream_env)


@staff_only
@require_POST
def set_api_key(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST)
    if form.is_valid():
        Secret.store(Secret.VAST_API_KEY, form.cleaned_data["api_key"])
        Event.record("vast", f"Vast API key replaced by {request.user.get_username()}")
        messages.info(request, "API key stored (encrypted); it will not be shown again")
    else:
        messages.error(request, f"API key not stored: {form.error_message()}")
    return redirect("remote:offers")


@staff_only
@require_POST
def rent_offers(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Rent one or several offers from the rent dialog, on demand or interruptibly at one bid:
    each machine must then benchmark at least ceil($/h ÷ max $/proof) proofs/h. Every offer
    is priced first; a bid an offer refuses (below its minimum, at or above its on-demand
    price) is a 400 and nothing is rented. The dialog's values are remembered for the user."""
    try:
        kept = upstream_env(RentPreference.objects.filter(user=request.user).first())
    except SecretUnavailable:
        kept = {}  # a masked line then asks for its value again
    form = RentForm(request.POST, kept_env=kept)
    if not form.is_valid():
        return _not_rented(form.error_message())
    data = form.cleaned_data
    bid = float(data["bid_price"]) if data["bid_price"] is not None else None
    priced, failed, refused = {}, [], []
    for offer_id in data["offer_ids"]:
        try:
            priced[offer_id] = priced_offer(offer_id, data["disk_gb"], bid)
        except BidRefused as exc:
            refused.append(f"offer {offer_id}: {exc}")
        except (vast.VastError, SecretUnavailable) as exc:
            failed.append(f"offer {offer_id}: {exc}")
    if refused:
        return _not_rented("; ".join(refused))
    with transaction.atomic():
        preference, _ = RentPreference.objects.update_or_create(user=request.user, defaults={
            "max_price_per_proof": data["max_price_per_proof"], "disk_gb": data["disk_gb"],
            "engine_flavour": data["engine_flavour"], "image": data["image"],
            "onstart": data["onstart"]})
        preference.set_env(data["env"])
    rented = []
    for offer_id, offer in priced.items():
        try:
            rented.append(rent_priced(offer, data["disk_gb"], form.deployment(), bid=bid,
                                      max_price_per_proof=data["max_price_per_proof"]))
        except (vast.VastError, SecretUnavailable) as exc:
            failed.append(f"offer {offer_id}: {exc}")
    for problem in failed:
        messages.error(request, problem)
    for machine in rented:
        how = f" interruptibly at a bid of ${bid:.4f}/h" if bid is not None else ""
        messages.info(request, f"rented {machine.name}{how}: it must benchmark at least "
                               f"{machine.remote.min_bench_rate} proofs/h")
    if len(rented) == 1 and len(data["offer_ids"]) == 1:
        return redirect("remote:machine", rented[0].pk)
    return redirect("fleet" if rented else "remote:offers")


def _not_rented(reason: str) -> HttpResponse:
    return HttpResponseBadRequest(f"Not rented: {reason}",
                                  content_type="text/plain; charset=utf-8")


class BidRefused(vast.VastError):
    """A bid the offer does not take (vast.bid_refusal says why): the operator's input."""


def priced_offer(offer_id: int, disk_gb: int, bid: float | None = None) -> dict:
    """The offer by id (any offer in the market, not only those shown), priced with the disk
    the rent asks for, and at `bid` when it is rented interruptibly."""
    client = vast.VastClient.from_settings()
    offer = async_to_sync(client.offer)(offer_id, disk_gb=disk_gb)
    if offer is None:
        raise vast.VastError(f"offer {offer_id} is no longer available")
    if offer.get("dph_total") is None:
        raise vast.VastError(f"offer {offer_id} has no price: not rented")
    if bid is None:
        return offer
    as_bid = async_to_sync(client.offer)(offer_id, disk_gb=disk_gb,
                                         offer_type=vast.INTERRUPTIBLE)
    if refusal := vast.bid_refusal(bid, offer, as_bid):
        raise BidRefused(refusal)
    return vast.priced_at_bid(offer, bid)


def rent_offer(offer_id: int, disk_gb: int, deployment: vast.Deployment, *,
               max_price_per_proof: Decimal | None = None, min_rate: int | None = None
               ) -> Machine:
    """Rent one offer on demand by id; its machine must benchmark `min_rate` proofs/h, else
    ceil($/h ÷ max $/proof)."""
    return rent_priced(priced_offer(offer_id, disk_gb), disk_gb, deployment,
                       max_price_per_proof=max_price_per_proof, min_rate=min_rate)


def rent_priced(offer: dict, disk_gb: int, deployment: vast.Deployment, *,
                bid: float | None = None, max_price_per_proof: Decimal | None = None,
                min_rate: int | None = None) -> Machine:
    """Rent an offer as `priced_offer` priced it (interruptibly when `bid` is given)."""
    request = vast.RentRequest.from_offer(
        offer, disk_gb=disk_gb, deployment=deployment, bid_price=bid,
        min_bench_rate=min_rate or min_bench_rate(
            offer["dph_total"], max_price_per_proof or RentForm.DEFAULT_MAX_PRICE_PER_PROOF))
    return async_to_sync(vast.rent)(vast.VastClient.from_settings(), request)


def bad_machines(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The bad-machines list; staff add (POST) with a reason."""
    form = BadMachineForm(request.POST or None)
    if request.method == "POST":
        if not request.user.is_staff:
            return HttpResponseForbidden("Only staff can mark hosts bad.",
                                         content_type="text/plain; charset=utf-8")
        if form.is_valid():
            data = form.cleaned_data
            BadMachine.flag(data["provider_machine_id"],
                         f"{data['reason']} (by {request.user.get_username()})")
            messages.info(request, f"Vast machine {data['provider_machine_id']} marked bad: "
                                   "its offers are refused")
            return redirect("remote:bad_machines")
    return render(request, "remote/bad_machines.html", {
        "form": form, "bad_machines": BadMachine.objects.all(),
    }, status=400 if form.is_bound and form.errors else 200)


@staff_only
@require_POST
def unmark_bad_machine(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    bad = get_object_or_404(BadMachine, pk=pk)
    bad.unmark(by=request.user.get_username())
    messages.info(request, f"{bad.provider} machine {bad.provider_machine_id} is no longer "
                           "marked bad")
    return _back(request, reverse("remote:bad_machines"))


@staff_only
@require_POST
def ignore_offers(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Mark the machines behind the selected offers bad (vast-manager's bulk Ignore)."""
    form = BulkIgnoreForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest(f"Nothing marked: {form.error_message()}",
                                      content_type="text/plain; charset=utf-8")
    reason = f"{form.cleaned_data['reason']} (by {request.user.get_username()})"
    for machine_id in form.cleaned_data["machine_ids"]:
        BadMachine.flag(machine_id, reason)
    count = len(form.cleaned_data["machine_ids"])
    messages.info(request, f"{count} Vast machine{'s' if count != 1 else ''} marked bad")
    return _back(request, reverse("remote:offers"))


def _back(request: AuthenticatedHttpRequest, fallback: str) -> HttpResponse:
    """To the page the action came from (`next`, same site only), else the `fallback` URL."""
    target = request.POST.get("next", "")
    # A URL, never a view name (redirect() would try to reverse "0").
    if target.startswith("/") and url_has_allowed_host_and_scheme(
            target, {request.get_host()}, require_https=request.is_secure()):
        return HttpResponseRedirect(target)
    return HttpResponseRedirect(fallback)
