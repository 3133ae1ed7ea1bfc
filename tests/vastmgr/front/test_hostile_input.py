"""Property-based: no request to any dashboard view gets a 5xx, for a staff user or not. The
views are read from the URL conf (a new view is covered without touching this module); query
strings and form posts use the names each view reads (recorded as it reads them), with
hostile values."""

from __future__ import annotations

import urllib.parse

import pytest
from django.http import QueryDict
from django.test import Client
from django.urls import get_resolver
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.vastmgr.front.test_auth import iter_patterns
from vastmgr.fleet.models import Machine, MachineStatus
from vastmgr.proofs.models import ProofJob
from vastmgr.remote import views as remote_views
from vastmgr.remote.config import RemoteSettings
from vastmgr.remote.models import Secret

pytestmark = pytest.mark.django_db

EXAMPLES = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

# The admin has a test of its own below (its changelists read any parameter as a lookup).
SKIPPED_NAMESPACES = ("admin:",)
# The machine log is read over SSH with retries: its view gets only ids of no machine.
NO_EXISTING_MACHINE = {"remote:machine_log"}


def routes() -> list[tuple[str, str, object]]:
    return [(route, name, pattern) for route, name, pattern in iter_patterns(get_resolver())
            if not (name or "").startswith(SKIPPED_NAMESPACES)
            and not route.startswith(("^", "admin/"))]


TRICKY_VALUES = [
    "", "0", "1", "-1", "²", "٣", "1.5", "1e5", "NaN", "99999999999999999999999",
    "-99999999999999999999999", "9223372036854775808", "9" * 5000, "\x00", "0x10",
    "' OR 1=1 --", "<script>x</script>", "../../etc/passwd", "%C2%B2",
    "porep-c2", "winning-post", "tiny", "done", "failed", "preload", "evict",
    "winning-post.tiny", "a" * 300, "\r\nX-Injected: 1",
]
TRICKY = st.sampled_from(TRICKY_VALUES)
VALUES = st.one_of(TRICKY, TRICKY, st.text(max_size=20), st.integers(-2**70, 2**70).map(str))


def params(names: list[str]) -> st.SearchStrategy:
    """Query/form data over the names a view reads, each present or not, and a stray name."""
    return st.builds(
        lambda known, stray: {**known, **stray},
        st.fixed_dictionaries({}, optional={
            name: VALUES | st.lists(VALUES, min_size=2, max_size=3) for name in names}),
        st.dictionaries(st.text(max_size=6), VALUES, max_size=1))


def names_read(monkeypatch, request) -> list[str]:
    """The query/form names a view reads when it answers ``request()``: recorded on the
    QueryDict as the view looks them up, so hypothesis spends its examples on real names."""
    seen = set()

    def recording(method):
        def look_up(self, key, *args, **kwargs):
            seen.add(key)
            return method(self, key, *args, **kwargs)
        return look_up

    with monkeypatch.context() as patched:
        for method in ("get", "getlist", "__getitem__", "__contains__"):
            patched.setattr(QueryDict, method, recording(getattr(QueryDict, method)))
        request()
    return sorted(k for k in seen if isinstance(k, str)
                  and k not in {"csrfmiddlewaretoken", "HTTP_X_REQUESTED_WITH"})


def segments(kind: str, known: dict) -> st.SearchStrategy:
    if kind == "int":
        return st.sampled_from(known["int"]) | st.integers(0, 10**25)
    if kind == "uuid":
        return st.sampled_from(known["uuid"]) | st.uuids()
    if kind == "slug":  # not the remote actions that start SSH work in a thread (provision...)
        return st.from_regex(r"\A[-a-zA-Z0-9_]{1,30}\Z").filter(
            lambda s: s not in remote_views.ACTIONS) | st.just("clear-host-key")
    return (st.text(min_size=1, max_size=30).filter(lambda s: "/" not in s)
            | st.sampled_from(["proof.bin", "vk.json", "public_inputs.json"]))


SAMPLES = {"slug": "clear-host-key", "str": "proof.bin"}


def fill(route: str, pattern, pick) -> str:
    """The route with each converter replaced by ``pick(kind, name)``, URL-quoted."""
    path = route
    for name, converter in (getattr(pattern.pattern, "converters", None) or {}).items():
        kind = type(converter).__name__.replace("Converter", "").lower()
        path = path.replace(f"<{kind}:{name}>", urllib.parse.quote(str(pick(kind, name)), safe=""))
    return "/" + path


@pytest.fixture
def world(django_user_model, settings):
    # Any Vast call (a key stored by a generated post) fails at once on a closed local port.
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url="http://127.0.0.1:9")
    # The login and password forms hash on every post; the default hasher would take minutes.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    machine = Machine.objects.create(name="gpu-1", provider="local", host="127.0.0.1",
                                     last_seen=timezone.now())
    MachineStatus.objects.create(machine=machine, connected=True, interval=1, snapshot={
        "seq": 1, "allocations": {"srs": [{"circuit_id": "winning-post.tiny", "bytes": 1,
                                           "state": "loaded", "evictable": True}]}})
    job = ProofJob.objects.create(machine=machine, kind="winning-post", profile="tiny", seed=1,
                                  priority="normal", proof=b"p", vk={"a": 1},
                                  public_inputs=[1])
    staff = Client()
    staff.force_login(django_user_model.objects.create_user("boss", is_staff=True))
    other = Client()
    other.force_login(django_user_model.objects.create_user("op"))
    return {"clients": {"staff": staff, "non-staff": other},
            "known": {"int": [machine.pk], "uuid": [job.pk]}}


