"""How an operator action reads: one definition for the live console, a recording and its
replay (console/collect/views/operator_actions.py), and what the console keeps of them within
its bounds.

The jobs are the shape the agent's snapshot carries (console.core.snapshot.Job) and the
audit rows the shape GET /admin/audit answers; tests/test_tui_operator_actions.py takes
them from a real agent and a real gateway.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.collect.clients.gateway_client import GatewayClient, GatewayError
from console.collect.recordings.reader import Recording
from console.collect.recordings.recorder import Recorder
from console.collect.recordings.replay import ReplayCollector
from console.collect.recordings.writer import RecordingWriter
from console.collect.views import operator_actions
from console.collect.views.alerts import Event, EventLog
from console.collect.views.operator_actions import ActionTracker, event_of, gateway_job
from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot, job_from
from tests.tui_support import CPU, FLEET

T0 = 1_790_000_000.0


def _job(state: str, steps: dict[str, str], t: float) -> dict:
    return {
        "id": "a1b2c3", "kind": "vllm.start", "state": state, "who": "alice", "created": T0,
        "updated": t, "params": {"profile": "tiny-standby", "overrides": {"port": 8011}},
        "steps": [{"name": n, "state": s} for n, s in steps.items()], "result": {},
        "error": "load: the engine exited with code 1" if state == "failed" else None,
    }  # fmt: skip


JOBS = [
    _job("running", {"preflight": "running", "load": "pending"}, T0 + 1),
    _job("running", {"preflight": "succeeded", "load": "running"}, T0 + 2),
    _job("failed", {"preflight": "succeeded", "load": "failed"}, T0 + 3),
]
AUDIT = [  # newest first, as GET /admin/audit answers
    {"time": T0 + 9, "who": "admin", "action": "job failover.planned failed",
     "params": {"id": "f00d"}, "result": {"error": "TTFT p95 over the SLO"}},
    {"time": T0 + 6, "who": "admin", "action": "routes set",
     "params": {"model": "tiny", "weights": {"tiny-trt": 50, "tiny-vllm": 50},
                "why": "failover f00d: shift 50%"}, "result": None},
    {"time": T0 + 5, "who": "admin", "action": "job failover.planned created",
     "params": {"id": "f00d", "model": "tiny", "to": "tiny-vllm", "mode": "planned",
                "why": "trt engine stale"}, "result": None},
]  # fmt: skip


def test_a_job_and_a_failover_read_the_same_live_and_in_a_replay(tmp_path: Path):
    live = ActionTracker()
    lines = []
    for raw in JOBS:
        lines += [event_of(r) for r in live.jobs("cpu-1", [job_from(raw)])]
    lines += [event_of(r) for r in live.audit(AUDIT)]
    assert [(e.subject, e.message) for e in lines] == [
        ("cpu-1", "by alice: job a1b2c3 vllm.start tiny-standby running: "
                  "overrides={'port': 8011}"),
        ("cpu-1", "by alice: job a1b2c3 vllm.start tiny-standby running: preflight "
                  "succeeded, load running"),
        # The failed step is the error's ("load: ..."): said once, as where the failure
        # is seen only at the end (below).
        ("cpu-1", "by alice: job a1b2c3 vllm.start tiny-standby failed: load: the engine "
                  "exited with code 1"),
        ("tiny", "by admin: gateway: job failover.planned created: to tiny-vllm (planned), "
                 "job f00d (trt engine stale)"),
        ("tiny", "by admin: gateway: routes set: tiny-trt=50 tiny-vllm=50 (failover f00d: "
                 "shift 50%)"),
        # Its end is audited with the job's id alone: the target is the created row's.
        ("tiny", "by admin: gateway: job failover.planned failed: to tiny-vllm (planned), "
                 "job f00d (trt engine stale)"),
    ]  # fmt: skip
    assert [e.time for e in lines] == [T0 + 1, T0 + 2, T0 + 3, T0 + 5, T0 + 6, T0 + 9]
    assert live.jobs("cpu-1", [job_from(JOBS[-1])]) == [] and live.audit(AUDIT) == []

    # The same through a recording: the recorder writes, replay reads back.
    fleet = parse_fleet(FLEET)
    snap = json.loads(CPU.read_text())
    path = tmp_path / "actions.rec"
    writer = RecordingWriter(path, fleet_text=FLEET, fleet_source="fleet.toml")
    recorder = Recorder(writer, fleet.fleet.refresh_s)
    for raw in JOBS:
        node = decode_snapshot(json.dumps({**snap, "jobs": [raw]}))
        state = ReplayCollector(fleet, {"cpu-1": node}).states["cpu-1"]
        recorder.node_updated(state)
    recorder.audit(AUDIT)
    writer.close()
    replay = ReplayCollector(fleet, recording=Recording(path))
    replay.move_to(replay.last)
    replayed = [e for e in reversed(replay.events_until()) if e.kind == "action"]
    assert [(e.subject, e.message, e.time) for e in replayed] == [
        (e.subject, e.message, e.time) for e in lines
    ]


def test_a_gateway_failover_job_is_a_job_with_its_target():
    job = gateway_job(
        {"id": "f00d", "kind": "failover.emergency", "state": "failed", "who": "admin",
         "created": T0, "updated": T0 + 2, "params": {"model": "tiny", "to": "tiny-vllm"},
         "steps": [{"name": "readiness", "state": "failed", "detail": "refused"}],
         "before": {"tiny-trt": 100}, "after": None, "error": "readiness: refused"}
    )  # fmt: skip
    assert job is not None
    assert (job.kind, operator_actions.job_target(job), job.error) == (
        "failover.emergency", "tiny-vllm", "readiness: refused",
    )  # fmt: skip
    assert job.result["before"] == {"tiny-trt": 100}
    assert gateway_job({"id": "x", "state": "bogus"}) is None


def test_a_rollouts_audit_row_names_the_rollout_with_who_and_why():
    row = {"time": 1.0, "who": "bob", "action": "rollout halted",
           "params": {"id": "3f2a1c9e0b12", "why": "step 1 (tiny-a): drain: ..."}}  # fmt: skip
    (record,) = ActionTracker().audit([row])
    assert record["message"] == "gateway: rollout halted: rollout 3f2a1c9e0b12"
    assert (record["who"], record["why"]) == ("bob", "step 1 (tiny-a): drain: ...")


def test_what_the_console_keeps_is_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(operator_actions, "MAX_KNOWN", 3)
    tracker = ActionTracker()
    jobs = [job_from({**JOBS[0], "id": f"j{i}"}) for i in range(5)]
    assert len(tracker.jobs("n", jobs)) == 5
    assert len(tracker._jobs.items) == 3  # the oldest two forgotten
    assert tracker.jobs("n", jobs[2:]) == []  # the three kept are not said again
    rows = [{"time": T0 + i, "who": "a", "action": "routes set", "params": {}} for i in range(5)]
    assert len(tracker.audit(rows)) == 5 and len(tracker._audit.items) == 3

    log = EventLog(limit=3)
    for t in (10.0, 30.0, 20.0):  # an action seen after a newer event goes in its place
        log.add(Event(t, "action", "info", "n", f"at {t:g}"))
    assert [e.time for e in log.events] == [30.0, 20.0, 10.0]
    log.add(Event(5.0, "action", "info", "n", "older than all kept"))
    assert [e.time for e in log.events] == [30.0, 20.0, 10.0]  # not kept
    log.add(Event(25.0, "action", "info", "n", "between"))
    assert [e.time for e in log.events] == [30.0, 25.0, 20.0]  # the oldest gave way


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A gateway that answers GET /admin/jobs with whatever the test set (the audit: no
    row), and counts the calls."""

    answer = b"[]"
    calls: list[str] = []

    def do_GET(self) -> None:  # http.server's name for it
        self.calls.append(self.path)
        body = self.answer if self.path == "/admin/jobs" else b"[]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def odd_gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[http.server.HTTPServer, str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("T_ODD_ADMIN", "odd-admin-token")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server, url
    server.shutdown()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b'{"jobs": []}', "HTTP 200: {"),
        (b"[1, 2]", "HTTP 200: /admin/jobs is not a list of objects"),
        (b'[{"id": "x"}]', "HTTP 200 that is not a FailoverJob (kind: Field required"),
    ],
)
async def test_a_gateway_job_list_that_is_not_one_is_said_in_one_line(odd_gateway, answer, said):
    _, url = odd_gateway
    _Gateway.answer = answer
    fleet = parse_fleet(FLEET + f'\n[gateway]\nurl = "{url}"\ntoken_env = "T_ODD_ADMIN"\n')
    client = GatewayClient(fleet, timeout=5)
    actions = operator_actions.GatewayActions(ActionTracker())
    try:
        with pytest.raises(GatewayError) as caught:
            await client.jobs()
        assert said in str(caught.value) and "\n" not in str(caught.value)
        assert await actions.read(client) == []
        assert actions.jobs == [] and actions.error is not None and said in actions.error
    finally:
        await client.close()


