from django.apps import AppConfig


class ProofsConfig(AppConfig):
    name = "vastmgr.proofs"
    verbose_name = "Proofs"
