"""Query-string parameters of list pages, validated before any query uses them.

A malformed value (``?machine=²``, an id past the database's range, an unknown status) is
ignored and the page says so in a message: a bad link still shows the list, never a 500.
A NUL character anywhere in a query string is refused for every view (RejectNulMiddleware).
"""

from collections.abc import Callable, Iterable

from django.contrib import messages
from django.http import HttpResponseBadRequest

MAX_ID = 2**63 - 1  # the largest primary key any of our databases stores


def valid_params(request, **parsers: Callable[[str], str]) -> dict[str, str]:
    """Each named query parameter parsed by its parser; "" when absent or malformed."""
    values = {}
    for name, parse in parsers.items():
        raw = request.GET.get(name, "")
        try:
            values[name] = parse(raw) if raw else ""
        except ValueError as exc:
            shown = raw if len(raw) <= 40 else raw[:40] + "..."
            messages.warning(request, f"Ignored {name}={shown!r}: {exc}.")
            values[name] = ""
    return values


def object_id(raw: str) -> str:
    # isascii: "²".isdigit() is True, yet int("²") raises.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise ValueError(f"not an id (a whole number from 0 to {MAX_ID})")
    return str(int(raw))


def choice(choices: Iterable[tuple[str, str]]) -> Callable[[str], str]:
    allowed = [str(value) for value, _ in choices]

    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"use one of {', '.join(allowed)}")
        return raw
    return parse


class RejectNulMiddleware:
    """A NUL character in the query string is a 400 before any view runs: no parameter of ours
    holds one, and PostgreSQL refuses it in a query (a 500 from any filter, the admin's
    included). Form posts need no check here: every form field refuses NUL already."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if any("\x00" in key or "\x00" in value
               for key, values in request.GET.lists() for value in values):
            return HttpResponseBadRequest("A query parameter holds a NUL character.",
                                          content_type="text/plain; charset=utf-8")
        return self.get_response(request)


class FilterLookupsOnly:
    """A ModelAdmin mixin: the changelist accepts from the query string only lookups on its
    sidebar filters' fields. Django's admin otherwise runs any local-field lookup a URL names
    (``?proof__exact=x`` on a binary field, ``?machine__exact=`` past the id range) and the
    database raises while the page renders: a 500. Refused lookups are a 400."""

    def lookup_allowed(self, lookup, value, request=None):
        name = lookup.split("__", 1)[0]
        if name not in self.list_filter:
            return False
        if self.model._meta.get_field(name).is_relation and not lookup.endswith("__isnull"):
            try:  # a related object's id (all our ids are integers)
                object_id(str(value))
            except ValueError:
                return False
        return super().lookup_allowed(lookup, value, request)
