"""The console's own clients and files, hardened: no proxy from the environment, bounded
answers, and a fleet.toml write-back that keeps links, modes and other people's edits.

Real processes on loopback: a real agent, a real gateway, and a real (tiny) HTTP proxy
that records every connection made to it.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import signal
import socketserver
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.collect.clients.actions import ActionError, AgentActions
from console.collect.clients.gateway_client import GatewayClient
from console.collect.sources.collector import Collector
from console.commands.failover import Ask, run_failover
from console.core.config.load import MissingSecret, load_fleet
from console.gateway.routing.routes import FleetFileChanged, save_to_fleet
from tests.conftest import OPERATOR, ROOT, agent_env
from tests.engines.servers import free_port, stop, wait_until
from tests.support.cost import traced
from tests.support.fleet import deployment, fleet_toml
from tests.support.serving import wait_serving

FLEET = """\
# production routes: this comment must survive
[fleet]
name = "wb"

[[nodes]]
name = "n1"
agent = "http://127.0.0.1:9"

[[models]]
name = "tiny"

  [[models.deployments]]
  id = "tiny-a"   # the main one
  node = "n1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:9"
  weight = 100

  [[models.deployments]]
  id = "tiny-b"
  node = "n1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:9"
  weight = 0
"""


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- fleet.toml write-back ------------------------------------------------------------------


def test_saving_routes_through_a_symlinked_fleet_file_updates_the_target_and_keeps_the_link(
    tmp_path,
):
    real = tmp_path / "config" / "fleet.toml"
    real.parent.mkdir()
    real.write_text(FLEET)
    real.chmod(0o640)
    link = tmp_path / "fleet.toml"
    link.symlink_to(real)
    fleet = load_fleet(link)
    changed = save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    assert sorted(changed) == ["tiny/tiny-a 100->30", "tiny/tiny-b 0->70"]
    assert link.is_symlink() and os.readlink(link) == str(real)
    text = real.read_text()
    assert "weight = 30" in text and "weight = 70" in text
    assert "# production routes: this comment must survive" in text
    assert 'id = "tiny-a"   # the main one' in text
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert leftovers(real.parent) == [] and leftovers(tmp_path) == []


def test_a_second_save_after_the_first_is_not_taken_for_someone_elses_edit(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    changed = save_to_fleet(fleet, {"tiny": {"tiny-a": 0, "tiny-b": 100}})
    assert sorted(changed) == ["tiny/tiny-a 30->0", "tiny/tiny-b 70->100"]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("weight = 0\n", "weight = 5  # an operator's hand edit\n"),
        ('name = "wb"', 'name = "wb-renamed"'),
        ('name = "wb"', 'name = "wb" ['),  # half-saved by an editor: not even TOML
    ],
    ids=["weight", "other key", "unparsable"],
)
def test_a_fleet_file_edited_since_it_was_loaded_is_not_overwritten(tmp_path, edit, why):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    edited = FLEET.replace(edit, why, 1)
    path.write_text(edited)
    with pytest.raises(FleetFileChanged) as refused:
        save_to_fleet(fleet, {"tiny": {"tiny-a": 30, "tiny-b": 70}})
    message = str(refused.value)
    assert message.startswith(f"{path}: changed on disk since the gateway loaded it"), message
    assert "reload the gateway (SIGHUP)" in message
    assert path.read_text() == edited  # the edit is kept, byte for byte
    assert leftovers(tmp_path) == []  # and nothing half-written lies next to it


def test_a_fleet_file_with_only_a_new_comment_is_saved_with_the_comment(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    path.write_text("# a note added by hand\n" + FLEET)
    save_to_fleet(fleet, {"tiny": {"tiny-a": 30}})
    text = path.read_text()
    assert text.startswith("# a note added by hand\n") and "weight = 30" in text


# -- a real gateway and a real agent, and a proxy nobody asked for ------------------------

ADMIN = "admin-token-hardening-0123"
OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]  # the env value is NAME:TOKEN

AGENT_FLEET = """\
[fleet]
name = "proxied"
[agent]
state_dir = "{state}"
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"
"""


def console_fleet(gateway_port: int, state: Path, agent: str, dead: int) -> str:
    """The gateway (admin token in T_ADMIN), node "local" at `agent` (T_OP), and model tiny
    on two deployments whose engine is gone (port `dead`)."""
    return fleet_toml(
        fleet={"name": "proxied"},
        gateway={"url": f"http://127.0.0.1:{gateway_port}", "token_env": "T_ADMIN",
                 "state_dir": state, "health_interval_s": 0.5},
        nodes=[{"name": "local", "agent": agent, "token_env": "T_OP"}],
        models=[{"name": "tiny", "deployments": [
            deployment("tiny-a", "local", "vllm", dead, weight=100),
            deployment("tiny-b", "local", "vllm", dead, weight=0),
        ]}],
    )  # fmt: skip


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    url: str
    fleet: Path

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(trust_env=False, timeout=10) as http:
            return http.request(method, self.url + path, headers=headers, **kw)


def start_gateway(fleet: Path, port: int) -> Gateway:
    """`engineroom gateway` as a real process (its deployments need not answer here)."""
    log = fleet.parent / "gateway.log"
    env = {**agent_env(), "T_ADMIN": ADMIN, "T_OP": OPERATOR_TOKEN}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(fleet)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    gateway = Gateway(process, f"http://127.0.0.1:{port}", fleet)

    wait_serving(process, log, lambda: gateway.admin("GET", "/healthz").status_code == 200,
                 "gateway")  # fmt: skip
    return gateway


@pytest.fixture
def fleet_with_gateway(tmp_path: Path, agent_factory: Any) -> Iterator[tuple[Path, Gateway]]:
    """A real agent and a real gateway, started before any proxy variable is set."""
    agent = agent_factory(AGENT_FLEET.format(state=tmp_path / "agent-state"))
    port = free_port()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        console_fleet(
            gateway_port=port, state=tmp_path / "gw-state", agent=agent.url, dead=free_port()
        )
    )
    gateway = start_gateway(fleet, port)
    yield fleet, gateway
    stop(gateway.process, grace=5)


class RecordingProxy(socketserver.ThreadingTCPServer):
    """A real HTTP listener on loopback posing as a proxy: it records every connection
    (and the request's first line) and answers 502."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _ProxyHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(2)
        try:
            first = self.request.recv(4096).split(b"\r\n", 1)[0]
        except OSError:
            first = b"(nothing)"
        assert isinstance(self.server, RecordingProxy)
        self.server.seen.append(first.decode(errors="replace"))
        self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProxy]:
    server = RecordingProxy()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, server.url)
        monkeypatch.setenv(name.lower(), server.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    yield server
    server.shutdown()
    server.server_close()


async def test_no_console_client_sends_a_token_through_a_proxy_from_the_environment(
    fleet_with_gateway, monkeypatch, request
):
    path, _ = fleet_with_gateway
    monkeypatch.setenv("T_ADMIN", ADMIN)
    monkeypatch.setenv("T_OP", OPERATOR_TOKEN)
    proxy = request.getfixturevalue("proxy")  # only now: the agent and gateway ran without
    fleet = load_fleet(path)

    actions = AgentActions(fleet, "local")
    try:
        assert (await actions.whoami()).role == "operator"  # the jobs API
        assert await actions.jobs() == []
    finally:
        await actions.close()

    client = GatewayClient(fleet)
    try:
        assert "tiny" in json.dumps(await client.snapshot())  # the gateway's admin API
    finally:
        await client.close()

    out = io.StringIO()
    code = await asyncio.to_thread(run_failover, fleet, Ask("tiny", to="tiny-b"), out=out)
    assert code in (0, 1), out.getvalue()  # answered (accepted or refused), not unreachable

    async with Collector(fleet, mode="poll") as collector:  # aiohttp: the snapshots
        await collector.poll_all()
    assert collector.states["local"].error is None, collector.states["local"].error

    assert proxy.seen == [], f"requests went to the proxy: {proxy.seen}"


@pytest.mark.parametrize("token", [None, "", "   "])
def test_the_gateway_client_without_its_token_says_which_variable_and_sends_nothing(
    tmp_path, monkeypatch, token
):
    """Before: the console's client sent `Authorization: Bearer ` (an empty token) when
    the variable was unset, and called a blank one configured; the failover command
    refused both. Now one client, one rule: no token, no request."""
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET + '\n[gateway]\nurl = "http://127.0.0.1:9"\ntoken_env = "T_ADMIN"\n')
    if token is None:
        monkeypatch.delenv("T_ADMIN", raising=False)
    else:
        monkeypatch.setenv("T_ADMIN", token)
    fleet = load_fleet(path)
    assert not GatewayClient.configured(fleet)
    with pytest.raises(MissingSecret, match="T_ADMIN is not set"):
        GatewayClient(fleet)
    with pytest.raises(MissingSecret, match="T_ADMIN is not set"):
        run_failover(fleet, Ask("tiny", to="tiny-b"), out=io.StringIO())


