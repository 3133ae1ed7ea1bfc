"""The proof page's websocket: the proof's panel now, then every update the controller pushes."""

from channels.db import database_sync_to_async

from vastmgr.front import proof_panel
from vastmgr.front.consumers import FragmentConsumer
from vastmgr.proofs.models import ProofJob


class ProofConsumer(FragmentConsumer):
    def get_group(self) -> str:
        return proof_panel.proof_group(self.scope["url_route"]["kwargs"]["job_id"])

    @database_sync_to_async
    def exists(self) -> bool:
        return ProofJob.objects.filter(pk=self.scope["url_route"]["kwargs"]["job_id"]).exists()

    def current_state(self) -> str:
        job = ProofJob.objects.select_related("machine").get(
            pk=self.scope["url_route"]["kwargs"]["job_id"])
        return proof_panel.render_proof(job)
