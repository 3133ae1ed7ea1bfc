"""Config: defaults, sizes/durations, and every unknown key or bad value named in the error."""

import pytest

from cuzk_engine.config import config_from_dict, load_config, parse_size
from cuzk_engine.errors import ConfigError


def test_defaults_and_full_file(tmp_path):
    cfg = load_config(None)
    assert cfg.gpu_workers_per_device == 2 and cfg.daemon.listen == "127.0.0.1:9821"
    assert cfg.pipeline.enabled and cfg.pipeline.split_prove
    f = tmp_path / "engine.toml"
    f.write_text('''
[gpus]
devices = ["cpu"]
gpu_workers_per_device = 3
[memory]
total_budget = "12GiB"
eviction_min_idle = "90s"
[pipeline]
enabled = false
[daemon]
listen = "0.0.0.0:9900"
token = "t"
[priorities]
porep-c2 = "high"
''')
    cfg = load_config(f)
    assert cfg.devices == ["cpu"] and cfg.gpu_workers_per_device == 3
    assert cfg.memory.total_budget == 12 * 1024**3 and cfg.memory.eviction_min_idle == 90
    assert cfg.pipeline.enabled is False and cfg.priorities["porep-c2"] == "high"
    cfg.check_daemon_security()


@pytest.mark.parametrize("data,needle", [
    ({"bogus": 1}, "'bogus'"),
    ({"memory": {"total_budgt": "1GiB"}}, "'memory.total_budgt'"),
    ({"memory": {"total_budget": "lots"}}, "memory.total_budget"),
    ({"gpus": {"gpu_workers_per_device": 0}}, "gpu_workers_per_device"),
    ({"gpus": {"devices": ["tpu"]}}, "unknown device"),
    ({"daemon": {"listen": "nohost"}}, "daemon.listen"),
    ({"pipeline": {"enabled": "yes"}}, "pipeline.enabled"),
    ({"cpu": {"msm_threads": -1}}, "cpu.msm_threads"),
    ({"cpu": {"msm_threads": "all"}}, "cpu.msm_threads"),
    ({"priorities": {"porep-c2": "urgent"}}, "priorities.porep-c2"),
    ({"priorities": {"sealing": "high"}}, "priorities.sealing"),
])
def test_bad_config_names_the_key(data, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        config_from_dict(data)


def test_off_loopback_without_token_is_refused_and_sizes_parse():
    cfg = config_from_dict({"daemon": {"listen": "0.0.0.0:9821"}})
    with pytest.raises(ConfigError, match="daemon.token"):
        cfg.check_daemon_security()
    assert parse_size("512MiB") == 512 * 1024**2 and parse_size("2GB") == 2 * 10**9
    with pytest.raises(ConfigError):
        load_config("/nonexistent/engine.toml")


def test_msm_threads_share_the_cores_among_the_provers_unless_configured(monkeypatch):
    monkeypatch.delenv("CUZK_MSM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    auto = config_from_dict({})
    assert auto.msm_threads == 0
    assert auto.resolved_msm_threads(2) == 4  # two workers proving at once: half the cores each
    assert auto.resolved_msm_threads(16) == 1  # never below one
    assert auto.resolved_msm_threads(0) == 8
    monkeypatch.setenv("CUZK_MSM_THREADS", "3")
    assert auto.resolved_msm_threads(2) == 3  # the environment, when the file says nothing
    assert config_from_dict({"cpu": {"msm_threads": 6}}).resolved_msm_threads(2) == 6
