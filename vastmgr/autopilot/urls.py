from django.urls import path

from vastmgr.autopilot import views

app_name = "autopilot"

urlpatterns = [
    path("", views.page, name="page"),
    path("live/", views.live, name="live"),
    path("mode/", views.set_mode, name="mode"),
    path("limits/", views.set_limits, name="limits"),
    path("plan/", views.plan_now, name="plan"),
    path("proposals/<int:pk>/approve/", views.approve, name="approve"),
]
