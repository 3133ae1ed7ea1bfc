"""One liveness: the JSON API says live / stale / offline by the same rule as the fleet page
(`fleet/liveness.py`). A link that is up but silent for 3 intervals is stale, not "connected"."""

from datetime import timedelta

from django.contrib.auth.models import User
from django.utils import timezone

from vastmgr.fleet.models import Machine, MachineStatus


def test_the_api_and_the_fleet_page_say_the_same_liveness(client, tokens):
    machine = Machine.objects.create(name="gpu-1", provider="ssh", host="127.0.0.1",
                                     state=Machine.State.RUNNING)
    # 30 s between snapshots: stale after 90 s without one, whatever this machine's load
    MachineStatus.objects.create(machine=machine, connected=True, interval=30.0)
    staff = User.objects.get(username="ops")
    client.force_login(staff)
    auth = {"HTTP_AUTHORIZATION": tokens["viewer"]}

    def shown() -> tuple[str, int, int, str]:
        one = client.get(f"/api/v1/machines/{machine.pk}", **auth).json()
        fleet = client.get("/api/v1/fleet", **auth).json()
        page = client.get("/").content.decode()
        row = page.split(f'id="host-{machine.pk}-row"')[1].split(">", 1)[0]
        return one["connection"], fleet["connected"], fleet["live"], row

    for ago, expected in ((1, "live"), (200, "stale")):
        Machine.objects.filter(pk=machine.pk).update(
            last_seen=timezone.now() - timedelta(seconds=ago))
        connection, connected, live, row = shown()
        assert connection == expected and f'data-conn="{expected}"' in row, (ago, row)
        assert (connected, live) == (1, 1 if expected == "live" else 0)
    MachineStatus.objects.filter(machine=machine).update(connected=False)
    assert shown()[:3] == ("offline", 0, 0)
