# One word per thing: the models of a machine are named for it (tables renamed with them).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0006_machine_vocabulary'),
        ('remote', '0005_rent_env_in_secrets'),
    ]

    operations = [
        migrations.RenameModel(
            old_name='BadHost',
            new_name='BadMachine',
        ),
        migrations.RenameModel(
            old_name='HostPerf',
            new_name='MachinePerf',
        ),
        migrations.RenameModel(
            old_name='RemoteHost',
            new_name='RemoteMachine',
        ),
    ]
