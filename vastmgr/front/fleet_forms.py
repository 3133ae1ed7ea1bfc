from typing import cast

from django import forms

from cuzk_engine.vocabulary import KINDS, PROFILES
from vastmgr.fleet.models import Event, Machine, MachineAction
from vastmgr.front.tables import TableForm
from vastmgr.remote.cuzk_grpc.client import CIRCUIT_IDS


class SrsActionForm(forms.Form):
    """Preload or evict one SRS. Our engines name circuits `<kind>.<profile>`; an upstream cuzk
    daemon driven through gRPC knows its own four (`porep-32g`, ...)."""

    action = forms.ChoiceField(choices=MachineAction.Action.choices)
    circuit_id = forms.CharField(max_length=200, strip=True)

    def __init__(self, *args, upstream: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.upstream = upstream

    def circuit_ids(self) -> list[str]:
        """Every parameter set the machine's engine knows."""
        if self.upstream:
            return list(CIRCUIT_IDS)
        return [f"{kind}.{profile}" for kind in KINDS for profile in PROFILES]

    def example(self) -> str:
        return "porep-32g" if self.upstream else "winning-post.tiny"

    def circuit_pattern(self) -> str:
        """The same rule for the browser's own check (HTML `pattern`), so a typo is caught
        before the form is even sent."""
        # Only the dot needs escaping; `re.escape` would also escape "-", which the browser's
        # unicode-mode pattern rejects (the whole check would then be silently skipped).
        return "|".join(cid.replace(".", "\\.") for cid in self.circuit_ids())

    def clean_circuit_id(self) -> str:
        circuit_id = self.cleaned_data["circuit_id"]
        if circuit_id not in self.circuit_ids():
            shape = ("one of " + ", ".join(CIRCUIT_IDS) if self.upstream else
                     "<kind>.<profile>, for example winning-post.tiny or porep-c2.small")
            raise forms.ValidationError("Unknown circuit id %(id)s: it is %(shape)s.",
                                        params={"id": repr(circuit_id)[:60], "shape": shape})
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
