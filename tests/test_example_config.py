"""The shipped example configuration stays loadable and says what the defaults are."""

from cuzk_engine.config import DEFAULT_PRIORITIES, EngineConfig, load_config


def test_example_config_loads_and_matches_the_defaults(repo):
    example = load_config(repo / "cuzk.example.toml")
    defaults = EngineConfig()
    assert example.devices == defaults.devices
    assert example.gpu_workers_per_device == defaults.gpu_workers_per_device
    assert example.daemon.listen == defaults.daemon.listen
    assert example.memory.eviction_min_idle == defaults.memory.eviction_min_idle
    assert example.status.retention == defaults.status.retention
    assert example.priorities == DEFAULT_PRIORITIES
