"""The data directory's disk watched by the controller, where the database lives elsewhere (the
scale-out mode): an error Event when it fills, an info Event that ends it when space is back.
The served test (tests/vastmgr/served/test_disk_full.py) holds the embedded mode, where the
database is on the full disk itself."""

import os
import shutil
import subprocess

import pytest

from tests.vastmgr.served.test_disk_full import fill
from vastmgr.fleet.data_disk import DataDiskWatch
from vastmgr.fleet.models import Event

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                       reason="needs root and mount(8) for a tmpfs of the test's own"),
]


@pytest.fixture
def small_disk(tmp_path):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(tmp_path)],
                   check=True)
    yield tmp_path
    subprocess.run(["umount", "--lazy", str(tmp_path)], check=False)


async def test_a_full_disk_is_told_once_and_its_end_too(small_disk):
    watch = DataDiskWatch(small_disk)
    await watch.check()
    assert not await Event.objects.aexists(), "a disk with room says nothing"
    filler = fill(small_disk)
    for _ in range(3):
        await watch.check()
    [full] = [e async for e in Event.objects.all()]
    assert (full.kind, full.level) == ("fault", "error")
    assert full.message == f"the data directory's disk is full ({small_disk}: 0 bytes free): " \
                           "nothing can be saved until space is freed there"
    filler.unlink()
    await watch.check()
    await watch.check()
    back = await Event.objects.exclude(pk=full.pk).aget()
    assert (back.kind, back.level, back.data) == ("fault", "info", {Event.RECOVERS: True})
    assert back.message.startswith(f"space is back in the data directory ({small_disk}: ")
