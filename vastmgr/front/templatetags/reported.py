"""`{{ value|reported }}`: the value, or "not reported" when the engine did not send it;
`{% not_reported "the provider" %}`: the same mark for a value someone else did not report.

Upstream cuzk daemons lack many of our fields, and any field may be absent or null; a panel
that printed 0 (or "None") for those would state something nobody measured.
"""

from django import template
from django.template.defaultfilters import floatformat
from django.utils.html import format_html

from vastmgr.front.templatetags.units import binary_size

register = template.Library()

NOT_REPORTED = format_html('<span class="not-reported" title="{}">not reported</span>',
                           "the engine did not send this value")
FORMATS = {"bytes": binary_size, "secs": lambda v: floatformat(v, 1),
           "int": lambda v: floatformat(v, 0)}


@register.filter
def reported(value, fmt: str = ""):
    # A missing key reaches a filter as the empty string (string_if_invalid).
    if value is None or value == "":
        return NOT_REPORTED
    return FORMATS[fmt](value) if fmt else value


@register.simple_tag
def not_reported(source: str = "the engine"):
    return format_html('<span class="not-reported" title="{} did not report this value">'
                       "not reported</span>", source)
