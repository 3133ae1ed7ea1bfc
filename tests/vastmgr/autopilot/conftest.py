import pytest

API_KEY = "vast-autopilot-test-key-0123456789"


@pytest.fixture
async def fake_vast():
    """The strict Vast fake with a small market: 4090s with bench history, and others."""
    from tests.vastmgr.remote.fake_vast import FakeVast

    vast = FakeVast(API_KEY)
    await vast.start()
    yield vast
    await vast.stop()
