"""The data directory's disk: when a write failed because it is full, and how to say so.

The data directory holds SQLite's database in the embedded mode, and in every mode the static
files and the engine wheels that provisioning builds. A full disk there is no bug of ours: pages
and Events say which directory to free, in the same words."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

# Below this many free bytes, writes there fail (SQLite's journal, a wheel) or soon will.
FULL_BELOW = 1 << 20
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_SQLITE_FULL = "database or disk is full"


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, says a disk is full (an OSError's errno,
    SQLite's own message, which Django's OperationalError carries)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if _SQLITE_FULL in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def full_message(path: Path) -> str:
    """What a person is told while the disk is full: where, and what to do."""
    return (f"the data directory's disk is full ({path}: {size(free_bytes(path))} free): "
            "nothing can be saved until space is freed there")


def size(count: int) -> str:
    """Bytes as a person reads them."""
    return f"{count / (1 << 20):.1f} MB" if count >= 1 << 20 else f"{count} bytes"
