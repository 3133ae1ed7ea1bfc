import json
import os

import pytest

from cuzk_engine import groth16
from cuzk_engine.engine.stages import ensure_parameters, load_parameters
from cuzk_engine.errors import InvalidRequest, ParameterFileError

CID = "winning-post.tiny"


@pytest.fixture
def cache(tmp_path, tiny_cache):
    for suffix in (".params", ".vk"):
        (tmp_path / f"{CID}{suffix}").write_bytes((tiny_cache / f"{CID}{suffix}").read_bytes())
    return tmp_path


def test_round_trip_and_no_regeneration(cache):
    params_path, vk_path = groth16.parameter_paths(cache, CID)
    before = params_path.stat().st_mtime_ns
    ensure_parameters(cache, "winning-post", "tiny")
    assert params_path.stat().st_mtime_ns == before
    params = groth16.load_parameters(cache, CID)
    assert params.circuit_id == CID and params.nbytes > 0
    assert groth16.parameters_file_bytes(cache, CID) == (
        params_path.stat().st_size + vk_path.stat().st_size)
    assert json.loads(vk_path.read_text()) == params.vk.to_json()
    assert b"NOT A TRUSTED SETUP" in params_path.read_bytes()[:2000]


def test_setup_is_reproducible_and_leaves_no_temporary_files(tmp_path, cache):
    ensure_parameters(tmp_path / "fresh", "winning-post", "tiny")
    fresh = tmp_path / "fresh"
    assert sorted(p.name for p in fresh.iterdir()) == [f"{CID}.params", f"{CID}.vk"]
    assert (fresh / f"{CID}.vk").read_bytes() == (cache / f"{CID}.vk").read_bytes()


def test_truncated_file_is_a_clear_error(cache):
    params_path, _ = groth16.parameter_paths(cache, CID)
    data = params_path.read_bytes()
    params_path.write_bytes(data[:-100])
    for action in (lambda: groth16.load_parameters(cache, CID),
                   lambda: ensure_parameters(cache, "winning-post", "tiny")):
        with pytest.raises(ParameterFileError) as err:
            action()
        assert str(params_path) in str(err.value) and "truncated" in str(err.value)
        assert "python -m cuzk_engine setup --kind winning-post --profile tiny" in str(err.value)


def test_corrupt_body_is_detected(cache):
    params_path, _ = groth16.parameter_paths(cache, CID)
    data = bytearray(params_path.read_bytes())
    data[-5] ^= 0xFF
    params_path.write_bytes(bytes(data))
    with pytest.raises(ParameterFileError, match="digest mismatch"):
        groth16.load_parameters(cache, CID)


def test_corrupt_header(cache):
    params_path, _ = groth16.parameter_paths(cache, CID)
    params_path.write_bytes(b"garbage" * 10)
    with pytest.raises(ParameterFileError, match="not a cuzk parameter file"):
        groth16.load_parameters(cache, CID)


def test_vk_that_does_not_belong_is_detected(cache, tiny_cache):
    _, vk_path = groth16.parameter_paths(cache, CID)
    vk_path.write_bytes((tiny_cache / "window-post.tiny.vk").read_bytes())
    with pytest.raises(ParameterFileError, match="does not belong"):
        groth16.load_parameters(cache, CID)
    vk_path.write_text("{not json")
    with pytest.raises(ParameterFileError, match="corrupt verifying key"):
        groth16.load_parameters(cache, CID)


def test_missing_files(tmp_path):
    with pytest.raises(ParameterFileError, match="missing"):
        groth16.load_parameters(tmp_path, CID)
    with pytest.raises(ParameterFileError, match="missing"):
        groth16.parameters_file_bytes(tmp_path, CID)
    with pytest.raises(InvalidRequest):
        load_parameters(tmp_path, "nope.tiny")


def test_force_regenerates_a_corrupt_file(cache):
    params_path, _ = groth16.parameter_paths(cache, CID)
    good = params_path.read_bytes()
    params_path.write_bytes(good[:50])
    ensure_parameters(cache, "winning-post", "tiny", force=True)
    assert params_path.read_bytes() == good
    assert not [p for p in os.listdir(cache) if p.startswith(".")]
