"""HAProxy's configuration for engineroom's models: rendered from fleet.toml, or adopted,
and kept in step with the runtime API's changes.

Rendered (`engineroom haproxy render`): one front end that reads the JSON body's `model`
(`option http-buffer-request`, `json_query('$.model')`) and picks the model's backend; one
backend per model, one server per deployment with its weight, active health checks, a
connection failure marking the server down at once (`observe layer4`) and the request
retried on another server; the server side of each connection closed after its answer,
so no request meets an engine closing an idle one. A model with `auto_failover` also gets
each deployment as a `backup` server, used only when no weighted server is up: HAProxy's
own stand-in for the gateway's "any healthy one" until the automatic failover moves the
weights. The stats socket is opened at level admin for the runtime API, owned by the
gateway's user (`socket_user`, `socket_group`; an HAProxy started as root would otherwise
leave it root's, and the gateway could not open it).

Names from fleet.toml are outside text: HAProxy names (backends, servers, the front end)
keep only the characters HAProxy allows in an identifier, and values (paths, the front
end's address, model names) are written in strong quotes with anything else as `\\xNN`,
so no value can end a line or add a directive.

Adopted: an existing file whose backends and servers fleet.toml names (`[[models]]
backend`, `[[models.deployments]] server`); engineroom edits only those servers' weights.

Write-back: after every change through the runtime API the `weight` of each server line
changed is rewritten in the file (console.core.atomicfile: a symbolic link's target, a
temporary file, fsync, rename), so a restarted HAProxy routes as the running one did.
Nothing else in the file is touched, comments included.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from console.core.atomicfile import replace_text
from console.core.config.load import ConfigError, DataPlaneSection, Deployment, Fleet, Model
from console.core.config.names import HAPROXY_CHARS

NAME_OK = re.compile(f"[^{HAPROXY_CHARS}]")  # what HAProxy refuses in an identifier
# Inside strong quotes HAProxy takes every byte as it is, but a line ends at a newline,
# so control characters and the quote itself go outside, as \xNN.
QUOTABLE = re.compile(r"[^\x00-\x1f\x7f\x80-\x9f'\u2028\u2029]+")
BACKUP_SUFFIX = ".backup"
# Active checks, and a refused connection marks the server down at once (then retried).
SERVER_OPTS = " check inter 500ms fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down"
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # a configuration larger than this is refused, not read


def ident(name: str) -> str:
    """`name` as an HAProxy identifier: the characters it refuses become `_`."""
    return NAME_OK.sub("_", name) or "_"


def backend_name(model: Model) -> str:
    return ident(model.backend or "be_" + model.name)


def server_name(dep: Deployment) -> str:
    return ident(dep.server or dep.id)


def quote(value: str) -> str:
    """`value` as one HAProxy word, exactly: strong quotes, with control characters and
    `'` as \\xNN outside them (HAProxy joins the pieces). A NUL cannot be one."""
    if "\x00" in value:
        raise ConfigError(f"{value!r}: a NUL byte cannot be written into HAProxy's configuration")
    out, at = [], 0
    for run in QUOTABLE.finditer(value):
        out += [_hex(value[at : run.start()]), f"'{run.group()}'"]
        at = run.end()
    out.append(_hex(value[at:]))
    return "".join(out) or "''"


def address(value: str, what: str) -> str:
    """An address or socket path as one HAProxy word. HAProxy expands `$VAR` in addresses
    whatever the quoting, so a `$` is refused: `what` says which value it was."""
    if "$" in value:
        raise ConfigError(f"{what}: {value!r}: HAProxy would expand the '$' in it; not rendered")
    return quote(value)


def _hex(text: str) -> str:
    return "".join(f"\\x{b:02x}" for b in text.encode())


def models_of(fleet: Fleet, plane: DataPlaneSection) -> list[Model]:
    return [m for m in fleet.models if m.dataplane == plane.name]


def render(fleet: Fleet, plane: DataPlaneSection) -> str:
    """The whole configuration for the models that name `plane`. ConfigError says what in
    fleet.toml cannot be rendered."""
    if plane.admin_socket is None or plane.listen is None:
        raise ConfigError(
            f"{fleet.source}: dataplanes {plane.name!r}: rendering needs 'admin_socket' and "
            "'listen' (HOST:PORT of the front end)"
        )
    models = models_of(fleet, plane)
    if not models:
        raise ConfigError(f"{fleet.source}: no [[models]] names dataplane = {plane.name!r}")
    _distinct(fleet, models)
    where = f"{fleet.source}: dataplanes {plane.name!r}"
    timeout = f"{plane.timeout_s:g}s"
    owner = f"user {quote(plane.socket_user)} group {quote(plane.socket_group)}"
    out = [
        f"# HAProxy for fleet {fleet.fleet.name!r}, data plane {plane.name!r}: rendered by",
        "# `engineroom haproxy render`. The failover jobs change weights through the stats",
        "# socket and write them back into the server lines below.",
        "global",
        # Owned by the gateway's user: an HAProxy started as root would leave it root's.
        f"    stats socket {address(plane.admin_socket, f'{where}: admin_socket')} mode 600 "
        f"level admin {owner}",
        "    stats timeout 30s",
        "    maxconn 4096",
        "",
        "defaults",
        "    mode http",
        f"    timeout connect {timeout}",
        # A busy engine answers /health late (vLLM on a loaded host: over 0.5 s, seen in
        # this repository's CI); without this the check's deadline is `inter` and two late
        # answers take a serving engine down. A refused connection still does at once.
        f"    timeout check {timeout}",
        "    timeout client 600s",
        "    timeout server 600s",
        "    timeout http-request 30s",
        "    timeout queue 30s",
        "    retries 3",
        "    retry-on conn-failure empty-response",
        "    option redispatch 1",
        "    # The engines close kept-alive connections left idle (uvicorn: after 5 s). A",
        "    # request sent on one as it closes fails (eresp) and marks the server down",
        "    # (observe layer4): closing the server side after each answer leaves none idle.",
        "    option http-server-close",
        "",
        f"frontend {ident(plane.name)}",
        f"    bind {address(plane.listen, f'{where}: listen')}",
        "    option http-buffer-request",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
    ]
    names = " ".join(quote(m.name) for m in models)
    out += [
        f"    acl known_model var(txn.model) -m str {names}",
        "    http-request return status 404 content-type application/json string "
        '"{\\"error\\":{\\"message\\":\\"no such model (routed by the JSON body\'s model)\\",'
        '\\"type\\":\\"not_found\\"}}" if !known_model',
    ]
    for model in models:
        out.append(
            f"    use_backend {backend_name(model)} if {{ var(txn.model) -m str "
            f"{quote(model.name)} }}"
        )
    for model in models:
        out += ["", f"backend {backend_name(model)}", "    balance roundrobin"]
        out += _health(model)
        for dep in model.deployments:
            at = _address(fleet, dep)
            out.append(f"    server {server_name(dep)} {at} weight {dep.weight}{SERVER_OPTS}")
        if model.auto_failover:
            for dep in model.deployments:
                out.append(
                    f"    server {server_name(dep)}{BACKUP_SUFFIX} {_address(fleet, dep)} "
                    f"backup{SERVER_OPTS}"
                )
    return "\n".join(out) + "\n"


def _distinct(fleet: Fleet, models: list[Model]) -> None:
    """Two names that become one HAProxy name (`a/b` and `a_b`) would make a file HAProxy
    refuses: say which, and how to part them."""
    backends: dict[str, str] = {}
    for model in models:
        other = backends.setdefault(backend_name(model), model.name)
        if other != model.name:
            raise ConfigError(
                f"{fleet.source}: models {other!r} and {model.name!r} are both HAProxy backend "
                f"{backend_name(model)!r}: name one with [[models]] backend"
            )
        servers: dict[str, str] = {}
        for dep in model.deployments:
            other = servers.setdefault(server_name(dep), dep.id)
            if other != dep.id:
                raise ConfigError(
                    f"{fleet.source}: deployments {other!r} and {dep.id!r} are both server "
                    f"{server_name(dep)!r} of {backend_name(model)!r}: name one with "
                    "[[models.deployments]] server"
                )


def _health(model: Model) -> list[str]:
    # One path per backend: the engines of a model are of one kind in a rendered backend.
    kinds = {d.engine for d in model.deployments}
    path = "/v2/health/ready" if kinds == {"triton"} else "/health"
    return [f"    option httpchk GET {path}", "    http-check expect status 200"]


def _address(fleet: Fleet, dep: Deployment) -> str:
    parts = urlsplit(dep.endpoint)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ConfigError(
            f"{fleet.source}: deployment {dep.id!r}: endpoint {dep.endpoint!r}: rendering "
            "takes http://HOST:PORT (for TLS to engines, adopt a configuration of your own)"
        )
    return f"{parts.hostname}:{parts.port}"


def read_config(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: over {MAX_CONFIG_BYTES} bytes; not read")
    return data.decode("utf-8")


@dataclass(slots=True)
class Line:
    """One line of a configuration as HAProxy reads it."""

    words: list[str]  # quotes and escapes undone
    spans: list[tuple[int, int]]  # where each word is in the line
    comment: int  # where its comment begins: a `#` outside quotes, not escaped; or the end


ESCAPES = {"r": b"\r", "n": b"\n", "t": b"\t"}


def split_line(line: str) -> Line:
    out = Line([], [], len(line))
    word, start, quote_char, i = bytearray(), -1, "", 0  # start -1: between words
    while i < len(line):
        c = line[i]
        if c == "\\" and quote_char != "'" and i + 1 < len(line):  # \xNN, \n, \#, ...
            start = i if start < 0 else start
            i += 1
            hexa = line[i + 1 : i + 3]
            if line[i] == "x" and len(hexa) == 2 and all(h in string.hexdigits for h in hexa):
                word += bytes([int(hexa, 16)])
                i += 2
            else:
                word += ESCAPES.get(line[i], line[i].encode())
        elif quote_char:
            if c == quote_char:
                quote_char = ""
            else:
                word += c.encode()
        elif c == "#" or c.isspace():
            if start >= 0:
                out.words.append(word.decode("utf-8", "replace"))
                out.spans.append((start, i))
            word, start = bytearray(), -1
            if c == "#":
                out.comment = i
                return out
        else:
            start = i if start < 0 else start
            if c in "'\"":
                quote_char = c
            else:
                word += c.encode()
        i += 1
    if start >= 0:
        out.words.append(word.decode("utf-8", "replace"))
        out.spans.append((start, i))
    return out


def _lines(text: str) -> list[str]:
    """The lines as HAProxy splits them (at newlines only), each with its newline."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _sections(lines: list[str]) -> list[tuple[str | None, Line]]:
    """Each line, and the backend (or listen section) it is in."""
    out: list[tuple[str | None, Line]] = []
    section: str | None = None
    for text in lines:
        line = split_line(text.rstrip("\r\n"))
        first = line.words[0] if line.words else None
        if first in ("backend", "listen") and len(line.words) > 1:
            section = line.words[1]
        elif first in SECTIONS:
            section = None
        out.append((section, line))
    return out


