"""Server-side tables: sort, search and pagination from validated query parameters."""

from typing import cast

from django import forms
from django.core.paginator import Page, Paginator
from django.db.models import F
from django.http import QueryDict


class TableForm(forms.Form):
    """Query parameters of a paginated, sortable, searchable table. Subclasses name their
    sort keys in SORTS (parameter value → model ordering); a bad value is a form error
    (shown, answered 400), never a 500."""

    SORTS: dict[str, str] = {}
    DEFAULT_SORT = ""
    PER_PAGE = 50

    q = forms.CharField(required=False, max_length=100, strip=True, label="Search")
    sort = forms.ChoiceField(required=False)
    page = forms.IntegerField(required=False, min_value=1, max_value=10**6)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["sort"]).choices = [("", "")] + [
            (f"{sign}{key}", key) for key in self.SORTS for sign in ("", "-")]

    def ordering(self) -> list:
        sort = self.cleaned_data.get("sort") or self.DEFAULT_SORT
        descending = sort.startswith("-")
        field = F(self.SORTS[sort.lstrip("-")])
        # Rows without a value (no machine, not started) go last either way; pk breaks ties
        # so that pages never repeat or skip a row.
        return [field.desc(nulls_last=True) if descending else field.asc(nulls_last=True),
                F("pk").desc() if descending else F("pk").asc()]

    def page_of(self, queryset) -> Page:
        """The requested page of the ordered queryset (a page past the end shows the last)."""
        paginator = Paginator(queryset.order_by(*self.ordering()), self.PER_PAGE)
        return paginator.get_page(self.cleaned_data.get("page") or 1)

    def query_without(self, *names: str) -> str:
        """This table's query string minus some parameters: the base of sort and page links."""
        params = cast(QueryDict, self.data).copy()  # a table is always bound to request.GET
        for name in names:
            params.pop(name, None)
        return params.urlencode()

    def sort_links(self) -> dict[str, dict]:
        """Per sort key: the link that sorts by it (toggling direction when it is the current
        sort) and the arrow that marks the current one."""
        current = (self.cleaned_data.get("sort") if self.is_bound and self.is_valid() else "") \
            or self.DEFAULT_SORT
        base = self.query_without("sort", "page")
        links = {}
        for key in self.SORTS:
            if current == key:
                target, arrow, aria = f"-{key}", "▲", "ascending"
            elif current == f"-{key}":
                target, arrow, aria = key, "▼", "descending"
            else:
                target, arrow, aria = key, "", "none"
            links[key] = {"url": "?" + "&".join(filter(None, [base, f"sort={target}"])),
                          "arrow": arrow, "aria": aria}
        return links
