from django.urls import path

from vastmgr.remote import views, webhooks

app_name = "remote"

urlpatterns = [
    path("machines/add/", views.add_machine, name="add_machine"),
    path("machines/command/", views.run_command, name="command"),
    path("machines/<int:pk>/", views.machine_detail, name="machine"),
    path("machines/<int:pk>/events/", views.machine_events, name="machine_events"),
    path("machines/<int:pk>/log/", views.machine_log, name="machine_log"),
    path("machines/<int:pk>/<slug:action>/", views.machine_action, name="machine_action"),
    path("offers/", views.offers, name="offers"),
    path("offers/api-key/", views.set_api_key, name="set_api_key"),
    path("offers/rent/", views.rent_offers, name="rent"),
    path("offers/ignore/", views.ignore_offers, name="ignore_offers"),
    path("vast/webhook/", webhooks.receive, name="vast_webhook"),
    path("bad-machines/", views.bad_machines, name="bad_machines"),
    path("provider-log/", views.provider_log, name="provider_log"),
    path("bad-machines/<int:pk>/unmark/", views.unmark_bad_machine, name="unmark_bad_machine"),
]
