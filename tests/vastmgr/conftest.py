"""Fixtures every served-stack test module shares (each module brings its own `stack`), and
the operator's SSH key with the real sshd it is accepted by."""

from collections.abc import Iterator

import asyncssh
import pytest

from tests.vastmgr.remote.served import Operator


@pytest.fixture(scope="module")
def operator(stack) -> Iterator[Operator]:
    """The logged-in operator of the module's stack; no page answered them with a 5xx."""
    person = Operator(stack)
    person.login()
    yield person
    assert person.server_errors() == []


@pytest.fixture(scope="module")
def client_key():
    """The operator's SSH key (remote/ and the production sandbox in deploy/)."""
    return asyncssh.generate_private_key("ssh-ed25519")


@pytest.fixture(scope="module")
def sshd(client_key):
    """The real OpenSSH server on loopback, for a module's served stack (see
    remote/real_sshd.py)."""
    from tests.vastmgr.remote.real_sshd import real_sshd, unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)
    with real_sshd(client_key.export_public_key().decode().strip()) as server:
        yield server


@pytest.fixture(scope="module")
def key_file(tmp_path_factory, client_key):
    """The client key in a file, as an operator names it on the add-machine form."""
    path = tmp_path_factory.mktemp("keys") / "id_ed25519"
    path.write_text(client_key.export_private_key().decode())
    path.chmod(0o600)
    return path
