from django.urls import path, re_path

from vastmgr.front.consumers import FleetConsumer, MachineConsumer, NoSuchSocket, PushConsumer
from vastmgr.front.proof_consumers import ProofConsumer, ProofListConsumer

websocket_urlpatterns = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
    path("ws/machines/<int:machine_id>/", MachineConsumer.as_asgi()),
    path("ws/proofs/", ProofListConsumer.as_asgi()),
    path("ws/proofs/<uuid:job_id>/", ProofConsumer.as_asgi()),
    path("ws/push/", PushConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
