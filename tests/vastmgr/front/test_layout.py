"""Layout and wording: error pages with navigation (the 500 page even when the request's
context is broken), phase colours that stay apart for colour-blind eyes, a dark mode, red form
errors, plain-language labels and messages, and no SSH actions on a machine without SSH."""

import re

import pytest
from django.contrib.auth.models import User

from cuzk_engine.vocabulary import PARTITION_PHASES
from tests.conftest import REPO
from vastmgr.fleet.models import Machine
from vastmgr.front.error_pages import server_error
from vastmgr.lib.errors import SecretUnavailable
from vastmgr.remote.models import Secret

CSS = (REPO / "static" / "vastmgr" / "app.css").read_text()


def test_the_500_page_renders_without_any_request_context():
    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("the session store is down")

    from django.urls import get_resolver

    assert get_resolver().resolve_error_handler(500) is server_error
    response = server_error(Broken())
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in html
    assert 'href="/proofs/"' in html and 'href="/events/"' in html and "<nav>" in html


@pytest.mark.django_db
def test_404_page_has_navigation(admin_client):
    html = admin_client.get("/no/such/page/").content.decode()
    assert "Page not found" in html and "/no/such/page/" in html and 'href="/"' in html


def light_colours() -> dict[str, str]:
    root = CSS.split(":root {", 1)[1].split("}", 1)[0]
    return dict(re.findall(r"--phase-([a-z_]+):(#[0-9a-f]{6})", root))


def srgb_to_linear(hex_colour: str) -> list[float]:
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]


# Viénot, Brettel & Mollon (1999) dichromat simulation in linear RGB.
SIMULATIONS = {
    "normal": [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
    "protanopia": [[0.1124, 0.8876, 0], [0.1124, 0.8876, 0], [0.0040, -0.0040, 1]],
    "deuteranopia": [[0.2927, 0.7073, 0], [0.2927, 0.7073, 0], [-0.0223, 0.0223, 1]],
}
# CIELAB ΔE76 below which two swatches are easy to confuse. The old pair of blues for
# synthesizing/synth_done (#90cdf4, #c3dafe) scores 12.9 with normal vision, 6.6 with protanopia.
MIN_DELTA_E = 15


def lab(colour: str, matrix) -> tuple[float, float, float]:
    r, g, b = (sum(m * c for m, c in zip(row, srgb_to_linear(colour), strict=True))
               for row in matrix)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t):
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e(a: str, b: str, matrix) -> float:
    return sum((p - q) ** 2 for p, q in zip(lab(a, matrix), lab(b, matrix), strict=True)) ** 0.5


def test_the_old_blues_would_fail_this_check():
    assert delta_e("#90cdf4", "#c3dafe", SIMULATIONS["normal"]) < MIN_DELTA_E


@pytest.mark.parametrize("vision", SIMULATIONS)
def test_active_partition_phases_stay_distinct_for_colour_blind_eyes(vision):
    colours = light_colours()
    assert set(PARTITION_PHASES) <= set(colours)
    active = ["synthesizing", "synth_done", "gpu", "finalizing", "done", "failed"]
    for i, a in enumerate(active):
        for b in active[i + 1:]:
            distance = delta_e(colours[a], colours[b], SIMULATIONS[vision])
            assert distance > MIN_DELTA_E, f"{a} and {b} look alike with {vision}: {distance:.1f}"


def test_dark_mode_follows_the_system_and_colours_come_from_variables():
    dark = CSS.split("@media (prefers-color-scheme: dark)", 1)[1]
    for name in ("--bg", "--surface", "--fg", "--line"):
        assert f"{name}:" in dark.split("}", 1)[0]
    # outside the variable blocks no rule paints a fixed white surface any more
    rules = CSS.split("@media (prefers-color-scheme: dark)")[0].split("}", 1)[1]
    assert "background:#fff" not in rules


def test_form_errors_are_red():
    assert re.search(r"\.error, \.msg-error, \.errorlist \{ color:var\(--bad\); \}", CSS)


@pytest.mark.django_db
def test_a_missing_vast_key_is_explained_in_plain_words():
    with pytest.raises(SecretUnavailable) as missing:
        Secret.reveal(Secret.VAST_API_KEY)
    assert str(missing.value) == "Enter your Vast API key first (at the top of the Offers page)"


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", password="pw-123456789", is_staff=True))
    return client


@pytest.mark.django_db
def test_offer_filters_have_plain_labels(staff):
    html = staff.get("/remote/offers/").content.decode()
    assert ">Max $/h:</label>" in html and ">GPU name:</label>" in html
    assert "Max dph" not in html and "Gpu name" not in html


@pytest.mark.django_db
def test_the_local_machine_offers_no_ssh_actions(staff):
    local = Machine.objects.create(name="local", provider="local", host="127.0.0.1")
    html = staff.get(f"/remote/machines/{local.pk}/").content.decode()
    for action in ("provision", "stop", "restart", "upgrade", "clear-host-key"):
        assert f"/{action}/" not in html, action
    assert "no SSH" in html and "engine-log" not in html and "Host key" not in html
    response = staff.post(f"/remote/machines/{local.pk}/provision/", follow=True)
    assert "local engine without SSH" in response.content.decode()
    ssh = Machine.objects.create(name="rented", provider="ssh", host="127.0.0.5")
    assert f"/remote/machines/{ssh.pk}/provision/" in staff.get(
        f"/remote/machines/{ssh.pk}/").content.decode()


@pytest.mark.django_db
def test_a_stale_form_gets_a_plain_403_page_with_navigation():
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("op", password="pw-123456789"))
    response = client.post("/proofs/new/", {"kind": "winning-post"})
    html = response.content.decode()
    assert response.status_code == 403
    assert "security token no longer matches" in html and "<nav>" in html
