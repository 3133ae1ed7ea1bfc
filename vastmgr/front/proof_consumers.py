"""The proofs' websockets: a proof's page gets its panel now, then every update the controller
pushes; the Proofs list gets its table for its query now, then the rows the controller pushes,
and the whole table again when a job joins it (`proof_table.tell_list_pages`)."""

from channels.db import database_sync_to_async
from django.http import QueryDict

from vastmgr.front import proof_panel, proof_table
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


class ProofListConsumer(FragmentConsumer):
    group = proof_table.PROOFS_GROUP

    def current_state(self) -> str:
        return proof_table.render_table(QueryDict(self.scope.get("query_string", b"")))

    async def proofs_changed(self, event) -> None:
        await self.send_current_state()