def test_the_url_conf_yields_the_views_to_check():
    found = {route for route, _, _ in routes()}
    assert {"", "proofs/", "machines/<int:machine_id>/srs/", "remote/offers/api-key/"} <= found


ROUTES = routes()


@pytest.mark.parametrize("query,field", [
    ("machine=%C2%B2", "Machine"),
    ("machine=99999999999999999999999", "Machine"),
    ("machine=-1", "Machine"),
    ("status=queue", "Status"),
    ("kind=nope&machine=1", "Kind"),
])
def test_bad_list_filters_get_a_400_that_names_them(world, query, field):
    response = world["clients"]["non-staff"].get(f"/proofs/?{query}")
    html = response.content.decode()
    assert response.status_code == 400, html[-2000:]
    assert 'class="form-errors"' in html and f"<b>{field}</b>:" in html, html[-2000:]


@pytest.mark.parametrize("path", ["/proofs/?status=%00", "/admin/proofs/proofjob/?status=%00",
                                  "/?x%00=1", "/events/?a=1&a=b%00"])
def test_a_nul_in_any_query_string_is_a_400(world, path):
    response = world["clients"]["staff"].get(path)
    assert response.status_code == 400
    assert response.content == b"A query parameter holds a NUL character."


# The admin's changelists read every query parameter as a lookup; the values most likely to
# break a database query go into each parameter a changelist understands.
DATABASE_HAZARDS = ["99999999999999999999999", "9223372036854775808", "²", "9" * 5000, "1.5",
                    "' OR 1=1 --"]


def admin_lookups(model_admin) -> list[str]:
    names = ["q", "o", "p", "id__gt", "pk__in"]
    for field in model_admin.model._meta.get_fields():
        if field.concrete:
            names.append(f"{field.name}__id__exact" if field.is_relation
                         else f"{field.name}__exact")
    return names


def test_no_admin_changelist_or_object_page_gets_a_5xx(world, django_user_model):
    from django.contrib import admin

    root = Client()
    root.force_login(django_user_model.objects.create_superuser("root"))
    for model, model_admin in admin.site._registry.items():
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for value in DATABASE_HAZARDS:
            for name in admin_lookups(model_admin):
                response = root.get(base, {name: value})
                assert response.status_code < 500, f"{base}?{name}={value!r}"
            response = root.get(base + urllib.parse.quote(value, safe="") + "/change/")
            assert response.status_code < 500, f"{base}{value!r}/change/"


def test_a_good_filter_still_filters(world):
    machine_pk = world["known"]["int"][0]
    html = world["clients"]["staff"].get(f"/proofs/?machine={machine_pk}&kind=porep-c2")
    assert "No proofs match these filters" in html.content.decode()


@pytest.mark.parametrize("route,name,pattern", ROUTES, ids=[r or "/" for r, _, _ in ROUTES])
def test_no_request_to_any_view_gets_a_5xx(world, monkeypatch, route, name, pattern):
    known = dict(world["known"], int=[0]) if name in NO_EXISTING_MACHINE else world["known"]
    clients = world["clients"]
    sample = fill(route, pattern, lambda kind, _: known[kind][0] if kind in known
                  else SAMPLES.get(kind, "x"))
    names = sorted(set(names_read(monkeypatch, lambda: clients["staff"].get(sample)))
                   | set(names_read(monkeypatch, lambda: clients["staff"].post(sample))))

    def check(who, method, path, query):
        response = (clients[who].get if method == "GET" else clients[who].post)(path, query)
        assert response.status_code < 500, f"{who} {method} {path} {query!r}"

    # Every tricky value in every name the view reads, then hypothesis for the mixtures.
    for value in TRICKY_VALUES if names else []:
        for method in ("GET", "POST"):
            check("staff", method, sample, dict.fromkeys(names, value))

    @EXAMPLES
    @given(data=st.data(), method=st.sampled_from(["GET", "POST"]), query=params(names),
           who=st.sampled_from(["staff", "non-staff"]))
    def mixtures(data, method, query, who):
        check(who, method,
              fill(route, pattern, lambda kind, label: data.draw(segments(kind, known), label)),
              query)

    mixtures()


@pytest.mark.parametrize("key,message", [
    ("", "the API key is empty"),
    ("abc\r\nX-Injected: 1", "no spaces or line breaks; found U+000A, U+000D, ' '"),
    ("ab cd", "found ' '"),
    ("clé", "found 'é'"),
    ("k" * 201, "longer than 200 characters"),
])
def test_an_invalid_api_key_is_refused_with_what_is_wrong_and_never_stored(world, key, message):
    response = world["clients"]["staff"].post("/remote/offers/api-key/", {"api_key": key},
                                              follow=True)
    html = response.content.decode().replace("&#x27;", "'")
    assert "API key not stored: " in html and message in html
    assert not Secret.is_set(Secret.VAST_API_KEY)
    if len(key) > 3:
        assert key not in html


def test_a_valid_api_key_is_stored(world):
    world["clients"]["staff"].post("/remote/offers/api-key/", {"api_key": "0123abcdef" * 6})
    assert Secret.reveal(Secret.VAST_API_KEY) == "0123abcdef" * 6
