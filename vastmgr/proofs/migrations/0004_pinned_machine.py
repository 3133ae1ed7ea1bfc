from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("proofs", "0003_cancel_and_retry"),
    ]

    operations = [
        migrations.AddField(
            model_name="proofjob",
            name="pinned",
            field=models.BooleanField(
                default=False,
                help_text="The user chose the machine: a re-queued job waits for it"),
        ),
    ]
