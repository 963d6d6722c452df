"""HAProxy as the tests talk to it."""

from __future__ import annotations

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
