from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "vastmgr.instances"
    verbose_name = "Instance call-home protocol"
