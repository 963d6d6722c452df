"""What an agentless host prints is outside text: numbers the console cannot hold cost
that reading, never the node's refresh (issue 27, the siblings of defect 2).

A real OpenSSH server on loopback (tests/sshd.py) runs a hostile nvidia-smi TEST DOUBLE
(these machines have no GPU): `²` and `١` as GPU indexes and pids (digits to
`str.isdigit`, not to `int`), NaN, ±Inf, 1e308 and 1e400 MiB, negative memory, unicode
digits and `1_000`. Before, the first of them raised out of the read: `check` printed a
traceback and the console's SSH loop for the node died for good.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.collect.sources.collector import Collector
from console.core.config.load import parse_fleet
from tests.conftest import run_cli
from tests.sshd import Sshd, start_sshd, stop_sshd

GOOD = "0, GPU-a, NVIDIA H200, 50, 10, 1000, 143771, 61, 100.5, 700.00, 1980, 3201, 580.1"
ROWS = [
    GOOD,
    "1, GPU-b, NVIDIA H200, nan, inf, 1e308, -5, ١٢, 1_000, +Inf, 1e400, NaN, 580.1",
    "², GPU-c, NVIDIA H200, 1, 1, 1, 1, 1, 1, 1, 1, 1, 580.1",
    "١, GPU-d, NVIDIA H200, 1, 1, 1, 1, 1, 1, 1, 1, 1, 580.1",
    "99999999999999999999, GPU-e, NVIDIA H200, 1, 1, 1, 1, 1, 1, 1, 1, 1, 580.1",
]
NVIDIA_SMI = f'''#!/usr/bin/env python3
"""TEST DOUBLE: the nvidia-smi of a host that prints what no nvidia-smi should."""
import os, sys
query = next((a for a in sys.argv[1:] if a.startswith("--query-")), "")
if query.startswith("--query-gpu="):
    print("\\n".join({ROWS!r}))
elif query.startswith("--query-compute-apps="):
    print(f"{{os.getppid()}}, 1e308, GPU-a, python3")
    print("², 100, GPU-a, python3")
    print("١, 100, GPU-a, python3")
else:
    sys.exit(2)
'''


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd-hostile"))
    smi = server.bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    yield server
    stop_sshd(server)


def fleet_text(sshd: Sshd, known_hosts: Path) -> str:
    return (
        '[fleet]\nname = "ssh"\nssh_timeout_s = 20\n[[nodes]]\nname = "bare"\n'
        f'ssh = "{sshd.user}@127.0.0.1"\nssh_port = {sshd.port}\n'
        f'ssh_key = "{sshd.client_key}"\nssh_known_hosts = "{known_hosts}"\n'
        'ssh_agent_command = ["engineroom-not-installed", "agent", "--once", "--json"]\n'
    )


async def test_a_host_printing_numbers_past_reading_costs_those_readings(sshd, tmp_path):
    collector = Collector(parse_fleet(fleet_text(sshd, sshd.known_hosts(tmp_path / "kh"))))
    async with collector:
        await collector.poll_all()
    state = collector.states["bare"]
    assert state.error is None, state.error
    snap = state.snapshot
    assert snap is not None and snap.gpu_status == "ok"
    # The rows whose index is not an index are left out; the others are read.
    assert [g.index for g in snap.gpus] == [0, 1]
    good, bad = snap.gpus
    assert (good.utilization_pct, good.temperature_c, good.power_w) == (50, 61, 100.5)
    assert good.memory_used_bytes == 1000 * 2**20 and good.sm_clock_mhz == 1980
    # Each bad cell is unknown, never 0 and never a guess.
    assert bad.uuid == "GPU-b"
    for field in (
        "utilization_pct", "memory_utilization_pct", "memory_used_bytes",
        "memory_total_bytes", "temperature_c", "power_w", "power_limit_w",
        "sm_clock_mhz", "mem_clock_mhz",
    ):  # fmt: skip
        assert getattr(bad, field) is None, field
    # The process rows: a real pid with 1e308 MiB is listed, its memory unknown; the
    # rows whose pid is not a number are left out.
    (process,) = good.processes or []
    assert process.pid > 0 and process.used_memory_bytes is None


def test_check_reads_such_a_host_without_a_traceback(sshd, tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_text(sshd, sshd.known_hosts(tmp_path / "kh")))
    result = run_cli("check", "--fleet", str(path), env={**os.environ}, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1), result.stdout + result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("bare ")]
    assert " up" in row and "    2 " in row  # two GPUs read
