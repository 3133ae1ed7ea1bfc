"""Query-string parameters of list pages, validated before any query uses them.

A malformed value (``?machine=²``, an id past the database's range, an unknown status) is
ignored and the page says so in a message: a bad link still shows the list, never a 500.
"""

from collections.abc import Callable, Iterable

from django.contrib import messages

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
