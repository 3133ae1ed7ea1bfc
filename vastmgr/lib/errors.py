"""Every exception vastmgr raises for others to catch, in one place. Each message is written
for an operator: it says what failed and never carries a secret."""

from django.core.exceptions import ImproperlyConfigured


class SettingsError(ImproperlyConfigured):
    """A bad environment variable; manage.py prints it as one line and exits."""


class IllegalTransition(ValueError):
    """Raised when a model is asked to move to a state its current state cannot reach."""


class AppendOnlyError(RuntimeError):
    """Something tried to change or delete a row of an append-only log."""


class VerificationError(ValueError):
    """The proof could not even be checked (malformed VK, inputs or proof bytes)."""


class TransportError(RuntimeError):
    """The engine cannot be reached through this transport (the message says why)."""


class VastError(RuntimeError):
    """A Vast.ai API call failed; `status` is the HTTP status and `code` Vast's error code."""

    def __init__(self, message: str, *, status: int | None = None, code: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code


class VastAuthError(VastError):
    """The API key was rejected (Vast answers 401/403, or 404 `auth_error` on some endpoints)."""


class VastRateLimited(VastError):
    """Vast kept answering 429 for longer than this call's retry budget."""

    def __init__(self, message: str, *, retry_in_s: float, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_in_s = retry_in_s


class VastOutcomeUnknown(VastError):
    """A create got no usable answer: the instance may exist. Never retried blindly."""


class SecretUnavailable(RuntimeError):
    """A stored secret cannot be decrypted (missing, or SECRET_KEY changed since it was stored)."""


class SSHError(RuntimeError):
    """An SSH failure described for an operator; never carries key material."""


class HostKeyChanged(SSHError):
    """The host presented a key other than the pinned one; we refuse to talk to it."""


class SSHAuthFailed(SSHError):
    """The host refused our key."""


class ProvisionError(RuntimeError):
    """A failed step; `recorded` when an Event already says so (callers add none then)."""

    def __init__(self, step: str, message: str, *, recorded: bool = False):
        super().__init__(f"{step}: {message}")
        self.step = step
        self.recorded = recorded
