"""What a change of a model's weights will do, worked out before anything moves: the
weights before and after for every deployment, the steps between, which deployments gain
traffic (they are verified) and which lose it (those left at 0 are drained).

Three moves, each a failover job (console.gateway.failover.job):

- **to X**: all of the model on X. When the model's last completed move took the traffic
  off X and nothing has changed since, this is a fail-back: the weights from before that
  move come back, so the other replicas get their weight back, not 0.
- **drain D**: D to 0, its weight spread over the other deployments that have weight and
  are up, in proportion to their weights; `onto` X: all of D's weight to X instead.
- **restore before job J**: the weights J found when it began (a deployment J did not know
  keeps its weight).

Pure functions over `{deployment: weight}`: no I/O, so the plan screen, the job and the
tests compute the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Weights = dict[str, int]


class FailoverRefused(Exception):
    """A move the gateway will not start: `status` is the HTTP status, str() says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Past:
    """A finished job of the model, as the store has it (newest first in a history)."""

    id: str
    state: str
    before: Weights | None
    after: Weights | None


@dataclass(frozen=True, slots=True)
class Move:
    op: str  # "failover", "drain" or "restore": the job's kind is "{op}.{mode}"
    before: Weights
    after: Weights
    summary: str  # one line: what moves where, and why these weights
    named: str | None = None  # the deployment the operator named to take the traffic

    @property
    def targets(self) -> list[str]:
        """The deployments whose share of the traffic rises, and the one named to take it:
        each is checked before the first step and verified after every step."""
        b, a = shares(self.before), shares(self.after)
        rising = [d for d in self.after if a.get(d, 0.0) > b.get(d, 0.0) + 1e-9]
        named = self.named if self.named is not None and self.after.get(self.named) else None
        return [named, *(d for d in rising if d != named)] if named else rising

    @property
    def sources(self) -> list[str]:
        """The deployments whose share falls."""
        b, a = shares(self.before), shares(self.after)
        return [d for d in self.before if b.get(d, 0.0) > a.get(d, 0.0) + 1e-9]

    @property
    def drained(self) -> list[str]:
        """The deployments that carried traffic and carry none after: the drain step waits
        until nothing is in flight on them."""
        return [d for d, w in self.before.items() if w > 0 and self.after.get(d, 0) == 0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "summary": self.summary,
            "weights_before": dict(self.before),
            "weights_after": dict(self.after),
            "targets": self.targets,
            "sources": self.sources,
        }


def shares(weights: Mapping[str, int]) -> dict[str, float]:
    """Each deployment's share of the traffic (0..1); all 0 when no weight is set."""
    total = sum(max(0, w) for w in weights.values())
    return {d: (max(0, w) / total if total else 0.0) for d, w in weights.items()}


def all_to(model: str, before: Weights, to: str) -> Move:
    after = {d: (100 if d == to else 0) for d in before}
    return Move("failover", dict(before), after, f"all of {model} to {to}", to)


def fail_back(model: str, before: Weights, to: str, history: Iterable[Past]) -> Move | None:
    """`to` X as a fail-back: the model's last completed move took the traffic off X (X had
    weight before it and none after), and the weights are still what it left. Then the
    weights from before it come back. None when that is not so."""
    last = next((p for p in history if p.state == "succeeded"), None)
    if last is None or last.before is None or last.after is None:
        return None
    if last.before.get(to, 0) <= 0 or last.after.get(to, 1) != 0:
        return None
    if any(before.get(d, 0) != w for d, w in last.after.items() if d in before):
        return None  # changed since: the weights from then are not what to go back to
    after = {d: last.before.get(d, w) for d, w in before.items()}
    return Move(
        "failover",
        dict(before),
        after,
        f"fail-back to {to}: the weights from before job {last.id}, the other "
        "deployments' included",
        to,
    )


