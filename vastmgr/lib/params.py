"""Query-string guards that no single view owns: object ids bounded to the database's range,
NUL refused for every view (RejectNulMiddleware), admin lookups limited to the sidebar filters.
List pages validate their own parameters with forms (vastmgr/front/tables.py).
"""

from django.contrib import admin
from django.http import HttpRequest, HttpResponseBadRequest

MAX_ID = 2**63 - 1  # the largest primary key any of our databases stores


def object_id(raw: str) -> str:
    # isascii: "²".isdigit() is True, yet int("²") raises.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise ValueError(f"not an id (a whole number from 0 to {MAX_ID})")
    return str(int(raw))


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


class FilterLookupsOnly(admin.ModelAdmin):
    """A ModelAdmin whose changelist accepts from the query string only lookups on its
    sidebar filters' fields. Django's admin otherwise runs any local-field lookup a URL names
    (``?proof__exact=x`` on a binary field, ``?machine__exact=`` past the id range) and the
    database raises while the page renders: a 500. Refused lookups are a 400."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        name = lookup.split("__", 1)[0]
        if name not in self.list_filter:
            return False
        if self.model._meta.get_field(name).is_relation and not lookup.endswith("__isnull"):
            try:  # a related object's id (all our ids are integers)
                object_id(str(value))
            except ValueError:
                return False
        return super().lookup_allowed(lookup, value, request)