SECTIONS = ("frontend", "global", "defaults", "peers", "resolvers", "userlist", "program",
            "http-errors", "ring", "mailers", "cache")  # fmt: skip


def servers_in(text: str) -> dict[str, set[str]]:
    """Backend name -> its server names, as the file declares them (for adopting)."""
    found: dict[str, set[str]] = {}
    for section, line in _sections(_lines(text)):
        if section is None:
            continue
        found.setdefault(section, set())
        if line.words[:1] == ["server"] and len(line.words) > 1:
            found[section].add(line.words[1])
    return found


def with_weights(text: str, weights: dict[tuple[str, str], int]) -> str:
    """`text` with the weight of each (backend, server) named set (added where missing).
    Only the server line's own words are read and changed (`server NAME ADDRESS [options]`):
    its comment stays as it was."""
    lines = _lines(text)
    for i, (section, line) in enumerate(_sections(lines)):
        words = line.words
        if section is None or words[:1] != ["server"] or len(words) < 3:
            continue
        weight = weights.get((section, words[1]))
        if weight is None:
            continue
        old = lines[i]
        found = [j for j in range(3, len(words) - 1) if words[j] == "weight"]
        if found:
            start, end = line.spans[found[0] + 1]
            lines[i] = f"{old[:start]}{weight}{old[end:]}"
        else:
            end = line.spans[-1][1]
            lines[i] = f"{old[:end]} weight {weight}{old[end:]}"
    return "".join(lines)


