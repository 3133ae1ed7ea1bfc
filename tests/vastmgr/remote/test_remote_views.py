"""Pages: adding a host stores its key encrypted and never shows it; offers; staff-only actions."""

import re

import asyncssh
import pytest
from django.contrib.auth.models import User

from vastmgr.fleet.models import Machine
from vastmgr.remote.models import RemoteMachine, Secret

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    user = User.objects.create_user("ops", password="pw-123456789", is_staff=True)
    client.force_login(user)
    return client


def test_adding_a_host_stores_the_key_encrypted_and_never_renders_it(staff):
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    response = staff.post("/remote/machines/add/", {
        "name": "gpu-a", "host": "127.1.2.3", "ssh_port": 2222, "ssh_user": "prover",
        "private_key": key, "key_file": ""})
    machine = Machine.objects.get(name="gpu-a")
    assert response.status_code == 302 and machine.provider == Machine.Provider.SSH
    remote = RemoteMachine.objects.get(machine=machine)
    assert Secret.reveal(remote.ssh_key_secret_name) == key.strip()
    page = staff.get(f"/remote/machines/{machine.pk}/").content.decode()
    assert "PRIVATE KEY" not in page and "not pinned yet" in page


def test_a_bad_key_is_a_form_error_that_does_not_echo_the_input(staff):
    response = staff.post("/remote/machines/add/", {
        "name": "gpu-b", "host": "h", "ssh_port": 22, "ssh_user": "root",
        "private_key": "not-a-key-SECRETISH", "key_file": ""})
    assert response.status_code == 200
    assert "not a readable unencrypted private key" in response.content.decode()
    assert "SECRETISH" not in response.content.decode()
    assert not Machine.objects.filter(name="gpu-b").exists()


def test_actions_need_staff(client):
    machine = Machine.objects.create(name="m", host="h")
    client.force_login(User.objects.create_user("viewer", password="pw-123456789"))
    response = client.post(f"/remote/machines/{machine.pk}/destroy/")
    assert response.status_code == 403 and "Only staff" in response.content.decode()
    assert Machine.objects.get(pk=machine.pk).state == Machine.State.REGISTERED
    # The engine log and commands on hosts are staff-only too; the log panel is not rendered.
    for url in (f"/remote/machines/{machine.pk}/log/", "/remote/machines/command/"):
        response = client.get(url)
        assert response.status_code == 403 and "Only staff" in response.content.decode(), url
    assert "engine-log" not in client.get(f"/remote/machines/{machine.pk}/").content.decode()


def test_destroying_an_ssh_host_kills_it(staff):
    machine = Machine.objects.create(name="m2", host="h")
    staff.post(f"/remote/machines/{machine.pk}/destroy/")
    machine.refresh_from_db()
    assert machine.state == Machine.State.KILLED and machine.kill_reason == "destroyed by ops"


def test_the_offers_page_asks_for_a_key_and_stores_it_without_showing_it(staff):
    assert "not set" in staff.get("/remote/offers/").content.decode()
    staff.post("/remote/offers/api-key/", {"api_key": "vast-key-abc123-def456"})
    page = staff.get("/remote/offers/").content.decode()
    assert "stored (encrypted)" in page and "vast-key-abc123-def456" not in page


def test_an_action_the_state_does_not_allow_is_refused_with_the_reason(staff):
    machine = Machine.objects.create(name="m3", host="h")
    page = staff.get(f"/remote/machines/{machine.pk}/").content.decode()
    assert '<button disabled title="Start engine: not provisioned yet' in page
    for action in ("stop", "start", "restart", "upgrade"):
        response = staff.post(f"/remote/machines/{machine.pk}/{action}/", follow=True)
        assert f"m3: cannot {action} (not provisioned yet" in response.content.decode()
    assert not machine.events.filter(message__contains="requested by").exists()


def test_a_key_file_others_can_read_is_refused(staff, tmp_path):
    key = tmp_path / "id"
    key.write_text(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    key.chmod(0o644)
    form = {"name": "gpu-c", "host": "h", "ssh_port": 22, "ssh_user": "root",
            "private_key": "", "key_file": str(key)}
    assert "chmod 600" in staff.post("/remote/machines/add/", form).content.decode()
    key.chmod(0o600)
    assert staff.post("/remote/machines/add/", form).status_code == 302
    assert RemoteMachine.objects.get(machine__name="gpu-c").key_file == str(key)


@pytest.mark.django_db(transaction=True)  # the SSH loop's thread reads the machine too
def test_the_log_of_a_host_backing_off_answers_at_once_and_polls_when_it_is_tried_again(staff):
    from vastmgr.remote import ssh_loop as background

    machine = Machine.objects.create(name="m4", host="127.0.0.1", ssh_port=1,
                                     state=Machine.State.RUNNING, engine_token="t")
    link = background.pool.get(machine.pk)
    link.next_attempt = link._clock() + 120  # a host that has failed for a while
    try:
        response = staff.get(f"/remote/machines/{machine.pk}/log/")
        html = response.content.decode()
        assert "log unavailable" in html and "next attempt at" in html
        delay = int(re.search(r"load delay:(\d+)s", html).group(1))
        assert 110 <= delay <= 120, delay
    finally:
        link.retry_now()
