"""The project's own pages, outside any app."""

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader


def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    """The 500 page: base.html's navigation without any context processor (the failure may be
    in the session, the database or the user lookup that they need)."""
    template = loader.get_template(template_name)
    return HttpResponseServerError(template.render({"error_page": True}))
