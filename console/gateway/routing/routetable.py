"""The route table: each model's deployments (upstreams), their live weights, and the pick
of a deployment for one request.

Weights start as fleet.toml's, overridden by those stored (console.gateway.routing.routes), so a
restarted gateway routes as the old one did; every change is stored before it takes
effect. A reloaded fleet.toml (SIGHUP) adds and removes deployments; in-flight requests
keep the upstream they hold.
"""

from __future__ import annotations

import random

from console.core.config.load import Fleet, Model
from console.gateway.routing.routes import GatewayStore
from console.gateway.routing.upstream import Upstream, build_upstreams


class RouteTable:
    def __init__(self, fleet: Fleet, store: GatewayStore) -> None:
        assert fleet.gateway is not None, "the fleet file has no [gateway] section"
        self.fleet = fleet
        self.window_s = fleet.gateway.window_s  # the measurement window of every upstream
        self.store = store
        self.models: dict[str, Model] = {m.name: m for m in fleet.models}
        self.upstreams: dict[str, list[Upstream]] = build_upstreams(fleet.models, self.window_s)
        stored = store.weights()
        self.weights: dict[str, dict[str, int]] = {
            name: {d.id: stored.get(name, {}).get(d.id, d.weight) for d in model.deployments}
            for name, model in self.models.items()
        }

    def all_upstreams(self) -> list[Upstream]:
        return [u for ups in self.upstreams.values() for u in ups]

    def upstream(self, model: str, deployment: str) -> Upstream | None:
        return next((u for u in self.upstreams.get(model, []) if u.id == deployment), None)

    def pick(self, model: str, exclude: list[str]) -> Upstream | None:
        """A deployment for one request: weighted among the healthy ones with weight;
        with auto_failover, any healthy one when those are all gone."""
        weights = self.weights.get(model, {})
        pool = [
            u
            for u in self.upstreams.get(model, [])
            if u.up and u.id not in exclude and weights.get(u.id, 0) > 0
        ]
        if pool:
            if len(pool) == 1:
                return pool[0]
            return random.choices(pool, [weights[u.id] for u in pool])[0]
        if self.models[model].auto_failover:
            spare = [u for u in self.upstreams.get(model, []) if u.up and u.id not in exclude]
            return spare[0] if spare else None
        return None

    def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        before = dict(self.weights[model])
        self.store.set_weights(model, weights, who, why, before)  # durable first
        self.weights[model] = {**before, **weights}

    def reload(self, fleet: Fleet) -> list[str]:
        """A new fleet.toml: deployments added or removed ("added m/id", "removed m/id").
        Weights in force stay; new deployments take the stored weight, else the file's."""
        changes = []
        old = self.upstreams
        fresh = build_upstreams(fleet.models, self.window_s)
        for name, ups in fresh.items():
            kept = {u.id: u for u in old.get(name, [])}
            merged = []
            for u in ups:
                if u.id in kept:
                    kept[u.id].dep = u.dep
                    merged.append(kept[u.id])
                else:
                    merged.append(u)
                    changes.append(f"added {name}/{u.id}")
            fresh[name] = merged
            for gone in set(kept) - {u.id for u in ups}:
                changes.append(f"removed {name}/{gone}")
        self.fleet = fleet
        self.models = {m.name: m for m in fleet.models}
        self.upstreams = fresh
        stored = self.store.weights()
        self.weights = {
            name: {
                d.id: self.weights.get(name, {}).get(d.id, stored.get(name, {}).get(d.id, d.weight))
                for d in model.deployments
            }
            for name, model in self.models.items()
        }
        self.store.audit("gateway", "fleet reloaded", {"changes": changes})
        return changes
