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
