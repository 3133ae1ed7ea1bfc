"""The call-home listener: Django serving only the instance protocol's URLconf, bound on its
own port (`manage.py serve_callhome`, started by `up`), so rented instances never reach the
dashboard and the dashboard's port need not be open to them."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vastmgr.settings")

import django
from django.core.handlers.asgi import ASGIHandler

django.setup(set_prefix=False)

URLCONF = "vastmgr.remote.callhome.urls"


class CallHomeHandler(ASGIHandler):
    def create_request(self, scope, body_file):
        request, error = super().create_request(scope, body_file)
        if request is not None:
            request.urlconf = URLCONF  # type: ignore[attr-defined]  # resolved against the protocol's routes only
        return request, error


application = CallHomeHandler()
