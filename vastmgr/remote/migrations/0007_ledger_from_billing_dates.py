"""Open the ledger with what was known before it: each rental billed its machine's price from
its billing start to its billing end (one running interval)."""

from django.db import migrations


def seed_ledger(apps, schema_editor):
    RemoteMachine = apps.get_model("remote", "RemoteMachine")
    BillingInterval = apps.get_model("fleet", "BillingInterval")
    for remote in RemoteMachine.objects.select_related("machine").filter(
            billing_started__isnull=False, machine__price_per_hour__isnull=False):
        machine = remote.machine
        if BillingInterval.objects.filter(machine=machine).exists():
            continue
        BillingInterval.objects.create(
            machine=machine, machine_name=machine.name, kind="running",
            dollars_per_hour=machine.price_per_hour, gpus=machine.gpu_count,
            started_at=remote.billing_started, ended_at=remote.billing_ended,
            cause="before the ledger")


class Migration(migrations.Migration):
    dependencies = [
        ("remote", "0006_machine_vocabulary"),
        ("fleet", "0007_billing_ledger"),
    ]

    operations = [migrations.RunPython(seed_ledger, migrations.RunPython.noop)]
