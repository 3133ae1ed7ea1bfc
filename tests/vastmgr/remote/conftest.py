import pytest

from vastmgr.fleet.models import Machine
from vastmgr.remote.models import RemoteMachine, Secret

from .fake_host import FakeHost


@pytest.fixture
async def fake_host(tmp_path, client_key):
    host = FakeHost(tmp_path / "remote", client_key.export_public_key().decode())
    await host.start()
    yield host
    await host.stop()


@pytest.fixture
def ssh_machine(fake_host, client_key):
    """A Machine pointing at the fake host, with its private key stored encrypted."""
    machine = Machine.objects.create(name="box-1", provider=Machine.Provider.SSH,
                                     host="127.0.0.1", ssh_port=fake_host.port,
                                     ssh_user="prover")
    remote = RemoteMachine.for_machine(machine)
    Secret.store(remote.ssh_key_secret_name, client_key.export_private_key().decode())
    return machine


API_KEY = "vast-test-key-0123456789abcdef"


@pytest.fixture
async def fake_vast(fake_host):
    from devtools.fake_vast import FakeVast

    vast = FakeVast(API_KEY, ssh_endpoint=("127.0.0.1", fake_host.port),
                    on_ssh_key=fake_host.authorize)
    await vast.start()
    yield vast
    await vast.stop()


@pytest.fixture
def no_sleep():
    """Records backoff delays instead of waiting them out."""
    delays = []

    async def sleep(delay):
        delays.append(delay)

    sleep.delays = delays
    return sleep


@pytest.fixture
def sshd_host(client_key):
    """The real OpenSSH server on loopback, for a throwaway bash user (see real_sshd.py)."""
    from .real_sshd import real_sshd, unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)
    with real_sshd(client_key.export_public_key().decode().strip()) as server:
        yield server
