from django.apps import AppConfig


class RemoteConfig(AppConfig):
    name = "vastmgr.remote"
    verbose_name = "Remote machines"

    def ready(self) -> None:
        from vastmgr.fleet.transport import register_transport
        from vastmgr.remote.tunnel import SSHTunnelTransport

        register_transport("ssh", SSHTunnelTransport.for_machine)
        register_transport("vast", SSHTunnelTransport.for_machine)
