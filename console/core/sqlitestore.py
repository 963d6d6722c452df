"""A durable record of jobs and of who did what: SQLite, one file per process.

The agent keeps one per node (console.agent.jobs.store) and the gateway one with its route
table besides (console.gateway.routing.routes); both are this store with their own tables added.

Every write is its own committed transaction in WAL mode with synchronous=FULL, so a
`kill -9` loses no record that was acknowledged. Tokens never reach the store: an action
is recorded under the token's name (viewer-1, alice, ...).

A job's state changes by compare-and-set: one transaction reads nothing and writes
`UPDATE ... WHERE id = ? AND state IN (open states)`, and the audit row of an ending goes
in the same transaction. A job ends once, whoever else has the file open (a second agent
on the same folder once failed a job twice, 2 ms apart).
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
OPEN: tuple[JobState, ...] = ("queued", "running")

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


class JobEnded(ValueError):
    """The job had already ended (or never existed) when a change to it was attempted."""


class JobStore:
    """Jobs and the audit log; a subclass adds its own tables in `schema`."""

    schema = ""  # a subclass's own tables, created with the shared ones

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # One connection, used from the event loop and job threads alike, behind a lock.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA + self.schema)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, *statements: tuple[str, tuple[Any, ...]]) -> int:
        """Run `statements` in one transaction, or none of them if the first changes no
        row (a compare-and-set that lost); the rows the first one changed."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                changed = self._db.execute(*statements[0]).rowcount
                if changed == 0:
                    self._db.execute("ROLLBACK")
                    return 0
                for statement in statements[1:]:
                    self._db.execute(*statement)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return changed

    def audit(
        self, who: str, action: str, params: dict[str, Any], result: dict[str, Any] | None = None
    ) -> None:
        self._write(_audit_row(who, action, params, result))

    def create_job(self, kind: str, who: str, params: dict[str, Any]) -> JobRecord:
        now = time.time()
        job = JobRecord(uuid.uuid4().hex[:12], kind, "queued", who, params, now, now, None)
        self._write(
            (
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?)",
                (job.id, kind, job.state, who, json.dumps(params, sort_keys=True), now, now, None),
            ),
            _audit_row(who, f"job {kind} created", {"id": job.id, **params}),
        )
        return job

    def update_job(
        self, job_id: str, state: JobState, result: dict[str, Any] | None = None
    ) -> None:
        """Move an open job to `state`; JobEnded if it had ended (or does not exist).

        The check and the write are one statement, so two writers cannot both end a job."""
        current = self.job(job_id)  # for the audit row's who and kind; never the check
        if current is None:
            raise KeyError(job_id)
        statements = [
            (
                f"UPDATE jobs SET state = ?, updated = ?, result = ? "
                f"WHERE id = ? AND state IN ({','.join('?' * len(OPEN))})",
                (
                    state,
                    time.time(),
                    None if result is None else json.dumps(result, sort_keys=True),
                    job_id,
                    *OPEN,
                ),
            )
        ]
        if state in FINAL:
            statements.append(
                _audit_row(current.who, f"job {current.kind} {state}", {"id": job_id}, result)
            )
        if self._write(*statements) == 0:  # another writer ended it first; no audit row
            raise JobEnded(f"job {job_id} already ended")

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
        """Jobs a previous process left queued or running (it was killed): for the restart."""
        marks = ",".join("?" * len(OPEN))
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created DESC", OPEN
            ).fetchall()
        return [_job(r) for r in rows]


def _audit_row(
    who: str, action: str, params: dict[str, Any], result: dict[str, Any] | None = None
) -> tuple[str, tuple[Any, ...]]:
    return (
        "INSERT INTO audit (time, who, action, params, result) VALUES (?,?,?,?,?)",
        (
            time.time(),
            who,
            action,
            json.dumps(params, sort_keys=True),
            None if result is None else json.dumps(result, sort_keys=True),
        ),
    )


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
