import pytest
from django.utils import timezone

from vastmgr.remote.models import Secret
from vastmgr.remote.vast import VastClient

API_KEY = "vast-autopilot-test-key-0123456789"


@pytest.fixture
async def fake_vast():
    """The strict Vast fake with a small market: 4090s with bench history, and others."""
    from devtools.fake_vast import FakeVast

    vast = FakeVast(API_KEY)
    await vast.start()
    yield vast
    await vast.stop()


class Clock:
    """The pilot's injected clock: moved by the test."""

    def __init__(self):
        self.at = timezone.now()

    def __call__(self):
        return self.at


async def no_sleep(_seconds):
    return None


@pytest.fixture
def client(fake_vast):
    """A Vast client on the fake, its key stored as the dashboard stores it."""
    Secret.store(Secret.VAST_API_KEY, API_KEY)
    return VastClient(API_KEY, fake_vast.url, sleep=no_sleep)
