"""Settings come from the environment; bad values stop start-up with one clear line."""

import json
import subprocess

import pytest

PRINT_SETTINGS = (
    "import json, django; django.setup(); from django.conf import settings; "
    "print(json.dumps({'layer': settings.CHANNEL_LAYERS['default']['BACKEND'],"
    " 'hosts': settings.CHANNEL_LAYERS['default'].get('CONFIG', {}).get('hosts'),"
    " 'db': settings.DATABASES['default']['ENGINE'], 'debug': settings.DEBUG,"
    " 'key': settings.SECRET_KEY}))"
)


def load_settings(python, env, **overrides):
    out = subprocess.run([python, "-c", PRINT_SETTINGS], env={**env, **overrides},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_embedded_defaults_are_sqlite_in_memory_layer_and_debug_off(python, clean_env):
    s = load_settings(python, clean_env)
    assert s["layer"] == "channels.layers.InMemoryChannelLayer"
    assert s["db"] == "django.db.backends.sqlite3"
    assert s["debug"] is False


def test_redis_url_switches_to_the_redis_channel_layer(python, clean_env):
    s = load_settings(python, clean_env, REDIS_URL="redis://127.0.0.1:6390/2")
    assert s["layer"] == "channels_redis.core.RedisChannelLayer"
    [host] = s["hosts"]
    assert host["address"] == "redis://127.0.0.1:6390/2"
    # Longer than channels-redis' 5 s blocking pop, or idle consumers die with 1011.
    assert host["socket_timeout"] > 5


def test_database_url_selects_postgres(python, clean_env):
    s = load_settings(python, clean_env, DATABASE_URL="postgres://u:p@127.0.0.1:5432/vastmgr")
    assert s["db"] == "django.db.backends.postgresql"


def test_a_sqlite_database_url_waits_its_turn_as_the_default_database_does(
        python, clean_env, tmp_path):
    """Deferred transactions that read and then write fail at once with "database is locked"
    when another process wrote in between: a SQLite file named by DATABASE_URL gets the
    default database's IMMEDIATE mode and timeout."""
    script = ("import json, django; django.setup(); from django.conf import settings; "
              "print(json.dumps(settings.DATABASES['default']['OPTIONS']))")
    for env in ({}, {"DATABASE_URL": f"sqlite:///{tmp_path / 'ops.sqlite3'}"}):
        out = subprocess.run([python, "-c", script], env={**clean_env, **env},
                             capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == {"transaction_mode": "IMMEDIATE", "timeout": 20}, env


def test_generated_secret_key_is_persisted_in_the_data_dir(python, clean_env, tmp_path):
    first = load_settings(python, clean_env)["key"]
    second = load_settings(python, clean_env)["key"]
    assert first == second and len(first) >= 50
    key_file = tmp_path / "data" / "secret_key"
    assert key_file.read_text().strip() == first
    assert key_file.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "variable, value",
    [("DATABASE_URL", "nonsense://what"), ("REDIS_URL", "http://not-redis"), ("DEBUG", "maybe")],
)
def test_bad_variable_stops_manage_py_with_one_line_naming_it(python, clean_env, repo, variable, value):
    result = subprocess.run([python, "manage.py", "check"], cwd=repo, capture_output=True,
                            text=True, env={**clean_env, variable: value}, check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0] and "Traceback" not in result.stderr


def test_check_deploy_passes_with_production_variables(python, clean_env, repo):
    env = {**clean_env, "SECRET_KEY": "x7" * 40 + "-Zq!", "ALLOWED_HOSTS": "dash.example.com",
           "VASTMGR_HTTPS": "1", "DEBUG": "0"}
    result = subprocess.run([python, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=repo, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
