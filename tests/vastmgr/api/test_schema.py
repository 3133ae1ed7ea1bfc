"""The JSON API against its own OpenAPI schema with schemathesis, through the ASGI app that
daphne serves: generated requests, valid and not, as staff; no answer may be a 5xx, and every
answer must match the schema. Bounded in examples so the whole run stays well under a minute.

The provider is configured (the strict fake Vast, a stored key): without one every offers query
stopped at the 409 "no key" guard, so a TypeError behind it answered 500 in production for
months while this suite passed. And since generated requests are mostly invalid, every
documented read is also called once with valid parameters and must answer its success status."""

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
def something_to_find(transactional_db, vast_configured):
    # The ASGI app runs views in their own threads: a transactional database, seen by all.
    # A local machine (so no action reaches out) and a finished proof.
    local = Machine.objects.create(name="local", provider=Machine.Provider.LOCAL,
                                   state=Machine.State.RUNNING)
    job = ProofJob.objects.create(kind="winning-post", seed=1, machine=local,
                                  status=ProofJob.Status.FAILED, error="for the tests")
    return {"machine_id": local.pk, "job_id": str(job.id), "name": "proof.bin"}


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


# A failed proof has no files: its download route answers its documented 404.
NO_SUCCESS_FOR_THE_FIXTURE = {"/api/v1/proofs/{job_id}/files/{name}": 404}


def test_every_documented_read_answers_its_success_status(something_to_find, tokens):
    reads = [operation for result in schema.get_all_operations()
             if (operation := result.ok()).method.upper() == "GET"]
    assert {op.path for op in reads} >= {"/api/v1/offers", "/api/v1/machines", "/api/v1/fleet"}
    answers = {}
    for operation in reads:
        path_parameters = {p.name: something_to_find[p.name]
                           for p in operation.path_parameters}
        response = operation.Case(path_parameters=path_parameters).call(
            headers={"Authorization": tokens["staff"]})
        answers[operation.path] = (response.status_code, response.text[:200])
    wrong = {path: answer for path, answer in answers.items()
             if answer[0] != NO_SUCCESS_FOR_THE_FIXTURE.get(path, 200)}
    assert not wrong, wrong


def test_an_invalid_body_names_the_field_as_the_caller_wrote_it(something_to_find, tokens):
    operation = schema["/api/v1/proofs"]["POST"]
    response = operation.Case(body={"kind": "no-such-kind", "count": 0}).call(
        headers={"Authorization": tokens["staff"]})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "body" not in detail, detail
    assert detail.startswith("kind: ") and "; count: " in detail, detail
    assert not ProofJob.objects.filter(kind="no-such-kind").exists()
