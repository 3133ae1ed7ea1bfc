"""The request type every view is annotated with, and the staff-only guard."""

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

P = ParamSpec("P")


class AuthenticatedHttpRequest(HttpRequest):
    """A request that reached one of our views: LoginRequiredMiddleware (settings) sends every
    anonymous one to the login page first, so its user is a signed-in User. For the type checker
    only; Django still builds plain HttpRequests."""

    user: User


def staff_only(view: Callable[P, HttpResponse]) -> Callable[P, HttpResponse]:
    """For pages and actions only staff may use: anyone else gets our 403 page saying so
    (LoginRequiredMiddleware has already sent anonymous visitors to log in). Django admin's
    staff_member_required sent a signed-in colleague to the admin's login instead, which read
    as a broken session."""

    @wraps(view)
    def only_staff(*args: P.args, **kwargs: P.kwargs) -> HttpResponse:
        request = args[0]
        assert isinstance(request, HttpRequest)
        if not request.user.is_staff:
            raise PermissionDenied(STAFF_ONLY)
        return view(*args, **kwargs)

    return only_staff


STAFF_ONLY = ("Only staff may use this page. Your account can watch the fleet, run test proofs "
              "and follow them; ask an administrator if you need more.")
