"""Django settings, all read from the environment (see docs/configuration.md)."""

import os
from pathlib import Path

from vastmgr.lib import environment
from vastmgr.metrics import config as metrics_config

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = environment.data_dir(BASE_DIR)

SECRET_KEY = environment.secret_key(DATA_DIR)
DEBUG = environment.env_flag("DEBUG")
ALLOWED_HOSTS = environment.env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = environment.env_list("CSRF_TRUSTED_ORIGINS", [])

# Behind TLS in production: secure cookies, HSTS and redirects. Off for the plain-http embedded mode.
HTTPS = environment.env_flag("VASTMGR_HTTPS")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = 31536000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # the API docs page's template and static files
    # vastmgr's apps by floor, bottom up: each imports only the floors below it (README
    # "How the code is laid out"; tests/vastmgr/test_floors.py holds them to it).
    "vastmgr.fleet",
    "vastmgr.proofs",
    "vastmgr.instances",
    "vastmgr.remote",
    "vastmgr.autopilot",
    "vastmgr.front",
    "vastmgr.api",
    "vastmgr.metrics",
    "vastmgr.notify",
    "vastmgr.controller",
    "vastmgr.ops",
]
# The roof, outside the product: benchmarks, load generators and fakes (their commands). A
# checkout has it; an installed wheel does not (it packages cuzk_engine and vastmgr only).
if (BASE_DIR / "devtools" / "apps.py").exists():
    INSTALLED_APPS.append("devtools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "vastmgr.lib.params.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: its process_exception sees a view's error before the others'.
    "vastmgr.front.error_pages.DiskFullMiddleware",
]

ROOT_URLCONF = "vastmgr.urls"
ASGI_APPLICATION = "vastmgr.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": environment.database(DATA_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
CHANNEL_LAYERS = environment.channel_layers()

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns on a missing root even when using finders
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

# Operations (docs/deployment.md, "Operations"): Prometheus metrics and their alert thresholds.
VASTMGR_METRICS_TOKEN = os.environ.get("VASTMGR_METRICS_TOKEN", "").strip()
VASTMGR_METRICS_RELAY_INTERVAL = metrics_config.env_positive("VASTMGR_METRICS_RELAY_INTERVAL_S", 15.0)
VASTMGR_BUDGET_DOLLARS_PER_HOUR = metrics_config.env_positive("VASTMGR_BUDGET_DOLLARS_PER_HOUR", None)
VASTMGR_BACKLOG_BUDGET_SECONDS = metrics_config.backlog_budgets()
# The ledger (vastmgr/fleet/ledger.py): an Event when its estimate and what Vast billed differ
# by more than this share of the bill.
VASTMGR_BILLING_TOLERANCE = metrics_config.env_positive("VASTMGR_BILLING_TOLERANCE", 0.05)
# Notifications (vastmgr/notify): retries wait the base, doubled each time, up to the cap.
VASTMGR_NOTIFY_BACKOFF_SECONDS = metrics_config.env_positive("VASTMGR_NOTIFY_BACKOFF_S", 5.0)
VASTMGR_NOTIFY_BACKOFF_CAP_SECONDS = metrics_config.env_positive("VASTMGR_NOTIFY_BACKOFF_CAP_S", 600.0)
VASTMGR_NOTIFY_ATTEMPTS = int(metrics_config.env_positive("VASTMGR_NOTIFY_ATTEMPTS", 8.0))
