"""What the docs show stays true: the example configuration and the README circuits table."""

import subprocess

from cuzk_engine.config import EngineConfig, load_config
from cuzk_engine.vocabulary import DEFAULT_PRIORITIES


def test_example_config_loads_and_matches_the_defaults(repo):
    example = load_config(repo / "cuzk.example.toml")
    defaults = EngineConfig()
    assert example.devices == defaults.devices
    assert example.gpu_workers_per_device == defaults.gpu_workers_per_device
    assert example.daemon.listen == defaults.daemon.listen
    assert example.memory.eviction_min_idle == defaults.memory.eviction_min_idle
    assert example.status.retention == defaults.status.retention
    assert example.priorities == DEFAULT_PRIORITIES


def test_readme_circuits_table_is_the_commands_output(repo, python):
    table = subprocess.run([python, "-m", "cuzk_engine", "circuits"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert table.count("\n") == 17  # header, rule, 16 circuits
    assert table in (repo / "README.md").read_text()
