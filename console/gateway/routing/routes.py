"""The route table's record (console.gateway.routing.routetable is the live table): a weight per
deployment of each model, persisted and audited.

The weights start as fleet.toml's; every change (an operator's PUT, a failover step, an
automatic failover) is written to SQLite before it takes effect, with who, what, when and
why, so a restarted gateway routes exactly as the old one did. `save_to_fleet` writes
the current weights back into fleet.toml as the new defaults, keeping its comments and
layout (tomlkit), replacing the file atomically and durably, and never over an edit made
since the gateway loaded it.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import tomlkit

from console.core.atomicfile import replace_text
from console.core.config.load import ConfigError, Fleet, parse_fleet
from console.core.sqlitestore import JobStore

ROUTES = """
CREATE TABLE IF NOT EXISTS routes (
    model TEXT NOT NULL,
    deployment TEXT NOT NULL,
    weight INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (model, deployment)
);
"""


class GatewayStore(JobStore):
    """Failover jobs and the audit log (the store the agent keeps too) plus the route table."""

    schema = ROUTES

    def weights(self) -> dict[str, dict[str, int]]:
        with self._lock:
            rows = self._db.execute("SELECT model, deployment, weight FROM routes").fetchall()
        out: dict[str, dict[str, int]] = {}
        for model, deployment, weight in rows:
            out.setdefault(model, {})[deployment] = weight
        return out

    def set_weights(
        self, model: str, weights: dict[str, int], who: str, why: str, before: dict[str, int]
    ) -> None:
        """One transaction for the table, then the audit record."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for deployment, weight in weights.items():
                    self._db.execute(
                        "INSERT INTO routes VALUES (?,?,?,?) ON CONFLICT(model, deployment) "
                        "DO UPDATE SET weight = excluded.weight, updated = excluded.updated",
                        (model, deployment, weight, now),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        self.audit(
            who, "routes set", {"model": model, "weights": weights, "why": why}, {"before": before}
        )


class FleetFileChanged(Exception):
    """fleet.toml on disk is not the file the gateway loaded: someone edited it since.
    Nothing was written; str() says what to do."""


class FleetFileUnwritable(Exception):
    """fleet.toml could not be read or replaced (its folder is not the gateway's to write,
    a full disk ...). The file is as it was; str() says what failed and what to do."""


def save_to_fleet(fleet: Fleet, weights: dict[str, dict[str, int]]) -> list[str]:
    """Write `weights` into fleet.toml's deployments; returns what changed ("model/id a->b").

    Comments and formatting stay (tomlkit). The file is written where it really lives (a
    symlinked fleet.toml keeps its link and its target gets the new text), replaced whole
    (console.core.atomicfile: the mode kept, the owner only when root saves, since fchown
    is a call the gateway's unit denies). A file whose settings changed since the
    gateway loaded it is refused (FleetFileChanged), so a hand edit is never overwritten;
    one that cannot be read or replaced is refused with why (FleetFileUnwritable)."""
    path = Path(os.path.realpath(fleet.source))
    try:
        before = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetFileUnwritable(_unwritable_message(path, exc)) from None
    _check_unchanged(fleet, path, text)
    doc = tomlkit.parse(text)
    changed = []
    for model in doc.get("models", []):
        for dep in model.get("deployments", []):
            new = weights.get(str(model["name"]), {}).get(str(dep["id"]))
            if new is not None and dep.get("weight", 100) != new:
                changed.append(f"{model['name']}/{dep['id']} {dep.get('weight', 100)}->{new}")
                dep["weight"] = new
    if not changed:
        return changed
    new_text = tomlkit.dumps(doc)

    def unchanged(_: os.stat_result | None) -> None:
        # The last moment to notice a writer that came in while we read and wrote.
        now = path.stat()
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        ):
            raise FleetFileChanged(_changed_message(path, "while the routes were being saved"))

    try:
        replace_text(path, new_text, unchanged)
    except OSError as exc:
        raise FleetFileUnwritable(_unwritable_message(path, exc)) from None
    _written[path] = _digest(new_text)
    return changed


def _unwritable_message(path: Path, exc: OSError) -> str:
    what = exc.strerror or exc.__class__.__name__
    where = f" ({exc.filename})" if exc.filename else ""
    return (
        f"{path}: the routes were not written back: {what}{where}; the file is as it was. "
        f"The gateway's user (uid {os.geteuid()}) must be able to write {path.parent}, where "
        "the file is replaced by a new one (deploy/README.md)"
    )


# What this process last wrote to each fleet file: a later save may overwrite its own write
# (the gateway's fleet still holds the weights it was loaded with).
_written: dict[Path, str] = {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_unchanged(fleet: Fleet, path: Path, text: str) -> None:
    """The file on disk says what `fleet` says (comments may differ: they are kept), or is
    exactly what this process last wrote to it."""
    if _written.get(path) == _digest(text):
        return
    try:
        on_disk = parse_fleet(text, fleet.source)
    except ConfigError as exc:
        raise FleetFileChanged(_changed_message(path, f"and does not load now ({exc})")) from None
    if on_disk.model_dump() != fleet.model_dump():
        raise FleetFileChanged(_changed_message(path, "(its settings differ)"))


def _changed_message(path: Path, detail: str) -> str:
    return (
        f"{path}: changed on disk since the gateway loaded it {detail}; nothing was written. "
        "Check the edit, reload the gateway (SIGHUP) so it routes by the file, then save again"
    )
