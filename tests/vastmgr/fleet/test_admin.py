"""The admin works for a superuser and never shows the engine token."""

import pytest
from django.contrib import admin
from django.urls import reverse

from vastmgr.fleet.models import Event, Machine
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


def test_every_registered_model_admin_loads(admin_client):
    m = Machine.objects.create(name="gpu-1", engine_token="tok-abcdef123456")
    job = ProofJob.objects.create(kind="snap-update", seed=3, machine=m)
    ev = Event.record("test", "an event", machine=m)
    objects = {Machine: m, ProofJob: job, Event: ev}
    assert admin_client.get("/admin/").status_code == 200
    for model in admin.site._registry:
        meta = model._meta
        base = f"admin:{meta.app_label}_{meta.model_name}"
        assert admin_client.get(reverse(f"{base}_changelist")).status_code == 200, meta
        if model in objects:
            url = reverse(f"{base}_change", args=[objects[model].pk])
            assert admin_client.get(url).status_code == 200, meta


def test_engine_token_is_not_rendered_in_admin(admin_client):
    m = Machine.objects.create(name="gpu-1", engine_token="tok-abcdef123456")
    for url in [reverse("admin:fleet_machine_changelist"),
                reverse("admin:fleet_machine_change", args=[m.pk])]:
        assert b"tok-abcdef123456" not in admin_client.get(url).content


def test_saving_a_machine_without_a_token_keeps_the_old_one(admin_client):
    m = Machine.objects.create(name="gpu-1", engine_token="tok-keep-me")
    url = reverse("admin:fleet_machine_change", args=[m.pk])
    data = {"name": "gpu-1", "provider": "ssh", "host": "h", "ssh_port": 22, "ssh_user": "root",
            "engine_port": 9821, "engine_token": "", "engine_flavour": "cuzk_engine",
            "enabled": "on", "gpu_name": "",
            "gpu_count": 0, "ssh_host_key": ""}
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content[:2000]
    assert Machine.objects.get(pk=m.pk).engine_token == "tok-keep-me"


def test_events_cannot_be_edited_or_deleted_in_admin(admin_client):
    ev = Event.record("test", "immutable")
    change = admin_client.post(reverse("admin:fleet_event_change", args=[ev.pk]),
                               {"kind": "x", "message": "y", "level": "info", "data": "{}"})
    assert change.status_code == 403
    delete = admin_client.post(reverse("admin:fleet_event_delete", args=[ev.pk]), {"post": "yes"})
    assert delete.status_code == 403
    assert Event.objects.get(pk=ev.pk).message == "immutable"
