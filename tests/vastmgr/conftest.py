"""Fixtures every served-stack test module shares; each module brings its own `stack`."""

from collections.abc import Iterator

import pytest

from tests.vastmgr.remote.served import Operator


@pytest.fixture(scope="module")
def operator(stack) -> Iterator[Operator]:
    """The logged-in operator of the module's stack; no page answered them with a 5xx."""
    person = Operator(stack)
    person.login()
    yield person
    assert person.server_errors() == []
