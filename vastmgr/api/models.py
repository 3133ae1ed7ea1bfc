import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX = "vmapi_"
# last_used is written at most this often per token: a script polling every second must not
# turn every read into a write.
TOUCH_EVERY = timedelta(minutes=1)


def _digest(token: str) -> str:
    # 32 random bytes: a plain SHA-256 is enough (no password to stretch).
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    """A person's API token. Only its SHA-256 is stored; the token is shown once, at creation.
    It acts with its owner's permissions, as their pages do."""

    NAME_MAX = 100

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=NAME_MAX)
    digest = models.CharField(max_length=64, unique=True)
    hint = models.CharField(max_length=12, help_text="the token's first characters")
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…)"

    @classmethod
    def issue(cls, user, name: str) -> tuple["ApiToken", str]:
        token = PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name.strip()[:cls.NAME_MAX],
                                 digest=_digest(token), hint=token[:len(PREFIX) + 4])
        return row, token

    @classmethod
    def user_for(cls, token: str):
        """The active user the token belongs to, or None."""
        row = cls.objects.select_related("user").filter(digest=_digest(token)).first()
        if row is None or not row.user.is_active:
            return None
        now = timezone.now()
        if row.last_used is None or now - row.last_used > TOUCH_EVERY:
            cls.objects.filter(pk=row.pk).update(last_used=now)
        return row.user
