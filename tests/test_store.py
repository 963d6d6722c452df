"""The agent's SQLite record: what was acknowledged survives a kill -9 of the agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from console.agent.jobs.store import Store
from tests.conftest import ROOT


def test_jobs_move_through_their_states_and_are_audited(tmp_path):
    store = Store(tmp_path / "agent.db")
    job = store.create_job("vllm.start", "alice", {"profile": "llama8b-vllm", "port": 8001})
    store.update_job(job.id, "running")
    store.update_job(job.id, "succeeded", {"cold_start_s": 41.2})
    again = store.job(job.id)
    assert again is not None and again.state == "succeeded"
    assert again.result == {"cold_start_s": 41.2}
    with pytest.raises(ValueError, match="already ended"):
        store.update_job(job.id, "failed")
    actions = [(a["who"], a["action"]) for a in store.audit_log()]
    assert actions == [("alice", "job vllm.start succeeded"), ("alice", "job vllm.start created")]
    store.close()


def test_a_killed_agent_loses_no_acknowledged_record(tmp_path):
    db = tmp_path / "agent.db"
    # A process that writes records, says so after each, then waits to be killed.
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from console.agent.jobs.store import Store
        store = Store(Path({str(db)!r}))
        for i in range(50):
            job = store.create_job("engine.stop", "bob", {{"i": i}})
            store.update_job(job.id, "succeeded", {{"i": i}})
            print(job.id, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    acknowledged = [proc.stdout.readline().strip() for _ in range(50)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(db)
    for job_id in acknowledged:
        job = store.job(job_id)
        assert job is not None and job.state == "succeeded", job_id
    assert len(store.audit_log(limit=1000)) == 100
    assert store.interrupted() == []
    store.close()


def test_jobs_left_running_by_a_dead_agent_are_found(tmp_path):
    store = Store(tmp_path / "agent.db")
    job = store.create_job("vllm.start", "alice", {"profile": "p"})
    store.update_job(job.id, "running")
    store.close()
    reopened = Store(tmp_path / "agent.db")
    assert [j.id for j in reopened.interrupted()] == [job.id]
    reopened.close()
