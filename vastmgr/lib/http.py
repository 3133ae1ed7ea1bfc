"""The request type every view is annotated with."""

from django.contrib.auth.models import User
from django.http import HttpRequest


class AuthenticatedHttpRequest(HttpRequest):
    """A request that reached one of our views: LoginRequiredMiddleware (settings) sends every
    anonymous one to the login page first, so its user is a signed-in User. For the type checker
    only; Django still builds plain HttpRequests."""

    user: User
