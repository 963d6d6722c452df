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
weights. The stats socket is opened at level admin for the runtime API.

Adopted: an existing file whose backends and servers fleet.toml names (`[[models]]
backend`, `[[models.deployments]] server`); engineroom edits only those servers' weights.

Write-back: after every change through the runtime API the `weight` of each server line
changed is rewritten in the file (atomically: a temporary file, fsync, rename), so a
restarted HAProxy routes as the running one did. Nothing else in the file is touched.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from console.core.config import ConfigError, DataPlaneSection, Deployment, Fleet, Model

NAME_OK = re.compile(r"[^A-Za-z0-9_.:-]")
BACKUP_SUFFIX = ".backup"
# Active checks, and a refused connection marks the server down at once (then retried).
SERVER_OPTS = " check inter 500ms fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down"
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # a configuration larger than this is refused, not read


def backend_name(model: Model) -> str:
    return model.backend or "be_" + NAME_OK.sub("_", model.name)


def server_name(dep: Deployment) -> str:
    return dep.server or NAME_OK.sub("_", dep.id)


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
    timeout = f"{plane.timeout_s:g}s"
    out = [
        f"# HAProxy for fleet {fleet.fleet.name!r}, data plane {plane.name!r}: rendered by",
        "# `engineroom haproxy render`. The failover jobs change weights through the stats",
        "# socket and write them back into the server lines below.",
        "global",
        f"    stats socket {plane.admin_socket} mode 600 level admin",
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
        f"frontend {NAME_OK.sub('_', plane.name)}",
        f"    bind {plane.listen}",
        "    option http-buffer-request",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
    ]
    names = " ".join(_quoted(fleet, m.name) for m in models)
    out += [
        f"    acl known_model var(txn.model) -m str {names}",
        "    http-request return status 404 content-type application/json string "
        '"{\\"error\\":{\\"message\\":\\"no such model (routed by the JSON body\'s model)\\",'
        '\\"type\\":\\"not_found\\"}}" if !known_model',
    ]
    for model in models:
        out.append(
            f"    use_backend {backend_name(model)} if {{ var(txn.model) -m str "
            f"{_quoted(fleet, model.name)} }}"
        )
    for model in models:
        out += ["", f"backend {backend_name(model)}", "    balance roundrobin"]
        out += _health(model)
        for dep in model.deployments:
            where = _address(fleet, dep)
            out.append(f"    server {server_name(dep)} {where} weight {dep.weight}{SERVER_OPTS}")
        if model.auto_failover:
            for dep in model.deployments:
                out.append(
                    f"    server {server_name(dep)}{BACKUP_SUFFIX} {_address(fleet, dep)} "
                    f"backup{SERVER_OPTS}"
                )
    return "\n".join(out) + "\n"


def _quoted(fleet: Fleet, name: str) -> str:
    if not name or re.search(r'["\\\s]', name):
        raise ConfigError(
            f"{fleet.source}: model {name!r}: rendering takes model names without quotes, "
            "backslashes or spaces"
        )
    return f'"{name}"'


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


def servers_in(text: str) -> dict[str, set[str]]:
    """Backend name -> its server names, as the file declares them (for adopting)."""
    found: dict[str, set[str]] = {}
    section: str | None = None
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] in ("backend", "listen") and len(words) > 1:
            section = words[1]
            found.setdefault(section, set())
        elif words[0] in ("frontend", "global", "defaults", "peers", "resolvers", "userlist"):
            section = None
        elif words[0] == "server" and section is not None and len(words) > 1:
            found[section].add(words[1])
    return found


def with_weights(text: str, weights: dict[tuple[str, str], int]) -> str:
    """`text` with the weight of each (backend, server) named set (added where missing)."""
    lines = text.splitlines(keepends=True)
    section: str | None = None
    for i, line in enumerate(lines):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] in ("backend", "listen") and len(words) > 1:
            section = words[1]
        elif words[0] in ("frontend", "global", "defaults"):
            section = None
        elif words[0] == "server" and len(words) > 1 and (section, words[1]) in weights:
            weight = weights[(section, words[1])]  # type: ignore[index]
            body, nl = (line[:-1], "\n") if line.endswith("\n") else (line, "")
            if re.search(r"\sweight\s+\d+", body):
                body = re.sub(r"(\sweight\s+)\d+", rf"\g<1>{weight}", body, count=1)
            else:
                head, sep, comment = body.partition("#")
                body = f"{head.rstrip()} weight {weight}" + (f" {sep}{comment}" if sep else "")
            lines[i] = body + nl
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: a crash leaves the old file or the new, never half."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
        write_atomically(path, render(fleet, plane))
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
