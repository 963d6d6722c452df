"""The agent's durable record of jobs and of who did what: SQLite, one file per node.

Every write is its own committed transaction in WAL mode with synchronous=FULL, so a
`kill -9` of the agent loses no record it had acknowledged. Tokens never reach the
store: an action is recorded under the token's name (viewer-1, alice, ...).

Groundwork for the jobs of the vLLM lifecycle and the rebuild drills: the store is in
place and tested; the job runner that fills it is not written yet.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINAL: tuple[JobState, ...] = ("succeeded", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    who TEXT NOT NULL,
    params TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    result TEXT
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    who TEXT NOT NULL,
    action TEXT NOT NULL,
    params TEXT NOT NULL,
    result TEXT
);
"""


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    kind: str
    state: JobState
    who: str
    params: dict[str, Any]
    created: float
    updated: float
    result: dict[str, Any] | None


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # One connection, used from the event loop and job threads alike, behind a lock.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def audit(
        self, who: str, action: str, params: dict[str, Any], result: dict[str, Any] | None = None
    ) -> None:
        self._write(
            "INSERT INTO audit (time, who, action, params, result) VALUES (?,?,?,?,?)",
            (
                time.time(),
                who,
                action,
                json.dumps(params, sort_keys=True),
                None if result is None else json.dumps(result, sort_keys=True),
            ),
        )

    def create_job(self, kind: str, who: str, params: dict[str, Any]) -> JobRecord:
        now = time.time()
        job = JobRecord(uuid.uuid4().hex[:12], kind, "queued", who, params, now, now, None)
        self._write(
            "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?)",
            (job.id, kind, job.state, who, json.dumps(params, sort_keys=True), now, now, None),
        )
        self.audit(who, f"job {kind} created", {"id": job.id, **params})
        return job

    def update_job(
        self, job_id: str, state: JobState, result: dict[str, Any] | None = None
    ) -> None:
        current = self.job(job_id)
        if current is None:
            raise KeyError(job_id)
        if current.state in FINAL:
            raise ValueError(f"job {job_id} already ended ({current.state})")
        self._write(
            "UPDATE jobs SET state = ?, updated = ?, result = ? WHERE id = ?",
            (
                state,
                time.time(),
                None if result is None else json.dumps(result, sort_keys=True),
                job_id,
            ),
        )
        if state in FINAL:
            self.audit(current.who, f"job {current.kind} {state}", {"id": job_id}, result)

    def job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def jobs(self, limit: int = 100, kinds: tuple[str, ...] = ()) -> list[JobRecord]:
        """The newest jobs first; only those of `kinds` when given (filtered in SQL)."""
        where = f"WHERE kind IN ({','.join('?' * len(kinds))}) " if kinds else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM jobs {where}ORDER BY created DESC LIMIT ?", (*kinds, limit)
            ).fetchall()
        return [_job(r) for r in rows]

    def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT time, who, action, params, result FROM audit ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {
                "time": t,
                "who": w,
                "action": a,
                "params": json.loads(p),
                "result": None if r is None else json.loads(r),
            }
            for t, w, a, p, r in rows
        ]

    def interrupted(self) -> list[JobRecord]:
        """Jobs a previous agent left queued or running (it was killed): for the restart."""
        return [j for j in self.jobs(limit=10_000) if j.state not in FINAL]


def _job(row: tuple[Any, ...]) -> JobRecord:
    job_id, kind, state, who, params, created, updated, result = row
    return JobRecord(
        job_id,
        kind,
        state,
        who,
        json.loads(params),
        created,
        updated,
        None if result is None else json.loads(result),
    )
