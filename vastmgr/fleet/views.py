from django.shortcuts import render

from .models import Event, Machine


def fleet(request):
    return render(request, "fleet/fleet.html", {"machines": Machine.objects.all()})


def events(request):
    return render(request, "fleet/events.html", {"events": Event.objects.select_related("machine")[:200]})


def offers(request):
    return render(request, "fleet/offers.html")
