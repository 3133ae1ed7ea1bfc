from datetime import timedelta

from django.db import migrations, models

from vastmgr.proofs.progress import partition_from_json, proof_duration_ms

FINAL = ("done", "failed", "cancelled")


def ended_durations(apps, schema_editor):
    """Every ended job's duration, by the rule `ProofJob.ended_duration` keeps for new ones."""
    ProofJob = apps.get_model("proofs", "ProofJob")
    for job in ProofJob.objects.filter(status__in=FINAL).iterator():
        partitions = [partition_from_json(p) for p in (job.progress or {}).get("partitions", ())]
        duration_ms = proof_duration_ms(partitions, (job.timings or {}).get("total_ms"))
        if duration_ms is not None:
            job.engine_duration = timedelta(milliseconds=duration_ms)
        elif job.started_at is not None and job.finished_at is not None:
            job.engine_duration = job.finished_at - job.started_at
        else:
            continue
        job.save(update_fields=["engine_duration"])


class Migration(migrations.Migration):

    dependencies = [
        ("proofs", "0005_benchmark_proof"),
    ]

    operations = [
        migrations.AddField(
            model_name="proofjob",
            name="engine_duration",
            field=models.DurationField(
                blank=True, null=True,
                help_text="An ended job's duration (progress.proof_duration_ms), kept with every save"),
        ),
        migrations.RunPython(ended_durations, migrations.RunPython.noop),
    ]
