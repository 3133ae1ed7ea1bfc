"""The API tokens page: a person creates tokens for their scripts (each shown once) and
revokes them."""

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from vastmgr.api.models import ApiToken
from vastmgr.lib.http import AuthenticatedHttpRequest


class TokenForm(forms.Form):
    name = forms.CharField(max_length=ApiToken.NAME_MAX,
                           help_text="what the token is for, e.g. the script that uses it")


def tokens(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        row, token = ApiToken.issue(request.user, form.cleaned_data["name"])
        # Rendered, not redirected: the token is shown this once and stored nowhere in clear.
        return render(request, "api/tokens.html", {
            "form": TokenForm(), "tokens": ApiToken.objects.filter(user=request.user), "new_token": token,
            "new_row": row})
    return render(request, "api/tokens.html", {"form": form,
                                               "tokens": ApiToken.objects.filter(user=request.user)},
                  status=400 if form.errors else 200)


@require_POST
def revoke(request: AuthenticatedHttpRequest, token_id: int) -> HttpResponse:
    row = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    row.delete()
    messages.info(request, f"Token {row.name!r} revoked: scripts using it are refused now.")
    return redirect("api-tokens")
