"""HAProxy as the tests talk to it: its admin socket, and a stack of a real HAProxy in
front of the data-plane tests' two vLLMs with a real gateway driving it."""

from __future__ import annotations

import contextlib
import csv
import grp
import os
import pwd
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, agent_env
from tests.engines.servers import free_port, log_tail, stop, wait_until
from tests.support.dataplanes import two_vllm_fleet
from tests.test_gateway import Gateway, start_gateway

# The stats socket belongs to whoever runs the tests (the gateway's user here).
OWNER = {
    "socket_user": pwd.getpwuid(os.getuid()).pw_name,
    "socket_group": grp.getgrgid(os.getgid()).gr_name,
}


def runtime(sock: Path | str, command: str) -> str:
    """One command on HAProxy's admin socket, as an operator would send it; the answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode()


def on_haproxy(text: str, workdir: Path, front: int) -> str:
    """`text` (a fleet file) with model tiny on HAProxy (data plane "edge"): its admin
    socket workdir/admin.sock, its configuration workdir/haproxy.cfg, its front end on
    `front`; the stats socket is this user's."""
    edge = f"""
[[dataplanes]]
name = "edge"
kind = "haproxy"
admin_socket = "{workdir / "admin.sock"}"
config = "{workdir / "haproxy.cfg"}"
listen = "127.0.0.1:{front}"
socket_user = "{pwd.getpwuid(os.getuid()).pw_name}"
socket_group = "{grp.getgrgid(os.getgid()).gr_name}"
"""
    return on_plane(text, edge)


def on_plane(text: str, edge: str) -> str:
    """`text` with model tiny on data plane "edge", declared by `edge`."""
    moved = text.replace(
        '[[models]]\nname = "tiny"\n', '[[models]]\nname = "tiny"\ndataplane = "edge"\n'
    )
    assert moved != text, "no model tiny in the fleet file"
    return moved.replace("[[models]]", edge + "\n[[models]]", 1)


def fleet_text(gw_port: int, front_port: int, sock: Path, cfg: Path, **settings: Any) -> str:
    """fleet.toml for "tiny" on data plane "edge" (HAProxy): `settings` as two_vllm_fleet's."""
    edge = {"name": "edge", "kind": "haproxy", "admin_socket": sock, "config": cfg,
            "listen": f"127.0.0.1:{front_port}", **OWNER}  # fmt: skip
    return two_vllm_fleet("hap", edge, gw_port=gw_port, drain_timeout_s=30, **settings)


@dataclass
class Stack:
    gateway: Gateway
    front: str  # HAProxy's front end, where the clients go
    cfg: Path
    sock: Path
    workdir: Path
    haproxy: subprocess.Popen[bytes] | None = None
    log: Path | None = None  # the running HAProxy's

    def alerts(self) -> int:
        """HAProxy's "backend has no server available": a weight lowered before another
        was raised leaves it with none for a moment, and HAProxy says so."""
        assert self.log is not None
        return self.log.read_text().count("has no server available")

    def start_haproxy(self, replacing: bool = False) -> None:
        """Start HAProxy on the configuration file; `replacing`: as a reload does, a new
        process that takes over from the running one (`-sf PID`), which then exits."""
        log = self.workdir / f"haproxy-{time.monotonic_ns()}.log"
        old = self.haproxy if replacing else None
        argv = ["haproxy", "-db", "-f", str(self.cfg)]
        if old is not None:
            argv += ["-sf", str(old.pid)]
        self.log = log
        with log.open("wb") as out:
            self.haproxy = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = self.haproxy
        if old is not None:
            wait_until(lambda: old.poll() is not None, 30, what="the old HAProxy gone")

        def servers_up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {log_tail(log)}")
            with contextlib.suppress(OSError):
                rows = self.stat()
                return all(rows[s]["status"] == "UP" for s in ("a", "b") if s in rows)
            return False

        wait_until(servers_up, 20, what="HAProxy and its servers up")

    def stop_haproxy(self) -> None:
        if self.haproxy is not None:
            stop(self.haproxy, grace=5)
            self.haproxy = None

    def stat(self) -> dict[str, dict[str, str]]:
        text = runtime(self.sock, "show stat be_tiny 4 -1")
        return {r["svname"]: r for r in csv.DictReader(text.lstrip("# ").splitlines())}

    def live_weights(self) -> dict[str, int]:
        rows = self.stat()
        return {
            s: 0 if rows[s]["status"].startswith("DRAIN") else int(rows[s]["weight"])
            for s in ("a", "b")
        }

    def file_weights(self) -> dict[str, int]:
        found = {}
        for line in self.cfg.read_text().splitlines():
            words = line.split()
            if words[:1] == ["server"] and words[1] in ("a", "b"):
                found[words[1]] = int(words[words.index("weight") + 1])
        return found

    def served(self) -> dict[str, int]:
        """Requests each server took, by HAProxy's count (stot)."""
        rows = self.stat()
        return {s: int(rows[s]["stot"]) for s in ("a", "b")}

    def failover(self, to: str, mode: str = "planned") -> dict:
        resp = self.gateway.admin(
            "POST", "/admin/failover", json={"model": "tiny", "to": to, "mode": mode}
        )
        assert resp.status_code == 202, resp.text
        return resp.json()

    def close(self) -> None:
        if self.gateway is not None:
            stop(self.gateway.process, grace=5)
        self.stop_haproxy()


def haproxy_stack(workdir: Path, a: str, b: str, **settings: Any) -> Stack:
    """HAProxy in front of `a` and `b`, its configuration rendered by `engineroom haproxy
    render`, and a gateway driving it (not in the traffic's path); `settings` as
    two_vllm_fleet's. The caller closes it."""
    gw_port, front_port = free_port(), free_port()
    sock, cfg = workdir / "admin.sock", workdir / "haproxy.cfg"
    text = fleet_text(gw_port, front_port, sock, cfg, state=workdir / "state", a=a, b=b,
                      **settings)  # fmt: skip
    (workdir / "fleet.toml").write_text(text)
    rendered = subprocess.run(
        [sys.executable, "-m", "console.cli", "haproxy", "render", "--fleet",
         str(workdir / "fleet.toml")],
        capture_output=True, text=True, cwd=ROOT, env=agent_env(), timeout=60,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, timeout=30)
    assert check.returncode == 0, check.stderr
    stack = Stack(None, f"http://127.0.0.1:{front_port}", cfg, sock, workdir)  # type: ignore[arg-type]
    try:
        stack.start_haproxy()
        stack.gateway = start_gateway(workdir, text, gw_port)
    except BaseException:
        stack.close()
        raise
    return stack
