from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "vastmgr.api"
    verbose_name = "JSON API"
