from django import forms

from cuzk_engine.vocabulary import KINDS
from vastmgr.autopilot.models import DEFAULT_BUDGETS_MIN, Autopilot


class LimitsForm(forms.ModelForm):
    """The autopilot's hard limits; the floor of warm hosts is one field per kind."""

    class Meta:
        model = Autopilot
        fields = ("max_dollars_per_hour", "max_hosts", "max_rents_per_hour", "cooldown_min",
                  "pipeline_margin_min", "idle_release_min", "scale_to_zero")
        labels = {"max_dollars_per_hour": "Max $/h", "max_hosts": "Max hosts",
                  "max_rents_per_hour": "Max rents per hour", "cooldown_min": "Cool-down (min)",
                  "pipeline_margin_min": "Pipeline margin (min)",
                  "idle_release_min": "Keep idle hosts at least (min)",
                  "scale_to_zero": "Scale to zero when there is no work"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        budgets = self.instance.budgets_min or {}
        for kind in KINDS:
            self.fields[f"min_{kind}"] = forms.IntegerField(
                label=f"Min hosts for {kind}", min_value=0, max_value=100,
                initial=(self.instance.min_hosts or {}).get(kind, 0))
        for kind in KINDS:
            self.fields[f"budget_{kind}"] = forms.FloatField(
                label=f"Time budget for {kind} (min)", min_value=0.05, max_value=7 * 24 * 60,
                initial=budgets.get(kind, DEFAULT_BUDGETS_MIN[kind]))

    def clean(self):
        cleaned = super().clean() or {}
        floor = max((cleaned.get(f"min_{k}") or 0 for k in KINDS), default=0)
        hosts = cleaned.get("max_hosts")
        if hosts is not None and floor > hosts:
            raise forms.ValidationError(f"the minimum of {floor} hosts is above the maximum "
                                        f"of {hosts}")
        return cleaned

    def save(self, commit: bool = True) -> Autopilot:
        pilot = super().save(commit=False)
        pilot.min_hosts = {k: self.cleaned_data[f"min_{k}"] for k in KINDS
                           if self.cleaned_data.get(f"min_{k}")}
        # Per-priority overrides ("kind:priority" keys, set in the admin) are kept.
        pilot.budgets_min = {**(pilot.budgets_min or {}),
                             **{k: self.cleaned_data[f"budget_{k}"] for k in KINDS}}
        if commit:
            pilot.save()
        return pilot
