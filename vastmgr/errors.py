"""The 500 page: base.html's navigation without any context processor (the failure may be in
the session, the database or the user lookup that they need)."""

from django.http import HttpResponseServerError
from django.template import loader


def server_error(request, template_name="500.html"):
    template = loader.get_template(template_name)
    return HttpResponseServerError(template.render({"error_page": True}))
