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
