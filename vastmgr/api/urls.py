from django.contrib.auth.decorators import login_not_required
from django.urls import URLPattern, URLResolver, path

from vastmgr.api import vast_manager, views
from vastmgr.api.dashboard import compat
from vastmgr.api.v1 import api


def _own_auth(patterns: list) -> list:
    """The API answers 401 itself (token or session); the site's login redirect is not for
    scripts."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            _own_auth(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            pattern.callback = login_not_required(pattern.callback)
    return patterns


v1_patterns, v1_app, v1_namespace = api.urls
# vast_manager's routes join `compat` when imported (above), before its URLs are read.
assert vast_manager.compat is compat
compat_patterns, compat_app, compat_namespace = compat.urls

urlpatterns = [
    path("v1/", (_own_auth(v1_patterns), v1_app, v1_namespace)),
    path("", (_own_auth(compat_patterns), compat_app, compat_namespace)),
    path("tokens/", views.tokens, name="api-tokens"),
    path("tokens/<int:token_id>/revoke/", views.revoke, name="api-token-revoke"),
]
