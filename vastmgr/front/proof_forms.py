import re
import secrets
import time

from django import forms
from django.core.exceptions import ValidationError

from vastmgr.fleet.liveness import OFFLINE
from vastmgr.fleet.models import Machine
from vastmgr.front import readmodel
from vastmgr.front.tables import TableForm
from vastmgr.proofs.models import (
    KIND_CHOICES,
    MAX_SEED,
    PRIORITY_CHOICES,
    PROFILE_CHOICES,
    ProofJob,
)

MAX_COUNT = 20


def machines_ready_to_prove() -> list[int]:
    """Ids of the machines a test proof can be pinned to now: running, enabled, able to prove
    and with an engine that is not offline. A proof pinned anywhere else could only fail, and
    that failure would be charged to the machine and raise an alert."""
    return [h.machine.pk for h in readmodel.load_machines(time.time())
            if h.machine.not_proving_reason() is None and h.connection != OFFLINE]


class ReadyMachineField(forms.ModelChoiceField):
    """A machine among those ready to prove; any other id is refused with the reason why."""

    def to_python(self, value: object) -> Machine | None:
        try:
            return super().to_python(value)
        except ValidationError:
            # ASCII digits only: int() would also read other scripts' digits.
            machine = (Machine.objects.filter(pk=int(str(value))).first()
                       if re.fullmatch(r"[0-9]{1,18}", str(value)) else None)
            if machine is None:
                raise ValidationError("That machine does not exist.",
                                      code="invalid_choice") from None
            reason = (machine.not_proving_reason()
                      or f"the engine on {machine.name} is offline; wait for it to come live")
            raise ValidationError(f"{machine.name} cannot take a test proof now: {reason}.",
                                  code="invalid_choice") from None


class TestProofForm(forms.Form):
    machine = ReadyMachineField(queryset=Machine.objects.none(), required=False,
                                empty_label="auto (least-loaded online machine)")
    kind = forms.ChoiceField(choices=KIND_CHOICES)
    profile = forms.ChoiceField(choices=PROFILE_CHOICES, initial="tiny")
    seed = forms.IntegerField(min_value=0, max_value=MAX_SEED, required=False,
                              help_text="Empty: a random seed per proof")
    count = forms.IntegerField(min_value=1, max_value=MAX_COUNT, initial=1)
    priority = forms.ChoiceField(
        choices=[("", "the kind's default"), *PRIORITY_CHOICES], required=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["machine"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = Machine.objects.filter(pk__in=machines_ready_to_prove()).order_by("name")

    @property
    def has_machine_ready(self) -> bool:
        return self.fields["machine"].queryset.exists()  # type: ignore[attr-defined]

    def seeds(self) -> list[int]:
        seed, count = self.cleaned_data["seed"], self.cleaned_data["count"]
        if seed is None:
            return [secrets.randbelow(MAX_SEED + 1) for _ in range(count)]
        # A fixed seed with a count proves consecutive seeds: reproducible, yet distinct proofs.
        return [seed + i for i in range(count)]

    def clean(self):
        super().clean()
        seed, count = self.cleaned_data.get("seed"), self.cleaned_data.get("count")
        if seed is not None and count and seed + count - 1 > MAX_SEED:
            self.add_error("seed", f"seed + count - 1 must stay at most {MAX_SEED}")
        return self.cleaned_data


class ProofListForm(TableForm):
    SORTS = {"submitted": "submitted_at", "kind": "kind", "profile": "profile", "seed": "seed",
             "status": "status", "machine": "machine__name", "duration": "duration_sort"}
    DEFAULT_SORT = "-submitted"

    q = forms.CharField(required=False, max_length=100, strip=True, label="Search",
                        help_text="job id (or its start), seed or machine name")
    status = forms.ChoiceField(required=False, choices=[("", "any status")] + list(
        ProofJob.Status.choices))
    kind = forms.ChoiceField(required=False, choices=[("", "any kind"), *KIND_CHOICES])
    machine = forms.ModelChoiceField(required=False, queryset=Machine.objects.all(),
                                     empty_label="any machine",
                                     error_messages={"invalid_choice": "No such machine."})
