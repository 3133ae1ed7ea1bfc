from django.apps import AppConfig


class RemoteConfig(AppConfig):
    name = "vastmgr.remote"
    verbose_name = "Remote machines"
