"""The systemd units in deploy/ are ones systemd accepts, hardened, with tokens kept out.

`systemd-analyze verify` reads each unit as systemd would (nothing is started), with the
ExecStart path pointed at this venv's engineroom, since verify insists the command
exists. Its warnings (an unknown or misspelt directive, a value it cannot parse) are
failures here: systemd would ignore that line and run the service without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy_host import DEPLOY, INSTALLED_AT
from tests.unit_sandbox import directives as parse_directives

# `systemd-analyze security` exposure, 0 (locked down) to 10; what each unit may not exceed.
EXPOSURE_BUDGET = {"engineroom-agent.service": 4.0, "engineroom-gateway.service": 2.0}

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing: `make systemd` installs Debian's systemd package",
)


def unit_here(tmp_path: Path, name: str) -> Path:
    """The shipped unit, its ExecStart pointed at an engineroom that exists here."""
    # This venv's engineroom (any executable would do: verify checks only that it exists).
    beside = Path(sys.executable).with_name("engineroom")
    engineroom = beside if beside.exists() else Path(sys.executable)
    text = (DEPLOY / name).read_text()
    assert INSTALLED_AT in text, f"{name}: ExecStart no longer runs {INSTALLED_AT}"
    path = tmp_path / name
    path.write_text(text.replace(INSTALLED_AT, str(engineroom)))
    return path


def directives(name: str) -> dict[str, list[str]]:
    return parse_directives((DEPLOY / name).read_text())


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", sorted(EXPOSURE_BUDGET))
def test_systemd_accepts_the_unit_without_a_warning(tmp_path, name):
    checked = verify(unit_here(tmp_path, name))
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.strip() == "", checked.stderr


def test_a_misspelt_directive_is_caught(tmp_path):
    """The check above can fail: systemd only warns about a line it ignores."""
    unit = unit_here(tmp_path, "engineroom-agent.service")
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    checked = verify(unit)
    assert "Unknown key 'NoNewPrivilege'" in checked.stderr


@pytest.mark.parametrize("name", sorted(EXPOSURE_BUDGET))
def test_the_unit_is_hardened(tmp_path, name):
    found = directives(name)
    assert found["NoNewPrivileges"] == ["yes"]
    assert found["ProtectSystem"] == ["strict"]
    assert found["StateDirectory"], name
    assert found["CapabilityBoundingSet"] == [""]  # no capability at all
    scored = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=yes",
            "--no-pager",
            str(unit_here(tmp_path, name)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", scored.stdout)
    assert level, scored.stdout + scored.stderr
    assert float(level.group(1)) <= EXPOSURE_BUDGET[name], scored.stdout


@pytest.mark.parametrize("name", sorted(EXPOSURE_BUDGET))
def test_tokens_come_from_an_environment_file_only(name):
    found = directives(name)
    assert [f for f in found["EnvironmentFile"] if f.startswith("/etc/engineroom/")]
    for value in found.get("Environment", []):
        assert "TOKEN" not in value.upper() and "KEY" not in value.upper(), value
