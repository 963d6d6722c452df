"""Sockets, node names and fleet.toml text for the SIMULATED fleets (demo and scale)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TOKEN_ENV = "ENGINEROOM_DEMO_TOKEN"  # the agents' operator token and the gateway's admin token
# The agents' and the gateway's viewer token: what the web view (`serve --web`) reads with.
VIEWER_TOKEN_ENV = "ENGINEROOM_DEMO_VIEWER_TOKEN"


def viewer_token_for(token: str) -> str:
    """The demo's viewer token, derived from its operator token: every process that has the
    one knows the other, and the web view reads with the viewer token only."""
    return hmac.new(token.encode(), b"engineroom demo viewer", hashlib.sha256).hexdigest()[:32]


def listen_socket(preferred: int | None = None) -> socket.socket:
    """A TCP socket bound to 127.0.0.1, on `preferred` when that port is free, else any.

    Preferred ports keep engine ids ("vllm-18001") and screenshots the same run after run;
    a port some other program holds just means a different one.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for port in (preferred, 0) if preferred else (0,):
        try:
            sock.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    # Listen at once: with SO_REUSEADDR, Linux lets two sockets bind one port as long as
    # neither listens, so a second fleet starting at the same moment must see this one.
    sock.listen(128)
    sock.setblocking(False)
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def rack(n: int) -> str:
    """0 -> "a", 25 -> "z", 26 -> "aa": rack letters for node names."""
    letters = ""
    n += 1
    while n:
        n, rest = divmod(n - 1, 26)
        letters = string.ascii_lowercase[rest] + letters
    return letters


def node_name(index: int, per_rack: int) -> str:
    """gpu-a1, gpu-a2, gpu-b1, ... (two-digit slots once a rack holds ten or more)."""
    width = 2 if per_rack >= 10 else 1
    return f"gpu-{rack(index // per_rack)}{index % per_rack + 1:0{width}d}"


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string reads JSON's escapes


def table(header: str, values: dict[str, object], indent: str = "") -> list[str]:
    lines = [f"{indent}{header}"]
    lines += [f"{indent}{key} = {_value(v)}" for key, v in values.items() if v is not None]
    return [*lines, ""]


@dataclass
class FleetText:
    """A fleet.toml under construction: a comment header, then tables in order."""

    comment: str
    lines: list[str] = field(default_factory=list)

    def add(self, header: str, values: dict[str, object], indent: str = "") -> None:
        self.lines += table(header, values, indent)

    def text(self) -> str:
        head = [f"# {line}".rstrip() for line in self.comment.strip().splitlines()]
        return "\n".join([*head, "", *self.lines])


def model_tables(
    out: FleetText, models: Iterable[tuple[str, Mapping[str, object], list[dict[str, object]]]]
) -> None:
    """[[models]] (a name, then the model's other keys: its SLO, ...) and their
    [[models.deployments]]."""
    for name, values, deployments in models:
        out.add("[[models]]", {"name": name, **values})
        for deployment in deployments:
            out.add("[[models.deployments]]", deployment, indent="  ")
