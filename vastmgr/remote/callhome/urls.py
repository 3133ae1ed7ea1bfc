"""The call-home listener's URLconf (vastmgr.remote.callhome.asgi): vast-manager's instance-facing
routes and nothing else; the dashboard's routes are not reachable on this port."""

from django.urls import path

from vastmgr.remote.callhome import views

urlpatterns = [
    path("register", views.register),
    path("param-done", views.param_done),
    path("bench-done", views.bench_done),
    path("runner-id", views.runner_id),
    path("running", views.running),
    path("status", views.status),
    path("bad-host", views.bad_host),
    path("bad-host/<str:machine_id>", views.bad_machine_delete),
    path("api/log-push", views.log_push),
]

handler400 = "vastmgr.remote.callhome.views.bad_request"
handler404 = "vastmgr.remote.callhome.views.not_found"
handler500 = "vastmgr.remote.callhome.views.server_error"
