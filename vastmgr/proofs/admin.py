from django.contrib import admin

from vastmgr.lib.params import FilterLookupsOnly
from vastmgr.proofs.models import ProofJob


@admin.register(ProofJob)
class ProofJobAdmin(FilterLookupsOnly, admin.ModelAdmin):
    list_display = ["id", "kind", "profile", "seed", "status", "machine", "verified", "submitted_at"]
    list_filter = ["status", "kind", "profile"]
    readonly_fields = ["status", "started_at", "finished_at", "timings", "verified", "error"]
    exclude = ["proof"]
