# One word per thing: the models of a machine are named for it (tables renamed with them).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('autopilot', '0001_initial'),
        ('fleet', '0006_machine_vocabulary'),
    ]

    operations = [
        migrations.RenameModel(
            old_name='ManagedHost',
            new_name='ManagedMachine',
        ),
    ]
