"""HAProxy's configuration file and the identity of the process behind a job, on a real
HAProxy (Debian's 2.6) and real files; no engine is needed: the servers point at closed
ports, and weights, drains and `show stat` work on them all the same.

- names from outside (fleet.toml, or a renderer called with anything) never add a line;
- the stats socket belongs to the gateway's user;
- the write-back keeps an adopted file's symbolic link and its comments;
- a write-back that fails is audited and said, after the live change was audited;
- what a running job checks HAProxy's identity against is its own: readers (the plan
  screen, another model's job) never reset it.
"""

from __future__ import annotations

import asyncio
import csv
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from console.core.config.load import Fleet, parse_fleet
from console.gateway.dataplanes.base import DataPlaneError
from console.gateway.dataplanes.haproxy import HAProxyPlane
from console.gateway.dataplanes.haproxy_config import render, split_line
from console.gateway.routing.routes import GatewayStore
from tests.engines.servers import free_port, log_tail, stop, wait_until
from tests.support.fleet import deployment, fleet_model, fleet_toml
from tests.support.haproxy import runtime

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy")

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def fleet_in(workdir: Path, owner: Mapping[str, str] | None = None) -> Fleet:
    """Two models behind HAProxy "edge" (its socket and configuration in `workdir`; `owner`:
    its socket's user and group, by default this process's), their engines gone."""
    if owner is None:
        owner = {"socket_user": USER, "socket_group": GROUP}
    closed = free_port()
    edge = {
        "name": "edge",
        "kind": "haproxy",
        "admin_socket": workdir / "admin.sock",
        "config": workdir / "haproxy.cfg",
        "listen": f"127.0.0.1:{free_port()}",
        **owner,
    }
    text = fleet_toml(
        fleet={"name": "files"},
        nodes=[{"name": "n", "agent": "http://127.0.0.1:9"}],
        dataplanes=[edge],
        models=[
            fleet_model("meta-llama/Llama-3.1-8B-Instruct", deployment("a", "n", "vllm", closed),
                        deployment("b", "n", "vllm", closed, weight=0), dataplane="edge"),
            fleet_model("llama-3.1-70b", deployment("c", "n", "vllm", closed), dataplane="edge"),
        ],
    )  # fmt: skip
    return parse_fleet(text, workdir / "fleet.toml")


def haproxy_check(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True,
                          timeout=30)  # fmt: skip


class HAProxy:
    """One HAProxy on a configuration file, restartable (a new pid, as after a reload)."""

    def __init__(self, cfg: Path, sock: Path | str) -> None:
        self.cfg, self.sock = cfg, sock
        self.process: subprocess.Popen[bytes] | None = None
        self.log = cfg.with_suffix(".log")

    def start(self) -> HAProxy:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.cfg)], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=Path(self.sock).parent,  # where e.sock would go
            )  # fmt: skip
        process = self.process

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {log_tail(self.log)}")
            try:
                return f"Pid: {process.pid}" in runtime(self.sock, "show info")
            except OSError:
                return False

        wait_until(answers, 20, what="HAProxy's admin socket")
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, grace=5)
            self.process = None

    def weight(self, backend: str, server: str) -> int:
        text = runtime(self.sock, f"show stat {backend} 4 -1")
        rows = csv.DictReader(text.lstrip("# ").splitlines())
        return next(int(r["weight"]) for r in rows if r["svname"] == server)


@pytest.fixture
def haproxies() -> Iterator[list[HAProxy]]:
    started: list[HAProxy] = []
    yield started
    for h in started:
        h.stop()


def rendered(workdir: Path, haproxies: list[HAProxy], fleet: Fleet | None = None) -> HAProxy:
    fleet = fleet or fleet_in(workdir)
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(render(fleet, fleet.dataplanes[0]))
    check = haproxy_check(cfg)
    assert check.returncode == 0, check.stderr
    h = HAProxy(cfg, workdir / "admin.sock")
    haproxies.append(h)
    return h.start()


def plane_of(fleet: Fleet, workdir: Path) -> tuple[HAProxyPlane, GatewayStore]:
    store = GatewayStore(workdir / "gateway.sqlite")
    return HAProxyPlane(fleet.dataplanes[0], fleet, store), store


# -- names from outside ------------------------------------------------------------------


