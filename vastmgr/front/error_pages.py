"""The project's own pages, outside any app."""

import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader

from vastmgr.lib.storage import full_message, is_disk_full

log = logging.getLogger("vastmgr.front")

INSUFFICIENT_STORAGE = 507


def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    """The 500 page: base.html's navigation without any context processor (the failure may be
    in the session, the database or the user lookup that they need)."""
    template = loader.get_template(template_name)
    return HttpResponseServerError(template.render({"error_page": True}))


class DiskFullMiddleware:
    """A request that failed because the data directory's disk is full (SQLite's database
    lives there in the embedded mode) is answered 507 with a page that says so and where to
    free space, not the 500 page: nothing was saved, and the same request works once there is
    room."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_disk_full(exception):
            return None
        message = full_message(settings.DATA_DIR)
        log.error("%s %s: %s", request.method, request.path, message)
        page = loader.get_template("507.html").render({"error_page": True, "message": message})
        return HttpResponse(page, status=INSUFFICIENT_STORAGE)
