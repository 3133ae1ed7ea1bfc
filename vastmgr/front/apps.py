from django.apps import AppConfig


class FrontConfig(AppConfig):
    name = "vastmgr.front"
    verbose_name = "Pages"
