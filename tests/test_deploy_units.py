"""The gateway and the agent run as their systemd units run them, and every operation an
operator relies on still works there: saving routes with a stream in flight, a failover
through HAProxy that writes its weights back, an engine started, its log rotated, stopped.

Each process is started by tests/unit_sandbox.py as its unit in deploy/ says, over the
folders deploy/README.md's `install` lines build (docs/haproxy.md's for haproxy.cfg), each
path under this test's own folder. Emulated from the unit:
- SystemCallFilter= (groups expanded by the installed `systemd-analyze syscall-filter`,
  applied with libseccomp), SystemCallArchitectures=native, RestrictAddressFamilies=,
  MemoryDenyWriteExecute=. A denied call KILLS the process here even where the unit says
  SystemCallErrorNumber=EPERM: the code must make none (an EPERM it swallows would hide
  one). `test_the_shipped_gateway_unit_answers_a_denied_call_with_an_error` checks the
  unit's own answer;
- User=/Group= (`nobody`, an unprivileged uid standing in for `engineroom`), UMask=,
  LimitNOFILE= (capped by this machine's hard limit), NoNewPrivileges=, no capabilities;
- ProtectSystem=strict with ReadWritePaths= and StateDirectory= (made as systemd makes
  it: the user's, StateDirectoryMode=), PrivateTmp=, ProtectHome= (homes hidden, except
  the Python installation the test runs), Environment= (%S is /var/lib).
Not emulated: EnvironmentFile= (the test passes the tokens itself), PrivateDevices=,
ProtectProc=, ProtectKernel*=, ProtectClock=, ProtectControlGroups=, RestrictNamespaces=,
RestrictRealtime=, LockPersonality=, Restart=.

HAProxy runs as root, as Debian's unit runs it; the engines are tests/engine_double.py
(ENGINE DOUBLES: these tests are about files, users and system calls, not inference).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import OPERATOR, ROOT, VIEWER, agent_env
from tests.deploy_host import (
    AGENT_UNIT,
    DEPLOY,
    GATEWAY_UNIT,
    SERVICE_USER,
    Layout,
    Service,
    how_it_ended,
    install_lines,
    sandbox_of,
    start_in_sandbox,
    why_no_sandbox,
)
from tests.engines.servers import free_port, free_ports, log_tail, stop, wait_until
from tests.support.haproxy import runtime
from tests.test_agent_hardening import ENGINE_DOUBLE

pytestmark = pytest.mark.skipif(why_no_sandbox() is not None, reason=str(why_no_sandbox()))
ADMIN = "admin-token-0123456789"

# -- the gateway -------------------------------------------------------------------------------

FLEET = """\
# the gateway's host: this comment must survive a save
[fleet]
name = "units"

[gateway]
url = "http://127.0.0.1:{port}"
state_dir = "{state}"
health_interval_s = 0.5
{gateway_extra}

