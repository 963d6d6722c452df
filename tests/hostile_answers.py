"""Outside text with terminal sequences in it, and the servers that answer with it, for the
escape-injection tests (issue 27, defect 6).

Real HTTP servers in the test process, as tests/hostile_exporter.py: a vLLM server whose
version and model names carry the payloads (what a real agent probes), a compromised
node's agent (every string of its snapshot, jobs, logs and reports is the attacker's: the
agent runs on the node as the engines' user), and a gateway answering the same way. They
are not stand-ins for the real parts' normal behaviour; they are what a console meets
when one of them is hostile.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from console.core import wire
from console.core.drills import report as drillreport
from tests.support.loopback_http import LoopbackHttp, QuietHandler

PAYLOADS = {
    "osc-title": "\x1b]0;PWNED-TITLE\x07",
    "osc-link": "\x1b]8;;http://evil.example/\x1b\\LINKED\x1b]8;;\x1b\\",
    "csi-clear": "\x1b[2JCLEARED",
    "csi-colour": "\x1b[31mREDDENED",
    "c1-csi": "\x9b2JEIGHTBIT",
    "c1-osc": "\x9d0;EIGHTOSC\x9c",
    "cr": "ok\rFAIL",
    "bidi": "rtl\u202eGNP",
    "zero-width": "zero\u200bWIDTH",
}
EVERY = "".join(PAYLOADS.values())

# The payloads' own bytes on the wire to a terminal: none may reach it. (Textual's own
# sequences do; these are the attacker's, with their text, or characters Textual never
# sends.)
RAW = (
    b"\x1b]0;PWNED",
    b"\x1b]8;;http://evil",
    b"\x1b[2JCLEARED",
    b"\x1b[31mREDDENED",
    "\x9b".encode(),
    "\x9d".encode(),
    "\x9c".encode(),
    b"ok\rFAIL",
    "\u202e".encode(),
    "\u200b".encode(),
)
# What shows instead: each payload's characters as their escapes.
MARKERS = (
    r"\x1b]0;PWNED-TITLE\x07",
    r"\x1b[2JCLEARED",
    r"\x9b2JEIGHTBIT",
    r"ok\rFAIL",
    r"rtl\u202eGNP",
    r"zero\u200bWIDTH",
)


def unsafe(text: str) -> list[str]:
    """The characters in `text` that a terminal could read as a sequence or that hide or
    reorder text: controls (but the newline that ends a line), format characters, line
    and paragraph separators."""
    return sorted(
        {
            ch
            for ch in text
            if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        }
    )


def raw_in(data: bytes) -> list[bytes]:
    return [r for r in RAW if r in data]


Route = Callable[[str, str, bytes], tuple[int, bytes, str] | None]


class Answers(LoopbackHttp):
    """A real HTTP server on a free loopback port; `route(method, path, body)` answers
    (status, body, content type), None: 404."""

    def __init__(self, route: Route) -> None:
        owner = self

        class Handler(QuietHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                found = owner.route(self.command, self.path, body)
                status, data, ctype = found or (404, b'{"error": "not found"}', "application/json")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

        self.route = route
        super().__init__(Handler)


def _json(value: Any, status: int = 200) -> tuple[int, bytes, str]:
    return status, json.dumps(value).encode(), "application/json"


# -- a vLLM server with hostile answers, for a real agent to probe ------------------------

VERSION = "0.11" + EVERY
MODEL_IDS = [f"m-{name}-{text}" for name, text in PAYLOADS.items()]


def hostile_vllm(method: str, path: str, body: bytes) -> tuple[int, bytes, str] | None:
    path = urlsplit(path).path
    if path == "/health":
        return 200, b"", "text/plain"
    if path == "/version":
        return _json({"version": VERSION})
    if path == "/v1/models":
        return _json({"object": "list", "data": [{"id": m, "object": "model"} for m in MODEL_IDS]})
    return None  # /metrics: 404, so the models are those /v1/models lists


# -- a compromised node's agent -----------------------------------------------------------

ENGINE_ID = "vllm-8000"  # the one a test types (`:engine NODE/vllm-8000`); its text is hostile
RUNNING_JOB, DRILL_JOB = "j-run", "j-drill"


def _jobs(now: float) -> list[wire.Job]:
    step = wire.JobStep(name="load", state="running", started=now - 5, detail="load " + EVERY)
    run = wire.Job(
        id=RUNNING_JOB,
        kind="vllm.start",
        state="running",
        who="who" + PAYLOADS["bidi"],
        created=now - 10,
        updated=now,
        params={"profile": "p" + PAYLOADS["osc-title"]},
        steps=[step],
    )
    drill = wire.Job(
        id=DRILL_JOB,
        kind="drill.run",
        state="failed",
        who="alice",
        created=now - 100,
        updated=now - 50,
        params={"drill": "d" + PAYLOADS["csi-clear"]},
        steps=[
            wire.JobStep(
                name="build", state="failed", started=now - 99, ended=now - 50, detail="b" + EVERY
            )
        ],
        error="failed: " + EVERY,
        result={
            "drill": "d" + PAYLOADS["csi-clear"],
            "deployment": "dep" + PAYLOADS["c1-csi"],
            "model": "model`|" + PAYLOADS["cr"],
            "gates": [{"gate": "g" + PAYLOADS["zero-width"], "ok": False, "detail": EVERY}],
            "versions": {"driver": "575" + PAYLOADS["osc-link"]},
            "build_key": "key" + PAYLOADS["c1-osc"],
            "log_tail": [f"line {name} {text}" for name, text in PAYLOADS.items()] + ["```"],
        },
    )
    return [run, drill]


def snapshot(node: str) -> dict[str, Any]:
    now = time.time()
    snap = wire.Snapshot.model_validate(
        {
            "node": {"name": node, "agent_version": "0.1" + EVERY, "time": now},
            "host": {
                "cpu_pct": 10,
                "mem_used_bytes": 2**30,
                "mem_total_bytes": 2**32,
                "disks": [{"path": "/data" + PAYLOADS["osc-link"], "error": "disk " + EVERY}],
            },
            "gpu_status": "ok",
            "driver_version": "575" + EVERY,
            "cuda_driver_version": "12.8" + PAYLOADS["bidi"],
            "gpus": [
                {
                    "index": 0,
                    "name": "H200" + EVERY,
                    "utilization_pct": 50,
                    "processes": [{"pid": 42, "engine_id": ENGINE_ID, "name": "py" + EVERY}],
                }
            ],
            "engines": [
                {
                    "id": ENGINE_ID,
                    "kind": "vllm",
                    "version": VERSION,
                    "state": "unhealthy",
                    "reason": "why " + EVERY,
                    "models": [{"name": m} for m in MODEL_IDS],
                },
                {  # an engine in no deployment: its id and model are the attacker's too
                    "id": "e" + PAYLOADS["osc-title"],
                    "kind": "vllm",
                    "version": VERSION,
                    "state": "ready",
                    "models": [{"name": "m-bad"}],
                },
            ],
            "jobs": [j.model_dump() for j in _jobs(now)],
            "trt_engines": [
                {
                    "deployment": "dep" + PAYLOADS["c1-csi"],
                    "model": "m" + PAYLOADS["cr"],
                    "state": "stale",
                    "reasons": ["driver " + EVERY],
                }
            ],
            "missing": ["missing " + EVERY],
        }
    )
    return snap.model_dump(mode="json", by_alias=True)


REFUSAL = "refused " + EVERY


def compromised_agent(node: str) -> Route:
    """The agent API v1 of a node whose agent the attacker runs."""

    def route(method: str, path: str, body: bytes) -> tuple[int, bytes, str] | None:
        path = urlsplit(path).path
        now = time.time()
        jobs = {j.id: j for j in _jobs(now)}
        if path == "/healthz":
            return _json({"status": "ok", "version": "0.1"})
        if path == "/v1/whoami":
            return _json({"name": "ops", "role": "operator", "jobs": True})
        if path == "/v1/snapshot":
            return _json(snapshot(node))
        if path == "/v1/jobs" and method == "GET":
            return _json([j.model_dump() for j in jobs.values()])
        if path == "/v1/jobs" and method == "POST":
            kind = json.loads(body or b"{}").get("kind")
            if kind == "vllm.start":  # accepted, and failed at once
                failed = jobs[DRILL_JOB].model_copy(update={"id": "j-new", "kind": kind})
                return _json(failed.model_dump(), 202)
            checks = [{"name": "port" + PAYLOADS["cr"], "ok": False, "detail": EVERY}]
            return _json({"error": REFUSAL, "checks": checks}, 409)
        if path in ("/v1/jobs/plan", "/v1/drills/what-if") and method == "POST":
            if path.endswith("what-if"):
                return _json([{"node": node + PAYLOADS["bidi"], "deployment": "dep" + EVERY,
                               "verdict": "rebuild", "why": ["why " + EVERY]}])  # fmt: skip
            return _json({"error": REFUSAL}, 409)
        parts = path.split("/")  # "", "v1", "jobs", ID, [log | report]
        if len(parts) >= 4 and parts[2] == "jobs":
            job = jobs.get(parts[3]) or jobs[DRILL_JOB].model_copy(update={"id": parts[3]})
            if method == "DELETE":
                return _json({"error": REFUSAL}, 409)
            if len(parts) == 4:
                return _json(job.model_dump())
            if parts[4] == "log":
                lines = [f"log {name} {text}" for name, text in PAYLOADS.items()]
                return 200, "\n".join(lines).encode(), "text/plain"
            if parts[4] == "report":
                return _json(drillreport.report(job, node))
        return None

    return route


# -- a gateway answering the same way -----------------------------------------------------


def hostile_gateway(method: str, path: str, body: bytes) -> tuple[int, bytes, str] | None:
    path = urlsplit(path).path
    if path == "/admin/failover" and method == "POST":
        if json.loads(body or b"{}").get("to") == "refused":
            return _json({"error": REFUSAL}, 409)
        return _json(_failover_job("running"))
    if path.startswith("/admin/jobs/"):
        return _json(_failover_job("failed"))
    return None


def _failover_job(state: str) -> dict[str, Any]:
    now = time.time()
    return {
        "id": "fo-1",
        "kind": "failover.planned",
        "state": state,
        "who": "ops" + PAYLOADS["bidi"],
        "created": now - 3,
        "updated": now,
        "steps": [
            {"name": "preflight" + PAYLOADS["cr"], "state": "succeeded", "detail": EVERY},
            {"name": "shift", "state": state, "detail": "shift " + EVERY},
        ],
        "before": {"a" + PAYLOADS["osc-title"]: 100},
        "after": {"b" + PAYLOADS["zero-width"]: 100},
        "error": None if state == "running" else "failed " + EVERY,
    }
