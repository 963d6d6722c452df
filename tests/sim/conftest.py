"""The SIMULATED fleets as real processes: `python -m console.sim`, started and stopped for sure."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from console.core.config.load import load_fleet
from console.core.wire import Snapshot
from tests.engines.servers import log_tail, stop

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "sim-token-0123456789"


@dataclass
class SimFleet:
    process: subprocess.Popen[bytes]
    fleet: Path
    log: Path

    def get(self, url: str, token: str | None = TOKEN, timeout: float = 10.0) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(url, headers=headers, timeout=timeout)

    def snapshots(self) -> dict[str, Snapshot]:
        """Each node's snapshot, as its agent answers now."""
        out = {}
        for node in load_fleet(self.fleet).nodes:
            assert node.agent is not None
            resp = self.get(f"{node.agent}/v1/snapshot")
            resp.raise_for_status()
            out[node.name] = Snapshot.model_validate_json(resp.content)
        return out


def _first_line(process: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    """The first stdout line, within `timeout` s; fails with the log if the process exits."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    buffer = b""
    ready_by = timeout
    while b"\n" not in buffer:
        ready, _, _ = select.select([fd], [], [], ready_by)
        if not ready:
            raise TimeoutError(f"no first line within {timeout:g} s:\n{log_tail(log)}")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError(f"console.sim exited {process.wait()}:\n{log_tail(log)}")
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode()


def start_sim(workdir: Path, *args: str) -> SimFleet:
    """`python -m console.sim ARGS --out WORKDIR`, ready when it prints its fleet file."""
    log = workdir / "sim.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEROOM_")}
    env["ENGINEROOM_DEMO_TOKEN"] = TOKEN
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "console.sim", *args, "--out", str(workdir)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # so stop() can take down anything it leaves
        )
    try:
        line = _first_line(process, log, timeout=60)
    except BaseException:
        stop(process, grace=5)
        raise
    assert line.startswith("fleet: "), line
    return SimFleet(process, Path(line.removeprefix("fleet: ")), log)


def end(sim: SimFleet) -> int:
    """SIGTERM the simulation itself (not its group) and wait; the group goes afterwards."""
    sim.process.send_signal(signal.SIGTERM)
    try:
        return sim.process.wait(timeout=15)
    finally:
        stop(sim.process, grace=5)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    sim = start_sim(tmp_path_factory.mktemp("demo"), "--nodes", "2")
    yield sim
    end(sim)
