"""The live route table: a weight per deployment of each model, persisted and audited.

The weights start as fleet.toml's; every change (an operator's PUT, a failover step, an
automatic failover) is written to SQLite before it takes effect, with who, what, when and
why, so a restarted gateway routes exactly as the old one did. `save_to_fleet` writes
the current weights back into fleet.toml as the new defaults, keeping its comments and
layout (tomlkit) and replacing the file atomically.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import tomlkit

from console.agent.store import Store
from console.core.config import Fleet

ROUTES = """
CREATE TABLE IF NOT EXISTS routes (
    model TEXT NOT NULL,
    deployment TEXT NOT NULL,
    weight INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (model, deployment)
);
"""


class GatewayStore(Store):
    """Jobs and audit (as the agent keeps them) plus the route table."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with self._lock:
            self._db.executescript(ROUTES)

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


def save_to_fleet(fleet: Fleet, weights: dict[str, dict[str, int]]) -> list[str]:
    """Write `weights` into fleet.toml's deployments; returns what changed ("model/id a->b").

    Comments and formatting stay (tomlkit); the new file replaces the old one atomically
    (a temporary file in the same directory, then rename)."""
    path = fleet.source
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    changed = []
    for model in doc.get("models", []):
        for dep in model.get("deployments", []):
            new = weights.get(str(model["name"]), {}).get(str(dep["id"]))
            if new is not None and dep.get("weight", 100) != new:
                changed.append(f"{model['name']}/{dep['id']} {dep.get('weight', 100)}->{new}")
                dep["weight"] = new
    text = tomlkit.dumps(doc)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return changed