def plane_named(fleet: Fleet, name: str | None) -> DataPlaneSection:
    planes = [p for p in fleet.dataplanes if p.kind == "haproxy"]
    chosen = [p for p in planes if name is None or p.name == name]
    if len(chosen) != 1:
        have = ", ".join(p.name for p in planes) or "none"
        want = f"no HAProxy data plane {name!r}" if name else "name one with --dataplane"
        raise ConfigError(f"{fleet.source}: {want} (HAProxy data planes: {have})")
    return chosen[0]


def adopt_problems(fleet: Fleet, plane: DataPlaneSection, text: str) -> list[str]:
    """What an existing configuration lacks for the models that name `plane`."""
    declared = servers_in(text)
    problems = []
    for model in models_of(fleet, plane):
        backend = backend_name(model)
        if backend not in declared:
            problems.append(f"model {model.name}: no backend {backend!r}")
            continue
        for dep in model.deployments:
            if server_name(dep) not in declared[backend]:
                problems.append(
                    f"deployment {dep.id}: backend {backend!r} has no server {server_name(dep)!r}"
                )
    return problems


def run_cli(fleet: Fleet, verb: str, name: str | None, out: str | None) -> int:
    """`engineroom haproxy render|adopt`: 0 done, 1 the configuration lacks names."""
    plane = plane_named(fleet, name)
    where = out or plane.config
    if where is None:
        raise ConfigError(f"{fleet.source}: dataplanes {plane.name!r}: no 'config'; give --out")
    path = Path(where).expanduser()
    if verb == "render":
        replace_text(path, render(fleet, plane))
        print(
            f"wrote {path}: check it with `haproxy -c -f {path}`, run it with `haproxy -f {path}`"
        )
        return 0
    try:
        text = read_config(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    problems = adopt_problems(fleet, plane, text)
    for problem in problems:
        print(f"{path}: {problem}")
    if not problems:
        print(f"{path}: every model of data plane {plane.name!r} has its backend and servers")
    return 1 if problems else 0
