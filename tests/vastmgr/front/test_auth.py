"""Every page needs a logged-in user; login and logout use our own templates."""

import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

# Views Django deliberately leaves open: the login forms and password-reset flow; the JSON
# API's schema and its docs page (they describe the API and hold no data), and django-ninja's
# root views (a 404 for everyone; they exist for reverse()).
OPEN_VIEWS = {"login", "password_reset", "password_reset_done", "password_reset_confirm",
              "password_reset_complete", "admin:login", "logout", "api-v1:openapi-json",
              "api-v1:openapi-view", "api-v1:api-root", "vast-manager:api-root"}
# The JSON APIs answer scripts themselves: 401 without a token, never a login page.
API_NAMESPACES = ("api-v1:", "vast-manager:")
# Prometheus's scrape endpoints: a bearer token, or a direct loopback connection (not a login).
SCRAPE_VIEWS = {"metrics", "metrics-engines"}
# Vast's notifications: no login, every delivery signed (tests/vastmgr/remote/test_vast_webhooks.py
# refuses an unsigned, forged, stale or replayed one).
SIGNED_VIEWS = {"remote:vast_webhook"}
SAMPLE_KWARGS = {"int": 1, "str": "x", "slug": "x", "uuid": uuid.uuid4(), "path": "x"}


def iter_patterns(resolver, prefix="", namespace=""):
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from iter_patterns(entry, prefix + str(entry.pattern), ns)
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), f"{namespace}{entry.name}" if entry.name else None, entry


def sample_path(route: str, pattern) -> str | None:
    """A concrete path for a route, filling converters with sample values; None for regexes."""
    converters = getattr(pattern.pattern, "converters", None)
    if route.startswith("^") or (converters is None and "<" in route):
        return None
    path = route
    for name, converter in (converters or {}).items():
        kind = type(converter).__name__.replace("Converter", "").lower()
        value = SAMPLE_KWARGS.get(kind, "1")
        path = path.replace(f"<{kind}:{name}>", str(value)).replace(f"<{name}>", str(value))
    return "/" + path


def all_protected_paths(api: bool = False):
    """The pages' paths, or with `api` the JSON APIs' paths."""
    paths = []
    for route, name, pattern in iter_patterns(get_resolver()):
        if name in OPEN_VIEWS | SCRAPE_VIEWS | SIGNED_VIEWS or (name or "").startswith(API_NAMESPACES) != api:
            continue
        path = sample_path(route, pattern)
        if path is not None:
            paths.append(path)
    return paths


def test_the_url_conf_has_pages_to_check():
    paths = all_protected_paths()
    assert "/" in paths and "/proofs/" in paths and "/admin/" in paths


@pytest.mark.django_db
def test_every_url_redirects_an_anonymous_user_to_a_login_page(client):
    for path in all_protected_paths():
        response = client.get(path)
        assert response.status_code == 302, f"{path} answered {response.status_code} to anonymous"
        assert "login" in response["Location"], f"{path} redirected to {response['Location']}"


@pytest.mark.django_db
def test_every_api_path_refuses_an_anonymous_script_with_401(client):
    paths = all_protected_paths(api=True)
    assert "/api/v1/machines" in paths and "/api/dashboard" in paths
    for path in paths:
        answers = {client.get(path).status_code, client.post(path).status_code}
        # 405: the path takes the other method; nothing is answered before authentication.
        assert 401 in answers and answers <= {401, 405}, f"{path} answered {answers}"


@pytest.mark.django_db
def test_login_page_and_logout_round_trip(client, django_user_model):
    django_user_model.objects.create_user("op", password="correct horse battery")
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Log in" in page.content
    bad = client.post("/accounts/login/", {"username": "op", "password": "wrong"})
    assert bad.status_code == 200 and b"didn't match" in bad.content
    good = client.post("/accounts/login/", {"username": "op", "password": "correct horse battery"})
    assert good.status_code == 302 and good["Location"] == "/"
    assert client.get("/").status_code == 200
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_pages_render_navigation_for_a_logged_in_user(client, django_user_model):
    user = django_user_model.objects.create_user("op", password="pw-for-tests-1")
    client.force_login(user)
    for path in ["/", "/proofs/", "/remote/offers/", "/events/"]:
        body = client.get(path).content.decode()
        for label in ["Fleet", "Proofs", "Offers", "Events", 'id="connection-badge"']:
            assert label in body, (path, label)


@pytest.mark.django_db
def test_scrape_endpoints_refuse_an_anonymous_client_from_another_address(client):
    for path in ("/metrics", "/metrics/engines"):
        response = client.get(path, REMOTE_ADDR="203.0.113.7")
        assert response.status_code == 403, f"{path} answered {response.status_code}"
