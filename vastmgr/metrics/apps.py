from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "vastmgr.metrics"
    verbose_name = "Metrics"
