"""`{% conn_badge h %}`: a machine view's connection badge, last seen and error, as its fleet
row shows them (`fleet_row.conn_badge` owns the markup)."""

from django import template
from django.utils.safestring import mark_safe

from vastmgr.front import fleet_row
from vastmgr.front.readmodel import MachineView

register = template.Library()


@register.simple_tag
def conn_badge(h: MachineView) -> str:
    return mark_safe(fleet_row.conn_badge(h))
