from django import forms
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from vastmgr.fleet.models import Event, Machine
from vastmgr.lib.params import FilterLookupsOnly


class MachineAdminForm(forms.ModelForm):
    # Write-only: the stored token is never sent back to the browser.
    engine_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current token.",
    )

    class Meta:
        model = Machine
        fields = "__all__"

    def clean_engine_token(self):
        token = self.cleaned_data.get("engine_token")
        return token if token else self.instance.engine_token


@admin.register(Machine)
class MachineAdmin(FilterLookupsOnly):
    form = MachineAdminForm
    list_display = ["name", "provider", "engine_flavour", "host", "state", "gpu_name", "gpu_count",
                    "last_seen"]
    list_filter = ["provider", "engine_flavour", "state"]
    search_fields = ["name", "host"]
    readonly_fields = ["state", "kill_reason", "last_seen", "created", "updated"]


@admin.register(Event)
class EventAdmin(FilterLookupsOnly):
    list_display = ["time", "level", "kind", "machine", "message"]
    list_filter = ["level", "kind"]
    search_fields = ["message"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# Django's own user and group admins, with the same strict changelist lookups as ours.
for _model, _admin in ((User, UserAdmin), (Group, GroupAdmin)):
    admin.site.unregister(_model)
    admin.site.register(_model, type(_admin.__name__, (FilterLookupsOnly, _admin), {}))
