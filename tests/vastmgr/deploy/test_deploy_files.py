"""The shipped systemd units are valid for systemd, and each runs a command this project has."""

import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import get_commands

from tests.conftest import REPO

from .test_production import service_settings, unit_commands

UNITS = sorted(p.name for p in (REPO / "deploy" / "systemd").glob("*.service"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_every_unit(tmp_path: Path):
    venv_bin = str(Path(unit_commands(UNITS[0], "ExecStart")[0][0]).parent)
    for unit in [*UNITS, "vastmgr.target"]:
        text = (REPO / "deploy" / "systemd" / unit).read_text()
        # Paths of this checkout in place of the documented install's, which do not exist here.
        text = text.replace("/opt/vastmgr/venv/bin", venv_bin).replace(
            "/etc/vastmgr/vastmgr.env", str(REPO / "deploy" / "vastmgr.env.example"))
        (tmp_path / unit).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no",
                           *(f"./{unit}" for unit in [*UNITS, "vastmgr.target"])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    # systemd ignores a setting it cannot parse with a warning only: any output is a finding.
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), \
        done.stdout + done.stderr


def test_units_run_this_projects_commands_and_restart_with_hardening():
    commands = get_commands()
    assert UNITS == ["vastmgr-automation.service", "vastmgr-controller.service",
                     "vastmgr-dashboard.service", "vastmgr-notifier.service"]
    target = (REPO / "deploy" / "systemd" / "vastmgr.target").read_text()
    for unit in UNITS:
        assert unit in target
        service = service_settings(unit)
        for argv in unit_commands(unit, "ExecStartPre") + unit_commands(unit, "ExecStart"):
            if argv[1] == "manage.py":
                assert argv[2] in commands, argv
        assert service["Restart"][0] in ("always", "on-failure")
        assert service["NoNewPrivileges"] == ["yes"] and service["ProtectSystem"] == ["strict"]
        assert service["EnvironmentFile"] == ["/etc/vastmgr/vastmgr.env"]
