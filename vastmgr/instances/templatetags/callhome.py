from django import template

from vastmgr.fleet.models import Machine
from vastmgr.instances.models import LogLine

register = template.Library()


@register.inclusion_tag("instances/_logs.html")
def callhome_logs(machine: Machine) -> dict:
    """The lines the machine's instance pushed (POST /api/log-push), one tab per source."""
    return {"sources": LogLine.by_source(machine)}
