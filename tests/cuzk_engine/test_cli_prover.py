"""The prover CLI end to end: prove, verify, circuits, setup, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuzk_engine import circuits
from cuzk_engine.cli import main
from cuzk_engine.field import MODULUS
from cuzk_engine.vocabulary import KINDS
from tests.cuzk_engine.conftest import blst_verify

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tiny_cache, monkeypatch):
    monkeypatch.setenv("CUZK_PARAM_CACHE", str(tiny_cache))
    return tiny_cache


@pytest.fixture(scope="module")
def proof_dirs(tiny_cache, tmp_path_factory):
    """One `prove` output directory per kind, made through the CLI."""
    root = tmp_path_factory.mktemp("proofs")
    out = {}
    for kind in KINDS:
        out[kind] = root / kind
        rc = main(["prove", "--kind", kind, "--profile", "tiny", "--seed", "1", "--out",
                   str(out[kind]), "--param-cache", str(tiny_cache)])
        assert rc == 0
    return out


def run_cli(*args, cache_dir):
    env = {**os.environ, "CUZK_PARAM_CACHE": str(cache_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cuzk_engine", *args], check=False,
                          capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


@pytest.mark.parametrize("kind", KINDS)
def test_prove_writes_the_documented_files(kind, proof_dirs, capsys):
    d = proof_dirs[kind]
    assert sorted(p.name for p in d.iterdir()) == [
        "proof.bin", "public_inputs.json", "timings.json", "vk.json"]
    parts = circuits.partition_count(kind, "tiny")
    blob = (d / "proof.bin").read_bytes()
    assert len(blob) == 192 * parts
    inputs = json.loads((d / "public_inputs.json").read_text())
    assert len(inputs) == parts and all(isinstance(x, str) for x in inputs[0])
    vk_json = json.loads((d / "vk.json").read_text())
    assert set(vk_json) == {"alpha_g1", "beta_g2", "gamma_g2", "delta_g2", "ic"}
    for k in range(parts):
        assert blst_verify(vk_json, [int(x) for x in inputs[k]], blob[192 * k:192 * (k + 1)])
    assert main(["verify", str(d)]) == 0
    assert "OK" in capsys.readouterr().out


def test_module_entry_point_proves_and_verifies(cache, tmp_path):
    out = tmp_path / "d"
    result = run_cli("prove", "--kind", "winning-post", "--profile", "tiny", "--seed", "9",
                     "--out", str(out), cache_dir=cache)
    assert result.returncode == 0, result.stderr
    result = run_cli("verify", str(out), cache_dir=cache)
    assert result.returncode == 0 and "OK" in result.stdout


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_verify_fails_on_tampering(proof_dirs, tmp_path, capsys):
    d = _copy(proof_dirs["snap-update"], tmp_path / "swap")
    blob = (d / "proof.bin").read_bytes()
    (d / "proof.bin").write_bytes(blob[192:384] + blob[:192] + blob[384:])
    assert main(["verify", str(d)]) == 1
    assert "partition(s) 0, 1 of 16" in capsys.readouterr().err

    d = _copy(proof_dirs["porep-c2"], tmp_path / "input")
    inputs = json.loads((d / "public_inputs.json").read_text())
    inputs[3][1] = str(int(inputs[3][1]) + 1)
    (d / "public_inputs.json").write_text(json.dumps(inputs))
    assert main(["verify", str(d)]) == 1


@pytest.mark.parametrize("mutate,message", [
    (lambda d: (d / "proof.bin").write_bytes((d / "proof.bin").read_bytes()[:-1]), "bytes"),
    (lambda d: (d / "public_inputs.json").write_text(json.dumps([[str(MODULUS)] * 4])),
     "field modulus"),
    (lambda d: (d / "public_inputs.json").write_text("[[\"-1\"]]"), "decimal"),
    (lambda d: (d / "vk.json").write_text("{}"), "missing"),
    (lambda d: (d / "proof.bin").unlink(), "missing"),
])
def test_verify_reports_malformed_input_in_one_line(proof_dirs, tmp_path, capsys, mutate,
                                                    message):
    d = _copy(proof_dirs["winning-post"], tmp_path / "bad")
    mutate(d)
    assert main(["verify", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_bad_requests_exit_nonzero_without_traceback(cache, tmp_path):
    out = tmp_path / "never"
    for args in (["prove", "--kind", "nope", "--profile", "tiny", "--seed", "1"],
                 ["prove", "--kind", "porep-c2", "--profile", "tiny", "--seed", "-1"],
                 ["prove", "--kind", "porep-c2", "--profile", "tiny", "--seed", str(2**64)],
                 ["prove", "--kind", "porep-c2", "--profile", "giant", "--seed", "1"]):
        result = run_cli(*args, "--out", str(out), cache_dir=cache)
        assert result.returncode != 0 and "Traceback" not in result.stderr
    assert not out.exists()


def test_corrupt_parameters_fail_cleanly_and_leave_nothing(tiny_cache, tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    for suffix in (".params", ".vk"):
        src = tiny_cache / f"window-post.tiny{suffix}"
        (cache_dir / src.name).write_bytes(src.read_bytes())
    params = cache_dir / "window-post.tiny.params"
    params.write_bytes(params.read_bytes()[:-1])
    out = tmp_path / "out"
    rc = main(["prove", "--kind", "window-post", "--profile", "tiny", "--seed", "1", "--out",
               str(out), "--param-cache", str(cache_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and "truncated" in err and "setup --kind window-post" in err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["cache"]
    assert main(["setup", "--kind", "window-post", "--profile", "tiny", "--force",
                 "--param-cache", str(cache_dir)]) == 0
    assert "NOT A TRUSTED SETUP" in capsys.readouterr().err


def test_prove_refuses_a_non_empty_output_directory(cache, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["prove", "--kind", "winning-post", "--profile", "tiny", "--seed", "1",
                 "--out", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["keep.txt"]


def test_circuits_table_is_exact(capsys):
    assert main(["circuits", "--json"]) == 0
    rows = {r["circuit_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert len(rows) == 16
    tiny = rows["snap-update.tiny"]
    assert tiny["partitions"] == 16 and tiny["constraints"] <= 2**11
    cs = circuits.build("snap-update", "tiny", 1, 0)
    assert tiny["constraints"] == cs.num_constraints
    assert main(["circuits"]) == 0
    assert "| porep-c2.medium | 10 |" in capsys.readouterr().out


def test_setup_checks_existing_parameters(cache, capsys):
    assert main(["setup", "--kind", "porep-c2", "--profile", "tiny"]) == 0
    assert "parameters ready" in capsys.readouterr().out


def test_bench_prover_tiny(cache, capsys):
    assert main(["bench", "prover", "--profile", "tiny", "--kind", "winning-post"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[:out.index("\n| circuit")])
    row = report["results"][0]
    assert row["constraints"] == circuits.constraint_count("winning-post", "tiny")
    assert 0 < row["prove_start_share"] < 1 and row["total_s"] > 0
