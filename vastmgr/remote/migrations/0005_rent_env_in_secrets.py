"""The rent dialog's remembered env holds operator secrets (vast-manager's PAVAIL): each user's
moves out of the plain `RentPreference.env` column into an encrypted Secret
(`rent_env:<user id>`), and the column goes."""

from django.db import migrations, models

from vastmgr.remote import secrets
from vastmgr.remote.config import format_env, parse_env


def secret_name(user_id: int) -> str:
    return f"rent_env:{user_id}"


def env_into_secrets(apps, schema_editor):
    RentPreference = apps.get_model("remote", "RentPreference")
    Secret = apps.get_model("remote", "Secret")
    for pref in RentPreference.objects.exclude(env=""):
        env = parse_env(pref.env)  # the rent form checked it before it was saved
        if env:
            Secret.objects.update_or_create(
                name=secret_name(pref.user_id),
                defaults={"ciphertext": secrets.encrypt(format_env(env))})


def env_out_of_secrets(apps, schema_editor):
    RentPreference = apps.get_model("remote", "RentPreference")
    Secret = apps.get_model("remote", "Secret")
    for pref in RentPreference.objects.all():
        secret = Secret.objects.filter(name=secret_name(pref.user_id)).first()
        if secret is not None:
            pref.env = secrets.decrypt(secret.ciphertext, name=secret.name)
            pref.save(update_fields=["env"])
            secret.delete()


class Migration(migrations.Migration):

    dependencies = [
        ('remote', '0004_rent_upstream_worker'),
    ]

    operations = [
        migrations.RunPython(env_into_secrets, env_out_of_secrets),
        migrations.RemoveField(
            model_name='rentpreference',
            name='env',
        ),
    ]
