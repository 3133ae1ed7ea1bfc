from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "vastmgr.fleet"
    verbose_name = "Fleet"
