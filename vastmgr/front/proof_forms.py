import secrets

from django import forms

from vastmgr.fleet.models import Machine
from vastmgr.front.tables import TableForm
from vastmgr.proofs.models import (
    KIND_CHOICES,
    MAX_SEED,
    PRIORITY_CHOICES,
    PROFILE_CHOICES,
    ProofJob,
)

MAX_COUNT = 20


class TestProofForm(forms.Form):
    machine = forms.ModelChoiceField(
        queryset=Machine.objects.exclude(state=Machine.State.KILLED)
        .exclude(engine_flavour=Machine.Flavour.CUZK_UPSTREAM), required=False,
        empty_label="auto (least-loaded online machine)",
        error_messages={"invalid_choice": "That machine does not exist, was killed, or runs an "
                                          "upstream cuzk daemon (watched only: no test proofs)."},
    )
    kind = forms.ChoiceField(choices=KIND_CHOICES)
    profile = forms.ChoiceField(choices=PROFILE_CHOICES, initial="tiny")
    seed = forms.IntegerField(min_value=0, max_value=MAX_SEED, required=False,
                              help_text="Empty: a random seed per proof")
    count = forms.IntegerField(min_value=1, max_value=MAX_COUNT, initial=1)
    priority = forms.ChoiceField(
        choices=[("", "the kind's default"), *PRIORITY_CHOICES], required=False)

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
