"""Secrets at rest: Fernet with a key derived from SECRET_KEY, so a database dump alone is useless.

Rotating SECRET_KEY makes stored secrets unreadable; `SecretUnavailable` says so instead of
leaking a cryptography traceback, and the operator re-enters the secret once.
"""

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from vastmgr.lib.errors import SecretUnavailable

# Domain separation: the same SECRET_KEY also signs sessions; this key is only for secrets.
HKDF_INFO = b"vastmgr.remote secret store v1"


def _fernet() -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(
        settings.SECRET_KEY.encode()
    )
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt(plaintext: str) -> bytes:
    return _fernet().encrypt(plaintext.encode())


def decrypt(token: bytes, *, name: str) -> str:
    try:
        return _fernet().decrypt(bytes(token)).decode()
    except InvalidToken:
        raise SecretUnavailable(
            f"secret {name!r} cannot be decrypted (was SECRET_KEY changed?); enter it again"
        ) from None
