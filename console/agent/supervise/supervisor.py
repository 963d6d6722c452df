"""Engines the agent started: spawned in sessions of their own, found again after a restart.

Each managed engine has a directory under `STATE_DIR/NODE/engines/ENGINE_ID/`:

    engine.json   what was started, by which job, and the session leader's pid
    status.json   written by the log capper: the engine's pid, then its exit code
    engine.log    the engine's output, capped and rotated (engine.log.1, ...)

The session leader is the log capper (console.agent.supervise.logcap), which runs the engine. It
is not a child of the agent's process group, so stopping or upgrading the agent leaves
the engine running; a new agent reads engine.json, checks the pid still belongs to the
same process (start time), and adopts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil

from console.agent.jobs.launch import Launch
from console.agent.supervise.processes import Group, terminate
from console.agent.supervise.signals import group_alive, group_pids

__all__ = ["Managed", "Supervisor", "group_pids"]


@dataclass(slots=True)
class Managed:
    engine_id: str
    kind: str
    profile: str
    overrides: dict[str, Any]
    endpoint: str
    served_model_name: str
    argv: list[str]
    pgid: int  # the log capper: session and process-group leader
    leader_created: float  # its start time, so a reused pid is not mistaken for it
    job_id: str
    started: float  # wall clock
    dir: Path
    log_offset: int = 0  # where this run's output starts in engine.log
    gpus: list[int] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES, as launched
    # Set when this agent spawned it (reaps the leader); None for an adopted engine.
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.dir / "engine.log"

    @property
    def status_path(self) -> Path:
        return self.dir / "status.json"

    def status(self) -> dict[str, Any]:
        try:
            data = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def engine_pid(self) -> int | None:
        pid = self.status().get("engine_pid")
        return pid if isinstance(pid, int) else None

    def exit_code(self) -> int | None:
        code = self.status().get("exit_code")
        return code if isinstance(code, int) else None

    def alive(self) -> bool:
        """True while any process of the engine's group runs (the leader is reaped here).

        Only the group this record names: a pid reused by another session leader is not
        it, however many members that one has."""
        if self.process is not None:
            self.process.poll()
        return group_alive(self.pgid, self.leader_created)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "process"}
        data["dir"] = str(self.dir)
        return data


class Supervisor:
    def __init__(
        self, root: Path, log_max_bytes: int, log_keep: int, hidden: Iterable[str] = ()
    ) -> None:
        self.root = root / "engines"
        self.hidden = frozenset(hidden)  # token variables the engines never see
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_max_bytes = log_max_bytes
        self.log_keep = log_keep
        self.engines: dict[str, Managed] = {}

    def spawn(
        self,
        engine_id: str,
        kind: str,
        profile: str,
        overrides: dict[str, Any],
        launch: Launch,
        endpoint: str,
        served_model_name: str,
        job_id: str,
    ) -> Managed:
        """Start `launch.argv` under the log capper, in a new session. Never via a shell.
        Safe in a worker thread: it touches no shared state; the caller, on the event loop,
        hands the result to `track` (`engines` is read there without a lock)."""
        where = self.root / engine_id
        where.mkdir(parents=True, exist_ok=True)
        for stale in ("status.json", "status.tmp"):
            (where / stale).unlink(missing_ok=True)
        capper = [
            sys.executable,
            "-m",
            "console.agent.supervise.logcap",
            "--max-bytes",
            str(self.log_max_bytes),
            "--keep",
            str(self.log_keep),
            "--log",
            str(where / "engine.log"),
            "--status",
            str(where / "status.json"),
            "--",
            *launch.argv,
        ]
        # Unbuffered: the engine's lines reach the log (and the phase clock) as it writes them.
        env = {k: v for k, v in os.environ.items() if k not in self.hidden}
        env.update({"PYTHONUNBUFFERED": "1", **launch.env})
        with (where / "engine.log").open("ab") as log:
            log.write(f"--- engineroom job {job_id}: starting {engine_id} ---\n".encode())
            log_offset = log.tell()
        with (where / "logcap.err").open("ab") as errors:
            process = subprocess.Popen(
                capper,
                env=env,
                cwd=where,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,  # outlives the agent; one signal reaches all of it
                close_fds=True,
            )
        try:
            managed = Managed(
                engine_id=engine_id,
                kind=kind,
                profile=profile,
                overrides=overrides,
                endpoint=endpoint,
                served_model_name=served_model_name,
                argv=list(launch.argv),
                pgid=process.pid,
                leader_created=psutil.Process(process.pid).create_time(),
                job_id=job_id,
                started=time.time(),
                dir=where,
                log_offset=log_offset,
                gpus=list(launch.gpus),
                process=process,
            )
            _write_json(where / "engine.json", managed.to_json())
        except BaseException:
            # No engine without its record. Our child, not yet reaped: its pid is its own.
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        return managed

    def track(self, managed: Managed) -> None:
        """Count `managed` among this agent's engines (on the event loop only)."""
        self.engines[managed.engine_id] = managed

    def adopt(self) -> tuple[list[Managed], list[tuple[str, dict[str, Any]]]]:
        """Read the engine records a previous agent left: (still running, gone with status)."""
        running: list[Managed] = []
        gone: list[tuple[str, dict[str, Any]]] = []
        for record in sorted(self.root.glob("*/engine.json")):
            try:
                data = json.loads(record.read_text())
                managed = Managed(**{**data, "dir": Path(data["dir"])})
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if managed.alive():
                self.engines[managed.engine_id] = managed
                running.append(managed)
            else:
                gone.append((managed.engine_id, {**managed.status(), "job_id": managed.job_id}))
                record.unlink(missing_ok=True)
        return running, gone

    def forget(self, engine_id: str) -> None:
        managed = self.engines.pop(engine_id, None)
        if managed is not None:
            (managed.dir / "engine.json").unlink(missing_ok=True)

    async def stop(self, managed: Managed, grace_s: float) -> str:
        """SIGTERM the engine's main process; SIGKILL its whole group after `grace_s`
        (console.agent.supervise.processes.terminate)."""
        return await terminate(
            Group(managed.pgid, managed.leader_created),
            grace_s,
            main_pid=managed.engine_pid(),
            alive=managed.alive,  # reaps the leader this agent spawned
        )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
