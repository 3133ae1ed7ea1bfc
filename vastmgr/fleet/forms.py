from django import forms

from vastmgr.tables import TableForm

from .models import Event, HostAction, Machine


class SrsActionForm(forms.Form):
    action = forms.ChoiceField(choices=HostAction.Action.choices)
    circuit_id = forms.RegexField(
        regex=r"^[A-Za-z0-9._:-]{1,200}$", strip=True,
        widget=forms.TextInput(attrs={"list": "circuit-ids"}),  # suggestions in host.html
        error_messages={"invalid": "A circuit id is letters, digits and . _ : - (e.g. winning-post:tiny)."},
    )


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
        self.fields["kind"].choices = [("", "any kind")] + [(k, k) for k in kinds]

    def events(self):
        events = Event.objects.select_related("machine")
        for name in ("machine", "level", "kind"):
            if self.cleaned_data.get(name):
                events = events.filter(**{name: self.cleaned_data[name]})
        if self.cleaned_data.get("q"):
            events = events.filter(message__icontains=self.cleaned_data["q"])
        return events
