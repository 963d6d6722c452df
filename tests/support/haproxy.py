"""HAProxy as the tests talk to it."""

from __future__ import annotations

import grp
import os
import pwd
import socket
from pathlib import Path


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