# A name that, written raw, would end its line and open an admin socket to anyone (no
# slash: it is also a file name below).
HOSTILE = "x'\"\\ {}$HOME #\n    stats socket e.sock mode 666 level admin\r\u2028"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: a unix socket's path has at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="hap", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_hostile_names_given_to_the_renderer_add_no_line_and_route_exactly(
    tmp_path, short_dir, haproxies
):
    """fleet.toml refuses such names (tests/test_config.py); a renderer called with them
    anyway writes a file HAProxy accepts, with as many lines as for plain names, one stats
    socket, and the hostile model name matched exactly, not expanded or cut."""
    name = HOSTILE
    fleet = fleet_in(tmp_path)
    plain = render(fleet, fleet.dataplanes[0])
    plane = fleet.dataplanes[0].model_copy(
        update={"name": name.replace("$", ""), "listen": fleet.dataplanes[0].listen,
                "admin_socket": f"{short_dir}/{name.replace('$', '')}"}
    )  # fmt: skip
    m = fleet.models[0]
    deps = [d.model_copy(update={"id": name + d.id}) for d in m.deployments]
    models = [
        m.model_copy(update={"name": name, "deployments": deps, "dataplane": plane.name}),
        fleet.models[1].model_copy(update={"dataplane": plane.name}),
    ]
    bad = fleet.model_copy(
        update={"dataplanes": [plane], "models": models,
                "fleet": fleet.fleet.model_copy(update={"name": name})}
    )  # fmt: skip
    text = render(bad, plane)
    assert text.count("\n") == plain.count("\n")
    assert "\r" not in text and "\u2028" not in text
    # Read as HAProxy reads it: one stats socket, at level admin with mode 600.
    sockets = [
        w for w in (split_line(x).words for x in text.split("\n")) if w[:2] == ["stats", "socket"]
    ]
    assert len(sockets) == 1 and sockets[0][2] == plane.admin_socket, sockets
    assert sockets[0][3:] == ["mode", "600", "level", "admin", "user", USER, "group", GROUP]
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    check = haproxy_check(cfg)
    assert check.returncode == 0, check.stderr
    h = HAProxy(cfg, plane.admin_socket or "")
    haproxies.append(h)
    h.start()  # its socket is at the hostile path, exactly
    assert os.listdir(short_dir) == [Path(plane.admin_socket or "").name]  # no e.sock
    front = f"http://{plane.listen}/v1/completions"
    # The hostile model reaches its backend (no engine there: 503), another name does not.
    assert httpx.post(front, json={"model": name, "prompt": "x"}, timeout=10).status_code == 503
    assert httpx.post(front, json={"model": "x", "prompt": "x"}, timeout=10).status_code == 404
    assert httpx.post(front, json={"model": "x'", "prompt": "x"}, timeout=10).status_code == 404


def test_real_model_names_render_and_route(tmp_path, haproxies):
    fleet = fleet_in(tmp_path)
    rendered(tmp_path, haproxies, fleet)
    front = f"http://{fleet.dataplanes[0].listen}/v1/completions"
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-70b"):
        assert httpx.post(front, json={"model": name}, timeout=10).status_code == 503, name


# -- the stats socket's owner ------------------------------------------------------------


def test_the_stats_socket_names_the_gateways_user_by_default(tmp_path):
    fleet = fleet_in(tmp_path, owner={})
    (line,) = [x for x in render(fleet, fleet.dataplanes[0]).splitlines() if "stats socket" in x]
    assert line.endswith("mode 600 level admin user 'engineroom' group 'engineroom'"), line


@pytest.mark.skipif(os.geteuid() != 0, reason="HAProxy started as root is the case")
def test_an_haproxy_started_as_root_leaves_the_socket_to_the_socket_user(short_dir, haproxies):
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    short_dir.chmod(0o755)  # nobody may reach the socket
    fleet = fleet_in(short_dir, owner={"socket_user": "nobody", "socket_group": group})
    rendered(short_dir, haproxies, fleet)
    found = os.stat(short_dir / "admin.sock")
    assert (found.st_uid, found.st_gid, found.st_mode & 0o777) == (
        nobody.pw_uid, nobody.pw_gid, 0o600
    )  # fmt: skip
    # ... so that user, the gateway's, can open it (root could open any).
    probe = subprocess.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         "/usr/bin/python3", "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); "
         "s.connect(sys.argv[1]); s.sendall(b'show info\\n'); print(s.recv(9))",
         str(short_dir / "admin.sock")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert probe.returncode == 0 and "Name:" in probe.stdout, probe.stderr


# -- the write-back ----------------------------------------------------------------------

ADOPTED = """\
global
    stats socket {sock} mode 600 level admin
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
backend be_llama  # ours
    server a 127.0.0.1:{closed} weight 100 # the H200
    server b 127.0.0.1:{closed} check # weight 100 was the old one; "quoted" # twice
"""


def adopted_fleet(sock: str, link: Path, closed: int) -> Fleet:
    """Model llama behind HAProxy "edge", whose configuration (at `link`) names backend
    be_llama and its servers a and b: the fleet adopts them."""
    edge = {"name": "edge", "kind": "haproxy", "admin_socket": sock, "config": link}
    return parse_fleet(fleet_toml(
        fleet={"name": "adopted"},
        nodes=[{"name": "n", "agent": "http://127.0.0.1:9"}],
        dataplanes=[edge],
        models=[fleet_model(
            "llama",
            deployment("llama-a", "n", "vllm", closed, server="a"),
            deployment("llama-b", "n", "vllm", closed, server="b"),
            dataplane="edge", backend="be_llama",
        )],
    ))  # fmt: skip