# -- answers: a total deadline and a size cap ---------------------------------------------


class BrokenAgentDouble(socketserver.ThreadingTCPServer):
    """TEST DOUBLE of an agent gone wrong (no real agent does this), one behaviour per
    listener: `enormous` answers 200 with a chunked body of 256 MiB, `trickle` sends its
    body one byte every 0.25 s, `gzip` sends a compressed answer though asked for none,
    `html502` answers as a proxy in front of a dead gateway would, `notajob` accepts a
    failover with an answer that is no job."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        super().__init__(("127.0.0.1", 0), _BrokenAgentHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


CHUNK = b"x" * 2**20
CHUNKED = f"{len(CHUNK):x}\r\n".encode() + CHUNK + b"\r\n"  # sent again and again: no growth


def _head(status: str, content_type: str, length: int, *more: str) -> bytes:
    """An HTTP/1.1 answer's head: `status`, its content type, `more` header lines, and its
    body's length."""
    lines = [f"HTTP/1.1 {status}", f"content-type: {content_type}", *more]
    return "".join(f"{line}\r\n" for line in [*lines, f"content-length: {length}", ""]).encode()


class _BrokenAgentHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, BrokenAgentDouble)
        self.request.settimeout(30)
        try:
            self.request.recv(65536)
            if self.server.mode == "enormous":
                self.request.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for _ in range(256):
                    self.request.sendall(CHUNKED)
                self.request.sendall(b"0\r\n\r\n")
            elif self.server.mode == "trickle":
                body = b'{"role": "operator", "padding": "' + b"x" * 40 + b'"}'
                self.request.sendall(_head("200 OK", "application/json", len(body)))
                for byte in body:
                    self.request.sendall(bytes([byte]))
                    threading.Event().wait(0.25)
            elif self.server.mode == "notajob":
                body = b'{"accepted": true}'
                self.request.sendall(_head("202 Accepted", "application/json", len(body)) + body)
            elif self.server.mode == "html502":
                body = b"<html><body>502 Bad Gateway</body></html>"
                self.request.sendall(_head("502 Bad Gateway", "text/html", len(body)) + body)
            else:
                body = gzip.compress(b'{"role": "operator"}')
                gzipped = _head("200 OK", "application/json", len(body), "content-encoding: gzip")
                self.request.sendall(gzipped + body)
        except OSError:
            pass  # the client hung up: what the console should do


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("enormous", "answered with over 8 MiB"),
        ("trickle", "no answer within 2 s"),
        ("gzip", "answered compressed (gzip) though asked not to"),
    ],
)
async def test_an_agent_that_answers_without_end_costs_one_deadline_and_at_most_the_cap(
    tmp_path, monkeypatch, mode, expected
):
    server = BrokenAgentDouble(mode)
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[fleet]\nname = "b"\n[[nodes]]\nname = "bad"\nagent = "{server.url}"\n'
        'token_env = "T_OP"\n'
    )
    monkeypatch.setenv("T_OP", OPERATOR_TOKEN)
    actions = AgentActions(load_fleet(path), "bad", timeout=2)
    try:
        with traced() as cost, pytest.raises(ActionError) as failed:
            await actions.whoami()
    finally:
        await actions.close()
        server.shutdown()
        server.server_close()
    took = cost.took()
    assert str(failed.value) == f"bad: agent {server.url} did not answer ({expected})"
    assert failed.value.status is None  # unreachable, not refused: the CLI exits 2
    assert took < 4, f"{mode}: {took:.1f} s for a 2 s deadline"
    assert cost.peak < 20 * 2**20, f"{mode}: the console held {cost.peak / 2**20:.0f} MiB"