[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"
{dataplane}
[[models]]
name = "tiny"
{model_extra}
  [[models.deployments]]
  id = "a"   # the main one
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{a}"
  weight = 100

  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "http://localhost:{b}"   # resolved without AF_NETLINK (RestrictAddressFamilies)
  weight = 0
"""


@pytest.fixture
def engines(tmp_path: Path):
    """Two vLLM-shaped ENGINE DOUBLES; a streamed answer takes 30 chunks 0.1 s apart."""
    ports = free_ports(2)
    log = tmp_path / "engines.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "engine_double.py")]
            + [f"vllm:{p}" for p in ports]
            + ["--chunks", "30", "--delay", "0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_until(lambda: "listening" in log.read_text(), 30, what="engine doubles")
    yield ports
    stop(process, grace=5)


@dataclass
class GatewayHost:
    layout: Layout
    fleet: Path
    service: Service

    def admin(self, method: str, path: str, **kw: object) -> httpx.Response:
        """The admin API's answer; where the gateway hung up because it died, how it died."""
        headers = {"Authorization": f"Bearer {ADMIN}"}
        try:
            return httpx.request(method, self.service.url + path, headers=headers, timeout=30, **kw)  # type: ignore[arg-type]
        except httpx.TransportError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.service.process.wait(5)
            self.service.alive()
            raise

    def wait_healthy(self) -> None:
        def healthy() -> bool:
            routes = self.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
            return all(d["up"] for d in routes)

        wait_until(healthy, 20, what="both deployments healthy")

    def inflight(self) -> int:
        routes = self.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
        return sum(d["inflight"] for d in routes)


@pytest.fixture
def gateway_host(tmp_path: Path, engines: list[int]):
    """`make(...)`: the documented layout, fleet.toml in it, the gateway under its unit."""
    started: list[subprocess.Popen[bytes]] = []

    def make(
        dataplane: str = "",
        model_extra: str = "",
        gateway_extra: str = "",
        docs: tuple[Path, ...] = (DEPLOY / "README.md",),
        files: dict[str, str] | None = None,
        before_start=None,
    ) -> GatewayHost:
        layout = Layout(tmp_path / "host")
        port = free_port()
        text = FLEET.format(
            port=port,
            state=layout.at("/var/lib/engineroom/gateway"),
            gateway_extra=gateway_extra,
            dataplane=dataplane,
            model_extra=model_extra,
            a=engines[0],
            b=engines[1],
        )
        layout.build(list(docs), {"fleet.toml": text, **(files or {})})
        box, argv = sandbox_of(GATEWAY_UNIT, layout, {"ENGINEROOM_ADMIN_TOKEN": ADMIN})
        fleet = Path(argv[argv.index("--fleet") + 1])
        assert fleet.read_text() == text, f"{fleet}: not where deploy/README.md installs it"
        if before_start is not None:
            before_start(layout)
        process = start_in_sandbox(box, argv, tmp_path / "gateway.log")
        started.append(process)
        service = Service(process, f"http://127.0.0.1:{port}", tmp_path / "gateway.log")
        return GatewayHost(layout, fleet, service.up())

    yield make
    for process in started:
        stop(process, grace=5)


def stream_through(url: str, done: dict[str, object]) -> None:
    """One streamed completion through the gateway; `done` says how it ended."""
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 30, "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        done["status"], done["events"] = resp.status_code, events
    except httpx.HTTPError as exc:
        done["error"] = repr(exc)


def test_saving_routes_under_the_gateways_unit_keeps_it_serving_and_writes_fleet_toml(
    gateway_host,
):
    host = gateway_host()
    host.wait_healthy()
    weights = {"weights": {"a": 30, "b": 70}, "why": "test"}
    assert host.admin("PUT", "/admin/routes/tiny", json=weights).status_code == 200
    done: dict[str, object] = {}
    client = threading.Thread(target=stream_through, args=(host.service.url, done))
    client.start()
    wait_until(lambda: host.inflight() > 0, 10, what="a stream in flight")

    saved = host.admin("POST", "/admin/routes/save")  # before: its filter killed the gateway

    client.join(30)
    host.service.alive()
    assert saved.status_code == 200, saved.text
    assert sorted(saved.json()["changed"]) == ["tiny/a 100->30", "tiny/b 0->70"]
    events = done.get("events")
    assert done.get("status") == 200 and isinstance(events, list), done
    assert events[-1] == "data: [DONE]", done
    text = host.fleet.read_text()
    assert "# the gateway's host: this comment must survive a save" in text
    assert "weight = 30" in text and "weight = 70" in text
    info = host.fleet.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (host.layout.uid, 0o644)
    assert [p.name for p in host.fleet.parent.iterdir()] == ["fleet.toml"]  # no temp left


def test_a_save_the_folder_refuses_is_a_clear_error_and_the_gateway_keeps_serving(
    gateway_host,
):
    """The layout deploy/README.md gave before: fleet.toml in a folder that is root's."""

    def folder_is_roots(layout: Layout) -> None:
        os.chown(layout.at("/etc/engineroom/fleet"), 0, 0)

    host = gateway_host(before_start=folder_is_roots)
    before = host.fleet.read_text()
    weights = {"weights": {"a": 30, "b": 70}, "why": "test"}
    assert host.admin("PUT", "/admin/routes/tiny", json=weights).status_code == 200

    refused = host.admin("POST", "/admin/routes/save")

    host.service.alive()
    assert refused.status_code == 500, refused.text
    assert refused.headers["Content-Type"].startswith("application/json"), refused.text
    error = refused.json()["error"]
    assert error.startswith(f"{host.fleet}: the routes were not written back: "), error
    assert "Permission denied" in error and "deploy/README.md" in error, error
    assert "Traceback" not in error and "\n" not in error
    assert host.fleet.read_text() == before
    assert [p.name for p in host.fleet.parent.iterdir()] == ["fleet.toml"]
    routes = host.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
    assert {d["id"]: d["weight"] for d in routes} == {"a": 30, "b": 70}  # still routing


def test_a_gateway_asked_for_more_connections_than_its_file_limit_starts_and_says_so(
    gateway_host,
):
    """max_connections past LimitNOFILE: the gateway asks for more open files as it starts.
    glibc asks with prlimit64, which @system-service keeps (setrlimit itself is in the
    denied @resources): it serves, and says it may open fewer files than it needs."""
    host = gateway_host(gateway_extra="max_connections = 40000")
    assert host.admin("GET", "/admin/routes").status_code == 200
    assert "max_connections 40000 needs about 80256 open files" in host.service.log.read_text()


def test_the_shipped_gateway_unit_answers_a_denied_call_with_an_error(tmp_path: Path):
    """The unit as written (SystemCallErrorNumber=): a call its filter denies fails; the
    process lives on. Without the setting, systemd kills it (SIGSYS)."""
    layout = Layout(tmp_path / "host")
    layout.build([DEPLOY / "README.md"], {"fleet.toml": ""})
    box, _ = sandbox_of(GATEWAY_UNIT, layout, {})
    probe = "import os; os.fchown(0, os.getuid(), os.getgid())"
    code = (
        f"try:\n    {probe}\nexcept OSError as exc:\n"
        "    print('refused:', exc.strerror)\nelse:\n    print('allowed')"
    )
    log = tmp_path / "probe.log"
    process = start_in_sandbox(box, [sys.executable, "-c", code], log, denied_kills=False)
    assert process.wait(30) == 0, how_it_ended(process, log)
    assert log.read_text().strip() == "refused: Operation not permitted"


# -- the gateway and HAProxy ---------------------------------------------------------------


def doc_value(doc: Path, key: str) -> str:
    """`key = "..."` in the first TOML example of `doc` that sets it."""
    found = re.search(rf'^{key} = "([^"]+)"', doc.read_text(), re.MULTILINE)
    assert found, f"{doc}: no {key} in its fleet.toml example"
    return found.group(1)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy: make haproxy")
@pytest.mark.parametrize("owner", ["engineroom", "root"])
def test_a_failover_through_haproxy_writes_its_weights_back_under_the_unit(
    gateway_host, tmp_path: Path, owner: str
):
    """docs/haproxy.md's paths: before, /etc/haproxy/haproxy.cfg, which the unit may not
    write, failed every failover at its first shift. A haproxy.cfg left root's (rendered
    into place by root, or adopted) is replaced all the same: before, the write-back tried
    to give the new file root's ownership, a call the unit denies, and the gateway died."""
    doc = ROOT / "docs" / "haproxy.md"
    config, admin_socket = doc_value(doc, "config"), doc_value(doc, "admin_socket")
    user, group = SERVICE_USER, grp.getgrgid(pwd.getpwnam(SERVICE_USER).pw_gid).gr_name
    front = free_port()
    haproxy: list[subprocess.Popen[bytes]] = []

    def start_haproxy(layout: Layout) -> None:
        """Rendered from fleet.toml, installed as docs/haproxy.md says, run as root."""
        sock = layout.at(admin_socket)
        sock.parent.mkdir(parents=True, exist_ok=True)  # Debian's tmpfiles make /run/haproxy
        fleet = layout.at("/etc/engineroom/fleet/fleet.toml")
        rendered = tmp_path / "haproxy.cfg"
        made = subprocess.run(
            [sys.executable, "-m", "console.cli", "haproxy", "render", "--fleet", str(fleet),
             "--out", str(rendered)],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=agent_env(),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert any("haproxy.cfg" in argv for argv in install_lines(doc)), f"{doc}: no install"
        layout.build([doc], {"haproxy.cfg": rendered.read_text()})
        if owner == "root":
            os.chown(layout.at(config), 0, 0)
        assert layout.at(config).is_file(), f"{doc}: config = {config} is not what it installs"
        log = tmp_path / "haproxy.log"
        argv = ["haproxy", "-db", "-f", str(layout.at(config))]
        with log.open("wb") as out:
            haproxy.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        wait_until(lambda: sock.exists() or haproxy[0].poll() is not None, 20, what="socket")
        assert haproxy[0].poll() is None, log_tail(log)

    plane = f"""
[[dataplanes]]
name = "edge"
kind = "haproxy"
admin_socket = "{{sock}}"
config = "{{config}}"
listen = "127.0.0.1:{front}"
socket_user = "{user}"
socket_group = "{group}"
"""
    # The paths are the layout's: formatted once the layout exists (below).
    layout_root = tmp_path / "host"
    dataplane = plane.format(
        sock=layout_root / admin_socket.lstrip("/"), config=layout_root / config.lstrip("/")
    )
    try:
        host = gateway_host(
            dataplane=dataplane,
            model_extra='dataplane = "edge"',
            docs=(DEPLOY / "README.md",),
            before_start=start_haproxy,
        )
        sock = host.layout.at(admin_socket)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert sock.stat().st_uid == host.layout.uid, "the socket is the gateway user's"
        host.wait_healthy()
        ask = {"model": "tiny", "to": "b", "mode": "emergency", "why": "test"}
        started = host.admin("POST", "/admin/failover", json=ask)
        assert started.status_code == 202, started.text

        def ended() -> dict | None:
            job = host.admin("GET", f"/admin/jobs/{started.json()['id']}").json()
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_until(ended, 60, interval=0.2, what="the failover")
        host.service.alive()
        assert job["state"] == "succeeded", job.get("error")
        assert runtime(sock, "get weight be_tiny/b").startswith("100 "), "the live weight"
        text = host.layout.at(config).read_text()
        assert re.search(r"server b \S+ weight 100\b", text), text
        assert re.search(r"server a \S+ weight 0\b", text), text
    finally:
        for process in haproxy:
            stop(process, grace=5)


# -- the agent ---------------------------------------------------------------------------------

AGENT_FLEET = """\
[fleet]
name = "units"

[agent]
state_dir = "{state}"
listen = "127.0.0.1:{port}"
scrape_interval_s = 1
engine_log_max_bytes = 4096
engine_log_keep = 2

[[nodes]]
name = "{node}"
agent = "http://127.0.0.1:{port}"

[profiles.chatty]
engine = "vllm"
node = "{node}"
model = "{model}"
served_model_name = "chatty"
port = {engine_port}
command = ["{python}", "{double}"]
args = {{ host = "127.0.0.1" }}
ready_timeout_s = 60
stop_grace_s = 10
"""

# The ENGINE DOUBLE of tests/test_agent_hardening.py, after 12 KiB of start-up lines: three
# times the log's cap, so the agent's log capper rotates.
CHATTY_DOUBLE = (
    "for i in range(150):\n    print(f'loading shard {i:04d} ' + 'x' * 60, flush=True)\n"
    + ENGINE_DOUBLE
)


def operator_post(url: str, body: dict) -> httpx.Response:
    token = OPERATOR.split(":", 1)[1]
    return httpx.post(
        url + "/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def job_ended(url: str, job_id: str) -> dict:
    def ended() -> dict | None:
        resp = httpx.get(
            f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {VIEWER}"}, timeout=10
        )
        job = resp.json()
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(ended, 90, interval=0.2, what=f"job {job_id}")


def test_the_agent_under_its_unit_starts_an_engine_rotates_its_log_and_stops_it(
    tmp_path: Path,
):
    layout = Layout(tmp_path / "host")
    port, engine_port = free_ports(2)
    model, double = layout.at("/srv/models/tiny"), layout.at("/srv/doubles/chatty.py")
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    double.parent.mkdir(parents=True)
    double.write_text(CHATTY_DOUBLE)
    for path in (layout.at("/srv"), model.parent, model, double.parent):
        path.chmod(0o755)
    node = socket.gethostname()  # the agent's node, when its unit names none
    state = layout.at("/var/lib/engineroom/agent")
    text = AGENT_FLEET.format(
        state=state, port=port, node=node, model=model, engine_port=engine_port,
        python=sys.executable, double=double,
    )  # fmt: skip
    layout.build([DEPLOY / "README.md"], {"fleet.toml": text})
    env = {k: v for k, v in agent_env().items() if k.startswith("ENGINEROOM_")}
    box, argv = sandbox_of(AGENT_UNIT, layout, env)
    log = tmp_path / "agent.log"
    agent = Service(start_in_sandbox(box, argv, log), f"http://127.0.0.1:{port}", log)
    engine_group = None
    try:
        agent.up()
        started = operator_post(agent.url, {"kind": "vllm.start", "profile": "chatty"})
        assert started.status_code == 202, started.text
        job = job_ended(agent.url, started.json()["id"])
        assert job["state"] == "succeeded", job
        engine_id = job["result"]["engine_id"]
        where = state / node / "engines" / engine_id
        engine_group = json.loads((where / "engine.json").read_text())["pgid"]
        wait_until(lambda: (where / "engine.log.1").exists(), 20, what="a rotated engine log")
        for made in [state / node / "jobs.sqlite", *where.iterdir()]:
            info = made.stat()
            assert info.st_uid == layout.uid, made
            assert stat.S_IMODE(info.st_mode) & 0o077 == 0, f"{made}: UMask=0077 not kept"
        assert sum(p.stat().st_size for p in where.glob("engine.log*")) <= 3 * 4096 + 200

        stopping = operator_post(agent.url, {"kind": "engine.stop", "engine": engine_id})
        assert stopping.status_code == 202, stopping.text
        assert job_ended(agent.url, stopping.json()["id"])["state"] == "succeeded"
        status = json.loads((where / "status.json").read_text())
        assert status["exit_code"] == -signal.SIGTERM, status
        agent.alive()
    finally:
        stop(agent.process, grace=5)
        if engine_group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine_group, signal.SIGKILL)
