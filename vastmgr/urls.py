from django.contrib import admin
from django.urls import include, path

from vastmgr.fleet import views as fleet_views
from vastmgr.proofs import views as proof_views

urlpatterns = [
    path("", fleet_views.fleet, name="fleet"),
    path("events/", fleet_views.events, name="events"),
    path("offers/", fleet_views.offers, name="offers"),
    path("proofs/", proof_views.proof_list, name="proofs"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
