"""The log capper: rotation keeps the log under its cap, and the exit code is recorded
for an agent that is not the engine's parent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from console.agent.supervise.logcap import RotatingLog


def run_capped(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """The log capper running `argv`: its log tmp_path/engine.log (4 KiB, one old file
    kept), its status tmp_path/status.json."""
    return subprocess.run(
        [
            sys.executable, "-m", "console.agent.supervise.logcap",
            "--max-bytes", "4096", "--keep", "1",
            "--log", str(tmp_path / "engine.log"), "--status", str(tmp_path / "status.json"),
            "--", *argv,
        ],
        timeout=30,
        check=False,
    )  # fmt: skip


def test_rotation_keeps_at_most_keep_old_files_each_under_the_cap(tmp_path: Path):
    path = tmp_path / "engine.log"
    log = RotatingLog(path, max_bytes=100, keep=2)
    for i in range(50):
        log.write(f"line {i:03d} {'x' * 20}\n".encode())
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["engine.log", "engine.log.1", "engine.log.2"]
    assert all((tmp_path / f).stat().st_size <= 100 for f in files)
    assert path.read_text().splitlines()[-1].startswith("line 049")
    # Oldest first across the files: .2, .1, then the live one.
    numbers = [
        int(line.split()[1])
        for name in ("engine.log.2", "engine.log.1", "engine.log")
        for line in (tmp_path / name).read_text().splitlines()
    ]
    assert numbers == sorted(numbers) and numbers[-1] == 49


def test_the_capper_records_the_engines_pid_and_exit_code(tmp_path: Path):
    status = tmp_path / "status.json"
    result = run_capped(tmp_path, sys.executable, "-c", "print('loading'); raise SystemExit(7)")
    assert result.returncode == 7
    recorded = json.loads(status.read_text())
    assert recorded["exit_code"] == 7 and isinstance(recorded["engine_pid"], int)
    assert (tmp_path / "engine.log").read_text() == "loading\n"


def test_a_missing_binary_is_exit_127_with_the_reason_in_the_log(tmp_path: Path):
    status = tmp_path / "status.json"
    result = run_capped(tmp_path, str(tmp_path / "no-such-binary"))
    assert result.returncode == 127
    assert json.loads(status.read_text())["exit_code"] == 127
    assert "could not start" in (tmp_path / "engine.log").read_text()