def test_a_hand_edit_made_while_the_gateway_runs_is_never_overwritten_by_a_save(
    fleet_with_gateway,
):
    path, gateway = fleet_with_gateway
    weights = {"weights": {"tiny-a": 40, "tiny-b": 60}, "why": "test"}
    assert gateway.admin("PUT", "/admin/routes/tiny", json=weights).status_code == 200
    edited = path.read_text().replace("health_interval_s = 0.5", "health_interval_s = 0.7")
    path.write_text(edited)

    refused = gateway.admin("POST", "/admin/routes/save")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"].startswith(f"{path}: changed on disk since the gateway")
    assert path.read_text() == edited

    gateway.process.send_signal(signal.SIGHUP)  # the operator reloads, as the error says
    wait_until(
        lambda: gateway.admin("POST", "/admin/routes/save").status_code == 200,
        20,
        what="a save after the reload",
    )
    text = path.read_text()
    assert "health_interval_s = 0.7" in text  # the hand edit
    assert "weight = 40" in text and "weight = 60" in text  # and the routes


@pytest.mark.parametrize(
    ("mode", "code", "expected"),
    [
        ("enormous", 2, "the gateway did not answer: answered with over 8 MiB"),
        ("html502", 1, "failover refused: HTTP 502: <html><body>502 Bad Gateway</body></html>"),
        # Before: a KeyError traceback ('id').
        ("notajob", 2, "the gateway answered HTTP 202 that is not a FailoverJob (id: Field"),
    ],
)
def test_the_failover_command_reads_a_bounded_answer_and_says_what_came(
    tmp_path, monkeypatch, capsys, mode, code, expected
):
    """Before: a non-JSON 502 crashed the command with a JSONDecodeError traceback, and an
    endless answer was read whole."""
    server = BrokenAgentDouble(mode)
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET + f'\n[gateway]\nurl = "{server.url}"\ntoken_env = "T_ADMIN"\n')
    monkeypatch.setenv("T_ADMIN", "admin-secret-for-the-test")
    try:
        with traced() as cost:
            got = run_failover(load_fleet(path), Ask("tiny", to="tiny-b"), out=io.StringIO())
    finally:
        server.shutdown()
        server.server_close()
    assert got == code
    assert expected in capsys.readouterr().err
    assert cost.peak < 20 * 2**20, f"{mode}: the command held {cost.peak / 2**20:.0f} MiB"