async def test_the_gateways_jobs_are_read_every_few_seconds_and_each_poll_while_one_runs(
    odd_gateway,
):
    """Not 50 jobs at every refresh for a screen that may not be open; but a failover's
    progress stays live."""
    _, url = odd_gateway
    fleet = parse_fleet(FLEET + f'\n[gateway]\nurl = "{url}"\ntoken_env = "T_ODD_ADMIN"\n')
    client = GatewayClient(fleet, timeout=5)
    actions = operator_actions.GatewayActions(ActionTracker())
    ended = {"id": "f00d", "kind": "failover.planned", "state": "succeeded", "who": "admin",
             "created": T0, "params": {"model": "tiny", "to": "tiny-vllm"}}  # fmt: skip
    _Gateway.answer, _Gateway.calls = json.dumps([ended]).encode(), []
    try:
        await actions.read(client)
        assert _Gateway.calls == ["/admin/jobs", "/admin/audit"]
        assert [j.id for j in actions.jobs] == ["f00d"] and actions.error is None
        await actions.read(client)  # the next refresh: nothing due
        assert len(_Gateway.calls) == 2
        actions._next_read = 0.0  # AUDIT_EVERY_S later
        await actions.read(client)
        assert len(_Gateway.calls) == 4
        _Gateway.answer = json.dumps([{**ended, "state": "running"}]).encode()
        await actions.read(client)  # started since: seen at the next due read
        assert len(_Gateway.calls) == 4
        actions._next_read = 0.0
        await actions.read(client)
        assert actions.jobs[0].state == "running"
        for _ in range(2):  # a failover runs: read at each poll
            await actions.read(client)
        assert len(_Gateway.calls) == 10
    finally:
        await client.close()


@pytest.mark.parametrize(
    "row",
    [
        {"time": "yesterday", "who": "x", "action": "routes set", "params": {}},
        {"time": float("nan"), "action": "routes set"},
        {"time": [1, 2], "who": {"a": 1}, "action": ["job"], "params": []},
        {"time": 10**400, "action": "job failover created", "params": {"id": [1]}},
        "not a row",
        None,
    ],
    ids=["text-time", "nan-time", "unhashable", "huge-time", "string", "none"],
)
def test_a_hostile_audit_row_costs_that_row_never_the_tracker(row):
    """The gateway's audit rows are outside text: a time that is not one, a field that
    is a list, a row that is not a dict raised in the tracker, which the console's
    gateway poll and `engineroom record` call every few seconds."""
    import math

    tracker = ActionTracker()
    records = tracker.audit([row, {"time": 1_796_083_200.0, "action": "routes set"}])
    assert records and all(math.isfinite(r["t"]) and r["t"] > 0 for r in records)
    assert [event_of(r).kind for r in records] == ["action"] * len(records)
