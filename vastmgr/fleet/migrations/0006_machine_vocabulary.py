# One word per thing: the models of a machine are named for it (tables renamed with them).

from django.conf import settings
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_host_leases'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RenameModel(
            old_name='HostAction',
            new_name='MachineAction',
        ),
        migrations.RenameModel(
            old_name='HostLease',
            new_name='MachineLease',
        ),
        migrations.RenameModel(
            old_name='HostSample',
            new_name='MachineSample',
        ),
        migrations.RenameModel(
            old_name='HostStatus',
            new_name='MachineStatus',
        ),
        migrations.RenameIndex(
            model_name='machinesample',
            new_name='fleet_machi_machine_b14e2e_idx',
            old_name='fleet_hosts_machine_a45786_idx',
        ),
    ]