def adopted(tmp_path: Path, haproxies: list[HAProxy]) -> tuple[Fleet, Path, Path, HAProxy]:
    """An adopted configuration reached through a symbolic link (into a repository of
    configurations, as is common), HAProxy running on it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    target, link, sock, closed = repo / "haproxy.cfg", tmp_path / "haproxy.cfg", "", free_port()
    sock = str(tmp_path / "admin.sock")
    target.write_text(ADOPTED.format(sock=sock, closed=closed))
    target.chmod(0o640)
    link.symlink_to(target)
    fleet = adopted_fleet(sock, link, closed)
    h = HAProxy(link, sock)
    haproxies.append(h)
    return fleet, link, target, h.start()


def test_the_write_back_keeps_a_symlink_and_the_comments(tmp_path, haproxies):
    fleet, link, target, h = adopted(tmp_path, haproxies)
    plane, _ = plane_of(fleet, tmp_path)
    asyncio.run(plane.set_weights("llama", {"llama-a": 10, "llama-b": 90}, "ops", "test"))
    assert link.is_symlink() and link.resolve() == target  # still a link, to the same file
    assert target.stat().st_mode & 0o777 == 0o640
    lines = target.read_text().splitlines()
    assert lines[8].endswith(" weight 10 # the H200"), lines[8]
    # The comment's "weight 100" is the comment's: the server itself gets its weight.
    assert lines[9].endswith(' check weight 90 # weight 100 was the old one; "quoted" # twice'), (
        lines[9]
    )
    assert haproxy_check(target).returncode == 0
    # A restarted HAProxy routes by the file as the running one did.
    h.stop()
    h.start()
    assert (h.weight("be_llama", "a"), h.weight("be_llama", "b")) == (10, 90)


def test_a_failed_write_back_is_said_and_audited_after_the_live_change(tmp_path, haproxies):
    fleet, link, target, h = adopted(tmp_path, haproxies)
    plane, store = plane_of(fleet, tmp_path)
    target.unlink()  # the file went away behind the running HAProxy
    with pytest.raises(DataPlaneError) as caught:
        asyncio.run(plane.set_weights("llama", {"llama-b": 100, "llama-a": 0}, "ops", "move"))
    message = str(caught.value)
    assert message.startswith("HAProxy routes llama as asked (") and "audited" in message
    assert f"back to {link} failed" in message and "A restarted HAProxy" in message
    assert (h.weight("be_llama", "a"), h.weight("be_llama", "b")) == (0, 100)  # live
    actions = [(r["action"], r["who"]) for r in reversed(store.audit_log())]
    assert actions == [("routes set", "ops"), ("routes set: not written back", "ops")]
    live, failed = reversed(store.audit_log())
    assert live["params"]["weights"] == {"llama-b": 100, "llama-a": 0}
    assert live["result"] == {"before": {"llama-a": 100, "llama-b": 1}}  # 1: HAProxy's default
    assert failed["result"]["config"] == str(link)


def test_a_change_haproxy_refuses_half_way_is_audited_with_what_it_left(tmp_path, haproxies):
    fleet, *_ = adopted(tmp_path, haproxies)
    plane, store = plane_of(fleet, tmp_path)
    # The raise comes first (b), then the lowering of a: a weight HAProxy refuses there.
    with pytest.raises(DataPlaneError, match=r"HAProxy refused .*; HAProxy routes llama now: "):
        asyncio.run(plane.set_weights("llama", {"llama-b": 50, "llama-a": 999}, "ops", "odd"))
    failed = store.audit_log()[0]
    assert failed["action"] == "routes set: failed"
    assert failed["result"]["now"] == {"llama-a": 100, "llama-b": 50}


# -- HAProxy's identity belongs to the job -----------------------------------------------


def test_readers_and_another_models_job_do_not_hide_a_restart_from_a_job(tmp_path, haproxies):
    """What the plan screen (a viewer may ask for it) and another model's job read must not
    reset what a running job checks against: its window would subtract the counters of two
    HAProxy processes and pass across a restart. (tests/test_dataplane_haproxy.py runs the
    same story through the gateway's plan route, with engines.)"""
    fleet = fleet_in(tmp_path)
    h = rendered(tmp_path, haproxies, fleet)
    plane, _ = plane_of(fleet, tmp_path)
    model, other = fleet.models[0].name, fleet.models[1].name

    async def window_across_a_restart() -> str:
        await plane.begin(model)
        await plane.set_weights(model, {"a": 90, "b": 10}, "ops", "shift 10%")
        since = await plane.snapshot(model, "b")
        h.stop()
        h.start()
        await plane.backends(model)  # the plan screen
        await plane.begin(other)  # another model's job on the same HAProxy
        await plane.weights(other)
        with pytest.raises(DataPlaneError) as caught:
            await plane.figures(model, "b", since)
        return str(caught.value)

    error = asyncio.run(window_across_a_restart())
    assert error.startswith("HAProxy restarted (pid "), error
    # A new job on the new process goes through: a restart between jobs fails neither.
    asyncio.run(plane.begin(model))
    asyncio.run(plane.set_weights(model, {"a": 100, "b": 0}, "ops", "back"))
