"""The fleet page's banner for Vast instances that bill without doing our work."""

from django import template

from vastmgr.fleet.models import Machine
from vastmgr.remote.models import RemoteMachine, UnmanagedInstance

register = template.Library()


@register.inclusion_tag("remote/_billing_banner.html")
def vast_billing_banner():
    return {
        "unmanaged": list(UnmanagedInstance.objects.all()),
        "down": list(RemoteMachine.objects.filter(vast_down_since__isnull=False).exclude(
            machine__state=Machine.State.KILLED).select_related("machine")),
    }
