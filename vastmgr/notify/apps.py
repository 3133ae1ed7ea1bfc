from django.apps import AppConfig
from django.db.models.signals import post_save


class NotifyConfig(AppConfig):
    name = "vastmgr.notify"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from vastmgr.fleet.models import Event
        from vastmgr.notify.outbox import enqueue

        # Every Event, from any process, passes through here in its own transaction: a rolled
        # back Event leaves no delivery behind.
        post_save.connect(enqueue, sender=Event, dispatch_uid="vastmgr.notify.enqueue")
