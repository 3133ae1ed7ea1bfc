"""Downloads keep their plain names, and the one-archive download unpacks into a folder that
`python -m cuzk_engine verify` accepts."""

import io
import json
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO
from vastmgr.proofs.models import ProofJob

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def proof_dir(tmp_path_factory):
    """A real snap-update proof (16 partitions) made by the engine's own CLI."""
    base = tmp_path_factory.mktemp("proof")
    out = base / "out"
    subprocess.run([sys.executable, "-m", "cuzk_engine", "prove", "--kind", "snap-update",
                    "--profile", "tiny", "--seed", "4", "--out", str(out),
                    "--param-cache", str(base / "params")], cwd=REPO, check=True,
                   capture_output=True)
    return out


@pytest.fixture
def done_job(proof_dir):
    return ProofJob.objects.create(
        kind="snap-update", profile="tiny", seed=4, status=ProofJob.Status.DONE, verified=True,
        proof=(proof_dir / "proof.bin").read_bytes(),
        vk=json.loads((proof_dir / "vk.json").read_text()),
        public_inputs=json.loads((proof_dir / "public_inputs.json").read_text()))


def verify(directory) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuzk_engine", "verify", str(directory)],
                          cwd=REPO, capture_output=True, text=True, check=False)


def test_the_archive_holds_the_three_files_under_plain_names_and_verifies(
        admin_client, done_job, tmp_path):
    response = admin_client.get(f"/proofs/{done_job.pk}/proof.tar.gz")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    assert response["Content-Disposition"] == \
        f'attachment; filename="proof-{str(done_job.pk)[:8]}.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        assert sorted(archive.getnames()) == ["proof.bin", "public_inputs.json", "vk.json"]
        assert all(member.isfile() for member in archive.getmembers())
        archive.extractall(tmp_path / "unpacked", filter="data")
    assert (tmp_path / "unpacked" / "proof.bin").read_bytes() == bytes(done_job.proof)
    result = verify(tmp_path / "unpacked")
    assert result.returncode == 0, result.stderr
    assert "OK: 16 partition proof(s) verify" in result.stdout


def test_a_tampered_archive_is_rejected_by_verify(admin_client, done_job, tmp_path):
    """The check above can fail: flip one byte of one partition and verify says no."""
    content = admin_client.get(f"/proofs/{done_job.pk}/proof.tar.gz").content
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as archive:
        archive.extractall(tmp_path, filter="data")
    proof = bytearray((tmp_path / "proof.bin").read_bytes())
    proof[192 * 3 + 100] ^= 1
    (tmp_path / "proof.bin").write_bytes(bytes(proof))
    assert verify(tmp_path).returncode != 0


@pytest.mark.parametrize("name,content_type", [
    ("proof.bin", "application/octet-stream"), ("vk.json", "application/json"),
    ("public_inputs.json", "application/json")])
def test_single_files_keep_their_plain_names(admin_client, done_job, name, content_type):
    response = admin_client.get(f"/proofs/{done_job.pk}/{name}")
    assert response.status_code == 200 and response["Content-Type"] == content_type
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'


def test_single_files_unpacked_side_by_side_verify(admin_client, done_job, tmp_path):
    for name in ("proof.bin", "vk.json", "public_inputs.json"):
        (tmp_path / name).write_bytes(admin_client.get(f"/proofs/{done_job.pk}/{name}").content)
    assert verify(tmp_path).returncode == 0


def test_a_proof_without_results_has_no_downloads(admin_client):
    job = ProofJob.objects.create(kind="winning-post", seed=1)
    for name in ("proof.tar.gz", "proof.bin", "vk.json", "../../etc/passwd", "x.zip"):
        response = admin_client.get(f"/proofs/{job.pk}/{name}")
        assert response.status_code == 404, name
    page = admin_client.get(f"/proofs/{job.pk}/").content.decode()
    assert "proof.tar.gz" not in page


def test_the_proof_page_offers_the_archive_and_the_phase_legend(admin_client, done_job):
    done_job.progress = {"partitions": [{"index": i, "state": "done"} for i in range(16)]}
    done_job.save()
    page = admin_client.get(f"/proofs/{done_job.pk}/").content.decode()
    assert f'href="/proofs/{done_job.pk}/proof.tar.gz"' in page
    legend = page.split('class="legend phase-legend"')[1].split("</div>")[0]
    for phase in ("synthesizing", "synth_done", "gpu", "finalizing", "done", "failed"):
        assert f"swatch phase-{phase}" in legend
