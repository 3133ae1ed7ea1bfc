from django.contrib import admin
from django.urls import include, path

from vastmgr.front import detail as fleet_detail
from vastmgr.front import fleet_views, proof_views
from vastmgr.metrics import views as metrics_views

urlpatterns = [
    path("", fleet_views.fleet, name="fleet"),
    path("machines/<int:machine_id>/", fleet_views.machine_panel, name="machine-panel"),
    path("machines/<int:machine_id>/srs/", fleet_views.machine_srs, name="machine-srs"),
    path("machines/<int:machine_id>/benchmarks/", fleet_views.machine_benchmark,
         name="machine-benchmark"),
    path("machines/<int:machine_id>/benchmarks/<int:benchmark_id>/cancel/",
         fleet_views.machine_benchmark_cancel, name="machine-benchmark-cancel"),
    path("events/", fleet_views.events, name="events"),
    path("offers/", fleet_views.offers, name="offers"),
    path("proofs/", proof_views.proof_list, name="proofs"),
    path("proofs/new/", proof_views.new_proof, name="proof-new"),
    path("proofs/<uuid:job_id>/", proof_views.proof_detail, name="proof"),
    path("proofs/<uuid:job_id>/cancel/", proof_views.proof_cancel, name="proof-cancel"),
    path("proofs/<uuid:job_id>/retry/", proof_views.proof_retry, name="proof-retry"),
    path("proofs/<uuid:job_id>/<str:name>", proof_views.proof_download, name="proof-download"),
    path("fragments/fleet/", fleet_views.fleet_fragment, name="fleet-fragment"),
    path("fragments/fleet/<int:machine_id>/detail/", fleet_detail.row_detail,
         name="fleet-row-detail"),
    path("fragments/fleet/<int:machine_id>/logs/", fleet_detail.row_logs, name="fleet-row-logs"),
    path("fragments/machines/<int:machine_id>/", fleet_views.machine_fragment, name="machine-fragment"),
    path("fragments/machines/<int:machine_id>/charts/", fleet_views.machine_charts,
         name="machine-charts"),
    path("fragments/machines/<int:machine_id>/state/", fleet_views.machine_state,
         name="machine-state"),
    path("fragments/proofs/", proof_views.proof_table_fragment, name="proofs-fragment"),
    path("fragments/proofs/<uuid:job_id>/", proof_views.proof_fragment, name="proof-fragment"),
    path("remote/", include("vastmgr.remote.urls")),
    path("notify/", include("vastmgr.notify.urls")),
    path("api/", include("vastmgr.api.urls")),
    path("autopilot/", include("vastmgr.autopilot.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("metrics", metrics_views.fleet_metrics, name="metrics"),
    path("metrics/engines", metrics_views.engine_metrics, name="metrics-engines"),
]

# Error pages extend base.html for the navigation; a 500 is rendered without the request's
# context processors (they may be what failed).
handler500 = "vastmgr.front.error_pages.server_error"
