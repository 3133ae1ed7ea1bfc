from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "vastmgr.autopilot"
    verbose_name = "Fleet autopilot"
