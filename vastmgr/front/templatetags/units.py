"""Units and running clocks for the pages.

`{{ n|binary_size }}`: byte counts in binary units (KiB, MiB, GiB), the units memory and
parameter sizes are measured in.

`{% ticking seconds age %}`: a duration that keeps running in the browser. It renders what the
value is now (`seconds` as of the snapshot plus the snapshot's `age`) and, for app.js, the
value at the snapshot (`data-tick-base`), that age (`data-tick-age`) and when it was rendered
(`data-tick-rendered`, this server's clock); fleet.js adds the time since the fragment arrived
and how much later than the quickest fragment it arrived, so a clock never freezes between
pushes, a push delayed in a busy controller or channel does not leave it behind, and every push
re-bases it.
"""

import time

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from vastmgr.front.readmodel import duration

register = template.Library()

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


@register.filter
def binary_size(value) -> str:
    try:
        size = float(value)
    except (TypeError, ValueError):
        return ""
    if abs(size) < 1024:
        return f"{size:.0f} B"
    for unit in _UNITS:
        size /= 1024
        if abs(size) < 1024 or unit == _UNITS[-1]:
            break
    return f"{size:.1f} {unit}"


@register.simple_tag
def ticking(seconds, age=0.0, digits: int = 0, down: bool = False):
    """A running clock (`down`: counting down to 0, as an ETA). Nothing when `seconds` is
    unknown."""
    if seconds is None or seconds == "":
        return ""
    age = float(age or 0.0)
    now = float(seconds) - age if down else float(seconds) + age
    return format_html(
        '<span class="tick" data-tick-base="{}" data-tick-age="{}" data-tick-rendered="{}" '
        'data-tick-digits="{}"{}>{}</span>',
        f"{float(seconds):.3f}", f"{age:.3f}", f"{time.time():.3f}", digits,
        mark_safe(' data-tick-down="1"') if down else "",
        f"{max(now, 0.0):.{digits}f} s" if digits else duration(max(now, 0.0)))
