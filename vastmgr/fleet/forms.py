from django import forms

from cuzk_engine.circuits import KINDS, PROFILES

from .models import HostAction


class SrsActionForm(forms.Form):
    action = forms.ChoiceField(choices=HostAction.Action.choices)
    circuit_id = forms.CharField(max_length=200, strip=True)

    @staticmethod
    def circuit_ids() -> list[str]:
        """Every parameter set an engine knows: `<kind>.<profile>`."""
        return [f"{kind}.{profile}" for kind in KINDS for profile in PROFILES]

    def clean_circuit_id(self) -> str:
        circuit_id = self.cleaned_data["circuit_id"]
        if circuit_id not in self.circuit_ids():
            raise forms.ValidationError(
                "Unknown circuit id %(id)s: it is <kind>.<profile>, for example "
                "winning-post.tiny or porep-c2.small.", params={"id": repr(circuit_id)[:60]})
        return circuit_id
