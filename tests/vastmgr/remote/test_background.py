"""Work a request hands to the SSH loop runs in its own context, with its own database thread.

Django's ASGI handler runs a sync view in a thread entered through asgiref's AsyncToSync (where
the middleware chain crosses from sync to async), so the view's context names that request's
CurrentThreadExecutor. Here a plain thread does the same: async_to_sync → sync_to_async → the
"view", which launches an action."""

import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from vastmgr.fleet.models import Event, Machine
from vastmgr.remote import ssh_loop as background

pytestmark = pytest.mark.django_db(transaction=True)


def as_a_request(view):
    """Call `view` as Django's ASGI stack calls a sync view, from a thread of its own; return
    what it returned once the 'request' is over (its executor has quit)."""
    result = {}

    async def handler():
        result["value"] = await sync_to_async(view)()

    thread = threading.Thread(target=async_to_sync(handler))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return result["value"]


def test_an_action_launched_from_a_request_reads_the_database_after_the_request_ended():
    machine = Machine.objects.create(name="box", provider=Machine.Provider.SSH, host="h")

    async def action():
        row = await Machine.objects.aget(pk=machine.pk)
        await sync_to_async(Event.record)("remote", f"{row.name}: action ran", machine=row)

    future = as_a_request(lambda: background.launch("action box", action, machine=machine))
    future.result(30)
    assert Event.objects.filter(machine=machine, message="box: action ran").exists()
    assert not Event.objects.filter(level=Event.Level.ERROR).exists()

