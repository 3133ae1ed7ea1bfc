"""Units and running clocks for the pages.

`{{ n|binary_size }}`: byte counts in binary units (KiB, MiB, GiB), the units memory and
parameter sizes are measured in.

`{% ticking seconds age of=view %}`: a duration that keeps running in the browser. It renders
what the value is now (`seconds` as of the snapshot plus the snapshot's `age`) and, for
fleet.js, the value at the snapshot (`data-tick-base`), that age (`data-tick-age`) and when it
was rendered (`data-tick-rendered`, this server's clock); fleet.js adds the time since the
fragment arrived and how much later than the quickest fragment it arrived, so a clock never
freezes between pushes, a push delayed in a busy controller or channel does not leave it
behind, and every push re-bases it.

`of` names the machine the value comes from (a `MachineView`). A clock runs only while that
machine is live (`fleet/liveness.py`): otherwise nobody knows whether the engine is still
proving, so the clock stops at the value of the last snapshot and says how old it is
("47.3 s as of 12 s ago"), never a number the engine did not send.

`{% ago age %}`: the age of a snapshot ("data 12 s old"), which is true whether or not the
machine is live, so it always runs; fleet.js keeps it running while the page itself has lost
its connection, when every other clock stops.
"""

import time

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from vastmgr.front.readmodel import MachineView, duration

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


def _shown(seconds: float, digits: int) -> str:
    return f"{max(seconds, 0.0):.{digits}f} s" if digits else duration(max(seconds, 0.0))


def _clock(css: str, seconds: float, age: float, digits: int, down: bool) -> SafeString:
    now = seconds - age if down else seconds + age
    return format_html(
        '<span class="{}" data-tick-base="{}" data-tick-age="{}" data-tick-rendered="{}" '
        'data-tick-digits="{}"{}>{}</span>',
        css, f"{seconds:.3f}", f"{age:.3f}", f"{time.time():.3f}", digits,
        mark_safe(' data-tick-down="1"') if down else "", _shown(now, digits))


@register.simple_tag
def ago(age) -> SafeString | str:
    """How long ago a snapshot was taken, running. Nothing when unknown."""
    if age is None or age == "":
        return ""
    return _clock("tick age", 0.0, float(age), 0, False)


@register.simple_tag
def ticking(seconds, age=0.0, digits: int = 0, down: bool = False,
            of: MachineView | None = None) -> SafeString | str:
    """A running clock (`down`: counting down to 0, as an ETA); stopped at the snapshot's value,
    with its age, when the machine `of` is not live. Nothing when `seconds` is unknown."""
    if seconds is None or seconds == "":
        return ""
    age = float(age or 0.0)
    if of is not None and not of.live:
        as_of = of.snapshot_age if of.snapshot_age is not None else age
        return format_html('<span class="tick-frozen">{}</span> <small class="as-of">as of {} ago'
                           '</small>', _shown(float(seconds), int(digits)), ago(as_of))
    return _clock("tick", float(seconds), age, int(digits), bool(down))
