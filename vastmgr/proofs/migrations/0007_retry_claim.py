from django.db import migrations, models


def claim_retried(apps, schema_editor):
    """A job retried before the flag existed is claimed by that retry."""
    ProofJob = apps.get_model("proofs", "ProofJob")
    ProofJob.objects.filter(retries__isnull=False).update(retried=True)


class Migration(migrations.Migration):

    dependencies = [
        ("proofs", "0006_proof_duration"),
    ]

    operations = [
        migrations.AddField(
            model_name="proofjob",
            name="retried",
            field=models.BooleanField(default=False,
                                      help_text="Claimed by its one retry (see `retry`)"),
        ),
        migrations.RunPython(claim_retried, migrations.RunPython.noop),
    ]
