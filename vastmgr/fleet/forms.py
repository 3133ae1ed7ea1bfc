from django import forms

from .models import HostAction


class SrsActionForm(forms.Form):
    action = forms.ChoiceField(choices=HostAction.Action.choices)
    circuit_id = forms.RegexField(
        regex=r"^[A-Za-z0-9._:-]{1,200}$", strip=True,
        widget=forms.TextInput(attrs={"list": "circuit-ids"}),  # suggestions in host.html
        error_messages={"invalid": "A circuit id is letters, digits and . _ : - (e.g. winning-post:tiny)."},
    )
