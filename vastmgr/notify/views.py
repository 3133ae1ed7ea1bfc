"""The Notifications page (staff): channels, their rules, a test button and the delivery log."""

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from vastmgr.lib.http import staff_only
from vastmgr.notify.forms import ChannelForm
from vastmgr.notify.models import Channel, Delivery
from vastmgr.notify.outbox import send_test

RECENT_DELIVERIES = 50


@staff_only
def channels(request: HttpRequest) -> HttpResponse:
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            channel = form.save()
        messages.info(request, f"Channel {channel.name} added; its URL is stored encrypted")
        return redirect("notify:channels")
    return render(request, "notify/channels.html", {
        "form": form, "channels": Channel.objects.all(),
        "deliveries": Delivery.objects.select_related("channel")[:RECENT_DELIVERIES],
    }, status=400 if form.errors else 200)


@staff_only
@require_POST
def test_channel(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    delivery = send_test(channel, request.user)
    return render(request, "notify/_test_result.html", {"channel": channel, "d": delivery})


@staff_only
@require_POST
def delete_channel(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    with transaction.atomic():
        channel.delete()
    messages.info(request, f"Channel {channel.name} deleted")
    return redirect("notify:channels")
