"""Run a long SSH or provider action off the request thread (embedded mode has no worker).

Progress and results reach the page through Events, which the machine page polls.
"""

import asyncio
import logging
import threading

from django.db import connections

from vastmgr.fleet.models import Event

log = logging.getLogger(__name__)


def launch(label: str, coroutine_factory, machine=None) -> None:
    def target():
        try:
            asyncio.run(coroutine_factory())
        except Exception as exc:  # the thread's last resort: record, never lose the failure
            log.exception("%s failed", label)
            Event.record("remote", f"{label} failed: {exc}", machine=machine,
                         level=Event.Level.ERROR)
        finally:
            connections.close_all()

    threading.Thread(target=target, name=label, daemon=True).start()
