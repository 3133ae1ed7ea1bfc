"""Proof job rules that hold in the database itself: one retry per proof, whoever asks at once."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections

from vastmgr.proofs.models import ProofJob


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["DEFERRED", "IMMEDIATE"])
def test_two_retries_at_once_make_one_retry_on_sqlite(monkeypatch, mode):
    """Two tabs retry the same failed proof at the same moment, each in its own connection.
    SQLite has no SELECT ... FOR UPDATE, and in its deferred transaction mode (a DATABASE_URL
    naming a SQLite file gets it) a transaction that read first cannot wait for another's
    write: both saw no retry, and the second insert failed with "database is locked" (or,
    with another timing, made a second retry). Both must get the one retry."""
    if connection.vendor != "sqlite":
        pytest.skip("the rule on SQLite; PostgreSQL's row locks are tested with the served stack")
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-1")
    failed = ProofJob.objects.create(kind="winning-post", seed=1, requested_by=user)
    failed.fail("boom")
    monkeypatch.setitem(connections.settings["default"]["OPTIONS"], "transaction_mode", mode)

    # Each call waits at its insert for the other to reach its own (as long as a second can
    # get there): where the rule failed, both got that far.
    both_there = threading.Barrier(2, timeout=1.0)
    create = ProofJob.objects.create

    def create_together(**fields):
        try:
            both_there.wait()
        except threading.BrokenBarrierError:
            pass  # the other call is waiting for this one's claim: as it should
        return create(**fields)

    monkeypatch.setattr(ProofJob.objects, "create", create_together)
    answers: list[tuple[ProofJob, bool]] = []
    errors: list[BaseException] = []

    def retry() -> None:
        try:
            answers.append(ProofJob.objects.get(pk=failed.pk).retry(user))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    tabs = [threading.Thread(target=retry) for _ in range(2)]
    for tab in tabs:
        tab.start()
    for tab in tabs:
        tab.join(60)
    assert not errors, errors
    retries = list(ProofJob.objects.filter(retry_of=failed))
    assert len(retries) == 1, retries
    assert sorted(created for _, created in answers) == [False, True]
    assert {retry.pk for retry, _ in answers} == {retries[0].pk}
