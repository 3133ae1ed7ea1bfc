from typing import cast

from django import forms

from cuzk_engine.vocabulary import KINDS, PROFILES
from vastmgr.fleet.models import Event, Machine, MachineAction
from vastmgr.front.tables import TableForm


class SrsActionForm(forms.Form):
    action = forms.ChoiceField(choices=MachineAction.Action.choices)
    circuit_id = forms.CharField(max_length=200, strip=True)

    @staticmethod
    def circuit_ids() -> list[str]:
        """Every parameter set an engine knows: `<kind>.<profile>`."""
        return [f"{kind}.{profile}" for kind in KINDS for profile in PROFILES]

    @classmethod
    def circuit_pattern(cls) -> str:
        """The same rule for the browser's own check (HTML `pattern`), so a typo is caught
        before the form is even sent."""
        # Only the dot needs escaping; `re.escape` would also escape "-", which the browser's
        # unicode-mode pattern rejects (the whole check would then be silently skipped).
        return "|".join(cid.replace(".", "\\.") for cid in cls.circuit_ids())

    def clean_circuit_id(self) -> str:
        circuit_id = self.cleaned_data["circuit_id"]
        if circuit_id not in self.circuit_ids():
            raise forms.ValidationError(
                "Unknown circuit id %(id)s: it is <kind>.<profile>, for example "
                "winning-post.tiny or porep-c2.small.", params={"id": repr(circuit_id)[:60]})
        return circuit_id


class EventListForm(TableForm):
    SORTS = {"time": "time", "level": "level", "kind": "kind", "machine": "machine__name"}
    DEFAULT_SORT = "-time"
    PER_PAGE = 100

    q = forms.CharField(required=False, max_length=100, strip=True, label="Search",
                        help_text="words in the message")
    machine = forms.ModelChoiceField(required=False, queryset=Machine.objects.all(),
                                     empty_label="any machine",
                                     error_messages={"invalid_choice": "No such machine."})
    level = forms.ChoiceField(required=False, choices=[("", "any level")] + list(
        Event.Level.choices))
    kind = forms.ChoiceField(required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kinds = Event.objects.order_by("kind").values_list("kind", flat=True).distinct()
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "any kind")] + [
            (k, k) for k in kinds]

    def events(self):
        events = Event.objects.select_related("machine")
        for name in ("machine", "level", "kind"):
            if self.cleaned_data.get(name):
                events = events.filter(**{name: self.cleaned_data[name]})
        if self.cleaned_data.get("q"):
            events = events.filter(message__icontains=self.cleaned_data["q"])
        return events
