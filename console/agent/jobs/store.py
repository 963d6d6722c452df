"""The agent's durable record of jobs and of who did what: SQLite, one file per node
(console.core.sqlitestore holds the store, shared with the gateway)."""

from __future__ import annotations

from console.core.sqlitestore import FINAL, OPEN, JobEnded, JobRecord, JobState, JobStore

__all__ = ["FINAL", "OPEN", "JobEnded", "JobRecord", "JobState", "Store"]


class Store(JobStore):
    """The agent's jobs (vLLM starts and stops, drills) and audit log."""
