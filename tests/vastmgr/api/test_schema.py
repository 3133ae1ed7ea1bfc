"""The JSON API against its own OpenAPI schema with schemathesis, through the ASGI app that
daphne serves: generated requests, valid and not, as staff; no answer may be a 5xx, and every
answer must match the schema. Bounded in examples so the whole run stays well under a minute."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from vastmgr.asgi import application
from vastmgr.fleet.models import Machine
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def something_to_find(transactional_db):
    # The ASGI app runs views in their own threads: a transactional database, seen by all.
    # A local machine (so no action reaches out) and a finished proof.
    local = Machine.objects.create(name="local", provider=Machine.Provider.LOCAL,
                                   state=Machine.State.RUNNING)
    ProofJob.objects.create(kind="winning-post", seed=1, machine=local,
                            status=ProofJob.Status.FAILED, error="for the tests")


# The schema as the app serves it (no database needed to read it).
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", application,
                                        headers={"Host": "127.0.0.1"})


@schema.parametrize()
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_server_errors_and_answers_match_the_schema(case, something_to_find, tokens):
    case.call_and_validate(headers={"Authorization": tokens["staff"]},
                           checks=[not_a_server_error, response_schema_conformance])