def drain(
    model: str, before: Weights, deployment: str, onto: str | None, up: Iterable[str]
) -> Move:
    """`deployment` to 0; its weight to `onto`, or spread over the other deployments that
    have weight and are `up`, in proportion to their weights. FailoverRefused (409, 422)
    when there is nothing to drain or nowhere to put it (409: the model's state, which
    the body cannot say)."""
    weight = before.get(deployment, 0)
    if weight <= 0:
        raise FailoverRefused(409, f"drain: {deployment} has weight 0 already; nothing to drain")
    if onto is not None:
        if onto == deployment:
            raise FailoverRefused(409, f"drain: {deployment} cannot take its own traffic")
        after = {**before, deployment: 0, onto: before.get(onto, 0) + weight}
        summary = f"drain {deployment}: its weight to {onto}"
        return Move("drain", dict(before), after, summary, onto)
    alive = set(up)
    others = {d: w for d, w in before.items() if d != deployment and w > 0 and d in alive}
    if not others:
        raise FailoverRefused(
            409,
            f"drain: no other deployment of {model} has weight and is up to take "
            f"{deployment}'s traffic; name one to take it (to)",
        )
    after = {**before, deployment: 0, **spread(others, weight)}
    return Move(
        "drain",
        dict(before),
        after,
        f"drain {deployment}: its weight spread over {', '.join(others)} in proportion",
    )


def spread(weights: Mapping[str, int], extra: int) -> Weights:
    """`weights` with `extra` added in proportion to them, in whole numbers that add up
    (largest remainders first)."""
    total = sum(weights.values())
    exact = {d: w + extra * w / total for d, w in weights.items()}
    out = {d: int(v) for d, v in exact.items()}
    short = sum(weights.values()) + extra - sum(out.values())
    for d in sorted(exact, key=lambda d: exact[d] - out[d], reverse=True)[:short]:
        out[d] += 1
    return out


def restore(model: str, before: Weights, job: Past) -> Move:
    """The weights job `job` found when it began. FailoverRefused (409) when it has none
    recorded or they are the weights now."""
    if job.before is None:
        raise FailoverRefused(409, f"restore: job {job.id} recorded no weights before it")
    after = {d: job.before.get(d, w) for d, w in before.items()}
    if after == before:
        raise FailoverRefused(
            409, f"restore: {model}'s weights are those from before job {job.id} already"
        )
    unknown = sorted(d for d in before if d not in job.before)
    return Move(
        "restore",
        dict(before),
        after,
        f"the weights of {model} from before job {job.id}"
        + (f" ({', '.join(unknown)} not in it: kept)" if unknown else ""),
    )


def step(move: Move, pct: int, max_weight: int | None = None) -> Weights:
    """The weights `pct` % of the way: each deployment's share moves that far from its
    share before to its share after, in whole weights (on the scale of the weights before,
    at least 100); at 100 % the weights after. A deployment with a share keeps at least 1."""
    if pct >= 100:
        return fit(move.after, max_weight)
    sb, sa = shares(move.before), shares(move.after)
    scale = max(sum(move.before.values()), sum(move.after.values()), 100)
    out = {}
    for d in move.after:
        share = sb.get(d, 0.0) + (sa.get(d, 0.0) - sb.get(d, 0.0)) * pct / 100
        out[d] = 0 if share <= 0 else max(1, round(scale * share))
    return fit(out, max_weight)


def fit(weights: Weights, max_weight: int | None) -> Weights:
    """`weights` scaled down, in proportion, to the data plane's largest weight (HAProxy's
    256); a weight above 0 stays above 0."""
    top = max(weights.values(), default=0)
    if max_weight is None or top <= max_weight:
        return dict(weights)
    return {d: (0 if w == 0 else max(1, round(w * max_weight / top))) for d, w in weights.items()}


def table(move: Move) -> list[tuple[str, int, int]]:
    """(deployment, weight before, weight after) in the model's order, for the plan."""
    return [(d, move.before.get(d, 0), w) for d, w in move.after.items()]
