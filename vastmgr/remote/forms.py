import math
import os
import re
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncssh
from django import forms

from vastmgr.fleet.models import Machine
from vastmgr.fleet.transport import DaemonAddress
from vastmgr.instances.models import SECRET_ENV
from vastmgr.remote.config import parse_env
from vastmgr.remote.vast import (
    DEFAULT_DISK_GB,
    INTERRUPTIBLE,
    MAX_BID,
    MIN_BID,
    MIN_RATE_ENV,
    ON_DEMAND,
    Deployment,
    OfferFilter,
)

DEFAULT_ENGINE_PORT = Machine._meta.get_field("engine_port").default
MAX_PRICE_PER_HOUR = 100  # $/h: far above any GPU rental; a typo's extra digits are refused
API_KEY_MIN_LENGTH = 16  # Vast keys are 64 hex digits; anything this short is not a key


class SecretTextarea(forms.Textarea):
    """A textarea that never renders its value back: a re-shown form must not echo a key."""

    def format_value(self, value):
        return None


class AddMachineForm(forms.Form):
    name = forms.SlugField(max_length=100)
    host = forms.CharField(max_length=255)
    ssh_port = forms.IntegerField(min_value=1, max_value=65535, initial=22, label="SSH port")
    ssh_user = forms.CharField(max_length=64, initial="root", label="SSH user")
    engine_port = forms.IntegerField(
        min_value=1, max_value=65535, required=False, initial=DEFAULT_ENGINE_PORT,
        help_text="A free port on the host's loopback for the engine (reached through the "
                  "SSH tunnel); empty for the default")
    engine_flavour = forms.ChoiceField(
        label="Engine", choices=Machine.Flavour.choices, initial=Machine.Flavour.CUZK_ENGINE,
        required=False,
        help_text="cuzk-upstream: a Curio cuzk daemon already running there (nothing is "
                  "provisioned; Curio feeds it, we never dispatch to it)")
    engine_url = forms.CharField(
        label="cuzk gRPC address", max_length=255, required=False,
        help_text="For cuzk-upstream: the daemon's [daemon] listen as seen on the host, "
                  "unix:///run/curio/cuzk.sock (Curio's default) or grpc://127.0.0.1:9820; "
                  "reached through the SSH link. Then the engine port is its status_listen "
                  "port, empty when that server is off (its default)")
    private_key = forms.CharField(required=False, widget=SecretTextarea(attrs={"rows": 4}),
                                  help_text="Stored encrypted; never shown again")
    key_file = forms.CharField(required=False, max_length=500,
                               help_text="Or a key file on the dashboard host")
    price_per_hour = forms.DecimalField(
        required=False, min_value=0, max_value=MAX_PRICE_PER_HOUR, max_digits=8,
        decimal_places=4, label="Price per hour ($)",
        help_text=f"What the host costs, 0 to {MAX_PRICE_PER_HOUR} $/h; empty when it is free")

    def clean_name(self):
        name = self.cleaned_data["name"]
        # A destroyed machine's name is free again (its row keeps its history under another).
        if Machine.objects.filter(name=name).exclude(state=Machine.State.KILLED).exists():
            raise forms.ValidationError("a machine with this name exists")
        return name

    def clean_key_file(self) -> str:
        """The file must be there, readable by the dashboard, private to its owner (as ssh
        itself insists) and hold an unencrypted private key."""
        given = self.cleaned_data["key_file"].strip()
        if not given:
            return ""
        path = Path(given).expanduser()
        if not path.is_absolute():
            raise forms.ValidationError("give the key file's absolute path on the dashboard host")
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise forms.ValidationError(f"{path}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            raise forms.ValidationError(f"{path} is not a file")
        if mode & 0o077:
            raise forms.ValidationError(
                f"{path} can be read by other users (mode {stat.S_IMODE(mode):04o}): "
                f"chmod 600 {path}")
        if not os.access(path, os.R_OK):
            raise forms.ValidationError(f"{path} is not readable by the dashboard's user")
        try:
            asyncssh.read_private_key(path)
        except (asyncssh.KeyImportError, OSError, ValueError):
            raise forms.ValidationError(f"{path} holds no readable unencrypted private "
                                        "key") from None
        return str(path)

    def clean_engine_flavour(self):
        return self.cleaned_data["engine_flavour"] or Machine.Flavour.CUZK_ENGINE

    def clean_engine_port(self):
        return self.cleaned_data["engine_port"] or DEFAULT_ENGINE_PORT

    def clean_engine_url(self) -> str:
        given = self.cleaned_data["engine_url"].strip()
        if not given:
            return ""
        try:
            return DaemonAddress.parse(given).url
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        key, key_file = data.get("private_key", "").strip(), data.get("key_file", "").strip()
        if data.get("engine_url"):
            if data.get("engine_flavour") != Machine.Flavour.CUZK_UPSTREAM:
                self.add_error("engine_url", "a gRPC address is for a cuzk-upstream daemon; our "
                                             "engine is reached on its engine port")
            elif not self.data.get("engine_port"):
                data["engine_port"] = 0  # the daemon's status server is off (its default)
        if key and key_file:
            raise forms.ValidationError("give either a private key or a key file, not both")
        if not key and not key_file and "key_file" not in self.errors:
            self.add_error("private_key", "the SSH private key is missing: paste it here, or "
                                          "give a key file below")
        if key:
            try:
                asyncssh.import_private_key(key)
            except (asyncssh.KeyImportError, ValueError):
                # Never echo the submitted key back into the page.
                self.add_error("private_key", "this is not a readable unencrypted private key")
        return data


class ApiKeyForm(forms.Form):
    # Vast keys are 64 hex digits; allow any visible ASCII, but never a space, CR or LF: the key
    # goes into an HTTP header, where a newline would break (or forge) the request.
    # strip=False: a key with a space is refused, never silently changed.
    api_key = forms.CharField(
        widget=forms.PasswordInput, strip=False, max_length=200,
        error_messages={
            "required": "the API key is empty",
            "max_length": "the API key is longer than %(limit_value)d characters: is it a key?",
        })

    def clean_api_key(self):
        key = self.cleaned_data["api_key"]
        bad = sorted({c for c in key if not "!" <= c <= "~"})
        if bad:
            # Name the offending characters, never the key itself.
            shown = ", ".join(repr(c) if c.isprintable() else f"U+{ord(c):04X}" for c in bad)
            raise forms.ValidationError(
                f"the API key may hold only visible ASCII characters, no spaces or line "
                f"breaks; found {shown}")
        if len(key) < API_KEY_MIN_LENGTH:
            raise forms.ValidationError(f"the API key is shorter than {API_KEY_MIN_LENGTH} "
                                        "characters: is it a key?")
        return key

    def error_message(self) -> str:
        return "; ".join(str(e) for errors in self.errors.values() for e in errors)


# What an operator rents: Vast's on-demand offers, or interruptible ones at a bid.
OFFER_TYPE_CHOICES = ((ON_DEMAND, "On demand"), (INTERRUPTIBLE, "Interruptible (bid)"))


class OfferSearchForm(forms.Form):
    offer_type = forms.ChoiceField(
        required=False, choices=OFFER_TYPE_CHOICES, label="Offer type",
        help_text="Interruptible offers are priced at the machine's minimum bid; a higher bid "
                  "stops them until it is raised")
    gpu_name = forms.CharField(required=False, max_length=100, label="GPU name")
    num_gpus = forms.IntegerField(required=False, min_value=1, max_value=16, label="GPUs")
    min_cpu_ram_gb = forms.FloatField(required=False, min_value=0, label="Min RAM (GB)")
    max_dph = forms.FloatField(required=False, min_value=0, label="Max $/h")
    min_reliability = forms.FloatField(required=False, min_value=0, max_value=1,
                                       label="Min reliability (0–1)")
    geolocation = forms.CharField(required=False, max_length=2, label="Country (2 letters)")
    min_gpu_ram_gb = forms.FloatField(required=False, min_value=0, max_value=1000,
                                      label="Min GPU RAM (GB)")
    min_disk_gb = forms.FloatField(required=False, min_value=0, max_value=100_000,
                                   label="Min disk (GB)")
    min_inet_down_mbps = forms.FloatField(required=False, min_value=0, max_value=1_000_000,
                                          label="Min download (Mbps)")
    min_cuda = forms.FloatField(required=False, min_value=0, max_value=100, label="Min CUDA")
    min_cpu_cores = forms.IntegerField(required=False, min_value=0, max_value=10_000,
                                       label="Min CPU cores")
    hide_bad = forms.BooleanField(required=False, label="Hide bad machines")

    # What the search sends to Vast; hide_bad is ours, applied to the answer.
    NOT_SENT_TO_VAST = frozenset({"hide_bad"})

    def offer_filter(self, disk_gb: float = DEFAULT_DISK_GB) -> OfferFilter:
        """The Vast search for a valid form, priced with `disk_gb`: the one place that turns
        the form into a filter, for the Offers page and the JSON API alike."""
        wanted = {name: value for name, value in self.cleaned_data.items()
                  if name not in self.NOT_SENT_TO_VAST and value not in (None, "", False)}
        return OfferFilter(disk_gb=disk_gb, **wanted)


class CommandForm(forms.Form):
    machines = forms.ModelMultipleChoiceField(
        queryset=Machine.objects.filter(provider__in=("ssh", "vast")).exclude(state="killed"),
        widget=forms.CheckboxSelectMultiple)
    command = forms.CharField(max_length=1000, help_text="run by the login shell of each machine")
    timeout = forms.IntegerField(min_value=1, max_value=600, initial=60,
                                 help_text="seconds; a command still running then is stopped")


MAX_BULK = 20  # machines ignored by one click
# Offers rented by one click: each rent is a few Vast calls while the page waits.
MAX_BULK_RENT = 5
MAX_ID = 2**62  # provider ids are stored as 64-bit integers


class ErrorMessage:
    """A form's errors in one line, for a message or a 400 answer."""

    def error_message(self) -> str:
        errors = self.errors  # type: ignore[attr-defined]
        fields = self.fields  # type: ignore[attr-defined]
        return "; ".join(f"{fields[name].label or name}: {error}" if name in fields
                         else str(error) for name, errors in errors.items() for error in errors)


class AsciiIntegerField(forms.IntegerField):
    """An integer written with the digits 0-9 only: Python's int() also reads other scripts'
    digits (Arabic-Indic ٤٠٠٠١ is 40001), which an id typed by mistake should not become."""

    def to_python(self, value: Any) -> int | None:
        text = str(value).strip() if value is not None else ""
        if text and not re.fullmatch(r"[+-]?[0-9]+", text):
            raise forms.ValidationError("Enter a whole number using the digits 0-9.",
                                        code="invalid")
        return super().to_python(value)


class BadMachineForm(ErrorMessage, forms.Form):
    # Vast's machine ids start at 1.
    provider_machine_id = AsciiIntegerField(min_value=1, max_value=MAX_ID,
                                            label="Vast machine id")
    reason = forms.CharField(max_length=500, strip=True)


class BulkIgnoreForm(ErrorMessage, forms.Form):
    """Mark the provider machines behind several offers bad at once."""

    machine_ids = forms.TypedMultipleChoiceField(coerce=int, label="Vast machine ids")
    reason = forms.CharField(max_length=500, strip=True, initial="ignored from the offers list")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Any id is a valid choice; TypedMultipleChoiceField only needs them listed.
        values = self.data.getlist("machine_ids") if hasattr(self.data, "getlist") else []
        self.fields["machine_ids"].choices = [(v, v) for v in values]  # type: ignore[attr-defined]

    def clean_machine_ids(self) -> list[int]:
        ids = self.cleaned_data["machine_ids"]
        if len(ids) > MAX_BULK:
            raise forms.ValidationError(f"at most {MAX_BULK} machines at once")
        return _ids_in_range(ids, "machine")


# Vast's limit on the onstart script (with any docker args) of one instance.
ONSTART_MAX = 4096
ENV_MAX = 4000  # characters of NAME=value lines; Vast passes them as docker -e flags
# Set by vastmgr on every upstream rental: a person's env may not replace them.
UPSTREAM_RESERVED_ENV = (SECRET_ENV, MIN_RATE_ENV)


# What the rent dialog shows in place of a stored env value: the values are operator secrets
# (vast-manager's PAVAIL), so the page carries only their names. A line left as NAME=<mask>
# keeps the stored value; a deleted line removes it.
ENV_MASK = "\u2022" * 8


def masked_env(env: dict[str, str]) -> str:
    return "\n".join(f"{name}={ENV_MASK}" for name in env)


def checked_env(text: str, kept: dict[str, str] | None = None) -> dict[str, str]:
    """The env typed in the dialog, each masked value replaced by the stored one in `kept`."""
    try:
        env = parse_env(text, UPSTREAM_RESERVED_ENV)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None
    for name, value in env.items():
        if value == ENV_MASK:
            if kept is None or name not in kept:
                raise forms.ValidationError(f"{name} has no stored value to keep: type its value")
            env[name] = kept[name]
    return env


class RentForm(ErrorMessage, forms.Form):
    """The rent dialog: the offers, the most a proof may cost (which sets the benchmark each
    machine must reach: ceil($/h ÷ max $/proof)), the disk, and what runs there: our engine
    (provisioned over SSH) or Curio's cuzk image (upstream) with its image, env and onstart."""

    offer_ids = forms.TypedMultipleChoiceField(coerce=int, label="Offers")
    max_price_per_proof = forms.DecimalField(min_value=Decimal("0.00001"), max_value=10,
                                             max_digits=8, decimal_places=5,
                                             label="Max $/proof")
    disk_gb = forms.IntegerField(min_value=16, max_value=2000, label="Disk (GB)")
    engine_flavour = forms.ChoiceField(choices=Machine.Flavour.choices, required=False,
                                       label="Engine")
    image = forms.CharField(max_length=255, required=False, label="Image")
    env = forms.CharField(max_length=ENV_MAX, required=False, strip=False, label="Env")
    onstart = forms.CharField(max_length=ONSTART_MAX, required=False, strip=False,
                              label="Onstart")
    offer_type = forms.ChoiceField(choices=OFFER_TYPE_CHOICES, required=False,
                                   label="Offer type")
    # Vast's own bounds on a bid; each offer's minimum bid and its on-demand price (the cap)
    # are checked against the market when it is rented.
    bid_price = forms.DecimalField(min_value=Decimal(str(MIN_BID)),
                                   max_value=Decimal(str(MAX_BID)), max_digits=8,
                                   decimal_places=4, required=False, label="Bid ($/h)")

    DEFAULT_MAX_PRICE_PER_PROOF = Decimal("0.008")  # vast-manager's default

    def __init__(self, *args, kept_env: dict[str, str] | None = None, **kwargs):
        """`kept_env`: the env the dialog showed masked, whose values a masked line keeps."""
        super().__init__(*args, **kwargs)
        self.kept_env = kept_env or {}
        values = self.data.getlist("offer_ids") if hasattr(self.data, "getlist") else []
        self.fields["offer_ids"].choices = [(v, v) for v in values]  # type: ignore[attr-defined]

    def clean_offer_ids(self) -> list[int]:
        ids = self.cleaned_data["offer_ids"]
        if len(ids) > MAX_BULK_RENT:
            raise forms.ValidationError(f"at most {MAX_BULK_RENT} offers at once")
        return _ids_in_range(ids, "offer")

    def clean_engine_flavour(self) -> str:
        return self.cleaned_data["engine_flavour"] or Machine.Flavour.CUZK_ENGINE

    def clean_image(self) -> str:
        image = self.cleaned_data["image"].strip()
        if image and not IMAGE.fullmatch(image):
            raise forms.ValidationError("a Docker image reference such as "
                                        "magik6k/curio-cuzk:latest (no spaces)")
        return image

    def clean_env(self) -> dict[str, str]:
        return checked_env(self.cleaned_data["env"], self.kept_env)

    def clean_offer_type(self) -> str:
        return self.cleaned_data["offer_type"] or ON_DEMAND

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("engine_flavour") == Machine.Flavour.CUZK_UPSTREAM and \
                "image" in data and not data["image"]:
            self.add_error("image", "an upstream worker needs the image it runs")
        if data.get("offer_type") == INTERRUPTIBLE:
            if data.get("bid_price") is None and "bid_price" not in self.errors:
                self.add_error("bid_price", "an interruptible rental needs a bid: at least "
                                            "the offer's minimum bid")
        elif "offer_type" in data:
            data["bid_price"] = None  # on demand: a bid typed before switching is not sent
        return data

    def deployment(self) -> "Deployment":
        """What the rented instance runs, from the cleaned data."""
        data = self.cleaned_data
        if data["engine_flavour"] != Machine.Flavour.CUZK_UPSTREAM:
            return Deployment()
        return Deployment(flavour=Machine.Flavour.CUZK_UPSTREAM, image=data["image"],
                          env=data["env"], onstart=data["onstart"].strip())


# A Docker reference: [registry/]name[:tag][@digest], no whitespace.
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")


def _ids_in_range(ids: list[int], what: str) -> list[int]:
    if any(not 0 <= i <= MAX_ID for i in ids):
        raise forms.ValidationError(f"{what} ids are between 0 and {MAX_ID}")
    return sorted(set(ids))


def min_bench_rate(dph: float, max_price_per_proof: Decimal) -> int:
    """The proofs per hour at which a machine costing `dph` $/h stays under the price."""
    return max(1, math.ceil(Decimal(str(dph)) / max_price_per_proof))
