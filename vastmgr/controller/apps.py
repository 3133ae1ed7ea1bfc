from django.apps import AppConfig


class ControllerConfig(AppConfig):
    name = "vastmgr.controller"
    verbose_name = "Fleet controller"
