from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "vastmgr.ops"
    verbose_name = "Operations"
