"""The dashboard speaks the engine's words: its proof choices, statuses and partition phases are
the ones cuzk_engine.vocabulary defines. Each test fails if one side changes without the other."""

import re

import pytest

from cuzk_engine import vocabulary
from vastmgr.front import proof_forms as forms
from vastmgr.front.proof_panel import PHASE_LABELS, render_proof
from vastmgr.proofs.models import ProofJob
from vastmgr.proofs.progress import STARTED_PHASES


def values(choices) -> list[str]:
    return [value for value, _ in choices if value]


@pytest.mark.parametrize(("field", "words"), [("kind", vocabulary.KINDS),
                                              ("profile", vocabulary.PROFILES),
                                              ("priority", vocabulary.PRIORITIES)])
def test_the_model_and_form_choices_are_the_engines_words(field, words):
    assert values(ProofJob._meta.get_field(field).choices) == list(words)
    assert values(forms.TestProofForm.base_fields[field].choices) == list(words)


def test_the_list_filter_offers_every_kind():
    assert values(forms.ProofListForm.base_fields["kind"].choices) == list(vocabulary.KINDS)


def test_every_engine_status_is_a_proof_job_status_and_the_final_ones_agree():
    assert set(vocabulary.JOB_STATUSES) <= set(ProofJob.Status.values)
    assert ProofJob.FINAL == vocabulary.TERMINAL_STATUSES
    assert set(ProofJob.IN_FLIGHT).isdisjoint(ProofJob.FINAL)
    assert set(ProofJob.Status.values) == {ProofJob.Status.QUEUED, *ProofJob.IN_FLIGHT,
                                           *ProofJob.FINAL}


def test_the_partition_legend_names_every_phase_in_order():
    assert list(PHASE_LABELS) == list(vocabulary.PARTITION_PHASES)
    assert STARTED_PHASES <= set(vocabulary.PARTITION_PHASES)


@pytest.mark.django_db
def test_the_proof_page_shows_the_engines_phases():
    job = ProofJob.objects.create(kind="porep-c2", seed=1, status=ProofJob.Status.RUNNING,
                                  progress={"status": "running", "partitions": [
                                      {"index": i, "state": phase}
                                      for i, phase in enumerate(vocabulary.PARTITION_PHASES)]})
    html = render_proof(job)
    legend = html.split('class="legend phase-legend"', 1)[1].split("</div>", 1)[0]
    assert re.findall(r"swatch phase-(\w+)", legend) == list(vocabulary.PARTITION_PHASES)
    cells = re.findall(r'class="cell phase-(\w+)"', html)
    assert cells == list(vocabulary.PARTITION_PHASES)
