import asyncssh
from django import forms

from vastmgr.fleet.models import Machine

DEFAULT_ENGINE_PORT = Machine._meta.get_field("engine_port").default


class SecretTextarea(forms.Textarea):
    """A textarea that never renders its value back: a re-shown form must not echo a key."""

    def format_value(self, value):
        return None


class AddHostForm(forms.Form):
    name = forms.SlugField(max_length=100)
    host = forms.CharField(max_length=255)
    ssh_port = forms.IntegerField(min_value=1, max_value=65535, initial=22)
    ssh_user = forms.CharField(max_length=64, initial="root")
    engine_port = forms.IntegerField(
        min_value=1, max_value=65535, required=False, initial=DEFAULT_ENGINE_PORT,
        help_text="A free port on the host's loopback for the engine (reached through the "
                  "SSH tunnel); empty for the default")
    private_key = forms.CharField(required=False, widget=SecretTextarea(attrs={"rows": 4}),
                                  help_text="Stored encrypted; never shown again")
    key_file = forms.CharField(required=False, max_length=500,
                               help_text="Or a key file on the dashboard host")
    price_per_hour = forms.DecimalField(required=False, min_value=0, max_digits=8,
                                        decimal_places=4)

    def clean_name(self):
        name = self.cleaned_data["name"]
        if Machine.objects.filter(name=name).exists():
            raise forms.ValidationError("a machine with this name exists")
        return name

    def clean_engine_port(self):
        return self.cleaned_data["engine_port"] or DEFAULT_ENGINE_PORT

    def clean(self):
        data = super().clean()
        key, key_file = data.get("private_key", "").strip(), data.get("key_file", "").strip()
        if bool(key) == bool(key_file):
            raise forms.ValidationError("give either a private key or a key file, not both")
        if key:
            try:
                asyncssh.import_private_key(key)
            except (asyncssh.KeyImportError, ValueError):
                # Never echo the submitted key back into the page.
                self.add_error("private_key", "this is not a readable unencrypted private key")
        return data


class ApiKeyForm(forms.Form):
    api_key = forms.CharField(widget=forms.PasswordInput, max_length=200)


class OfferSearchForm(forms.Form):
    gpu_name = forms.CharField(required=False, max_length=100)
    num_gpus = forms.IntegerField(required=False, min_value=1, max_value=16)
    min_cpu_ram_gb = forms.FloatField(required=False, min_value=0)
    max_dph = forms.FloatField(required=False, min_value=0)
    min_reliability = forms.FloatField(required=False, min_value=0, max_value=1)
    geolocation = forms.CharField(required=False, max_length=2)


class CommandForm(forms.Form):
    machines = forms.ModelMultipleChoiceField(
        queryset=Machine.objects.filter(provider__in=("ssh", "vast")).exclude(state="killed"),
        widget=forms.CheckboxSelectMultiple)
    command = forms.CharField(max_length=1000, help_text="run by the login shell of each host")
    timeout = forms.IntegerField(min_value=1, max_value=600, initial=60,
                                 help_text="seconds; a command still running then is stopped")
