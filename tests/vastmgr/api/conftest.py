import asyncio
import threading

import pytest
from django.contrib.auth.models import User

from vastmgr.api.models import ApiToken


@pytest.fixture
def tokens(db) -> dict[str, str]:
    """A bearer header per kind of person: staff and a signed-in non-staff user."""
    staff = User.objects.create_user("ops", password="pw-ops-123456", is_staff=True)
    viewer = User.objects.create_user("viewer", password="pw-viewer-123456")
    return {name: f"Bearer {ApiToken.issue(user, 'tests')[1]}"
            for name, user in (("staff", staff), ("viewer", viewer))}


VAST_KEY = "vast-api-schema-key-0123456789abcdef"


@pytest.fixture
def vast_configured(settings, db):
    """The strict fake Vast on its own loop in a thread, with a key stored and the dashboard
    pointed at it: the routes that need a provider run their whole path, not just the guard
    that answers 409 when no key is set (which once hid a 500 on every offers query)."""
    from devtools.fake_vast import FakeVast
    from vastmgr.remote.config import RemoteSettings
    from vastmgr.remote.models import Secret

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeVast(VAST_KEY)
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(30)
    for machine_id, gpus in ((40001, 1), (40002, 2)):
        fake.add_offer(gpu_name="RTX 4090", num_gpus=gpus, machine_id=machine_id)
    settings.VASTMGR_REMOTE = RemoteSettings(vast_url=fake.url)
    Secret.store(Secret.VAST_API_KEY, VAST_KEY)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
