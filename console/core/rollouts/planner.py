"""The rollout planner (issue 31): which deployments, in which waves, so that no model
loses its last deployment that carries traffic. Headless and pure: fleet.toml and the
operator's ask in, a console.core.rollouts.plan_file.Plan out, or the refusals.

The rules (docs/rollouts.md):
- per model at most `max_unavailable` deployments out at once;
- a model's first wave is its canary: `canary` deployments, nothing else of that model;
- a model never has all its deployments that carry traffic (weight > 0 in fleet.toml) out
  at once. One whose only carrying deployment is selected is refused, unless
  `allow_standby` and it has a standby to start first (weight 0 and a launch profile);
- a deployment is in a plan once, and only where its node has an agent to act through.

`check_plan` holds a plan read back from a file to the same rules against the fleet as it
is now, so a plan edited out of shape, or made on other deployments, runs nowhere.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from console.core.config.model import Deployment, Fleet, Model
from console.core.drills.trtllm_releases import drill_release_problems
from console.core.rollouts.plan_file import (
    DEFAULT_TOLERANCE,
    Operation,
    Plan,
    Selection,
    Step,
    Tolerance,
    Wave,
    fleet_digest,
)

MAX_LISTED_NAMES = 10  # an unknown name's error lists this many of the known ones


class UnknownName(Exception):
    """The ask names a model, node, deployment or profile fleet.toml does not have."""


class Refused(Exception):
    """The plan cannot be made safely; `problems` says why, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Ask:
    """What the operator asks for: the operation, the selection (a union), and how."""

    operation: Operation
    profile: str | None = None  # operation "profile"
    models: Sequence[str] = ()
    nodes: Sequence[str] = ()
    deployments: Sequence[str] = ()
    what_if: dict[str, str] = field(default_factory=dict)  # the hypothetical node asked about
    what_if_selected: Sequence[str] = ()  # the deployments the what-if said go stale
    max_unavailable: int = 1
    canary: int = 1
    allow_standby: bool = False
    tolerance: float = DEFAULT_TOLERANCE


def check_names(fleet: Fleet, ask: Ask) -> None:
    """UnknownName for the first name the ask gives that fleet.toml does not have."""
    known = {
        "--model": ("model", [m.name for m in fleet.models], ask.models),
        "--node": ("node", [n.name for n in fleet.nodes], ask.nodes),
        "--deployment": (
            "deployment",
            [d.id for m in fleet.models for d in m.deployments],
            ask.deployments,
        ),
        "--profile": ("profile", list(fleet.profiles), [ask.profile] if ask.profile else []),
    }
    for flag, (what, names, asked) in known.items():
        have = set(names)
        for name in asked:
            if name not in have:
                listed = ", ".join(names[:MAX_LISTED_NAMES]) or "none"
                if len(names) > MAX_LISTED_NAMES:
                    listed += f", ... ({len(names)} in all)"
                raise UnknownName(
                    f"{fleet.source}: {flag} {name!r}: no such {what} in the fleet file "
                    f"({what}s: {listed})"
                )


def selected(fleet: Fleet, ask: Ask) -> list[tuple[Model, Deployment]]:
    """The union of the ask's selections, in fleet.toml's order."""
    models, nodes = set(ask.models), set(ask.nodes)
    ids = set(ask.deployments) | set(ask.what_if_selected)
    return [
        (m, d)
        for m in fleet.models
        for d in m.deployments
        if m.name in models or d.node in nodes or d.id in ids
    ]


@dataclass(frozen=True)
class _Index:
    """What the planner looks up per deployment, found once (a plan may hold 10,000)."""

    agents: frozenset[str]  # nodes with an agent
    drills: dict[str, list[str]]  # deployment id -> the drills that rebuild it

    @classmethod
    def of(cls, fleet: Fleet) -> _Index:
        drills: dict[str, list[str]] = defaultdict(list)
        for name, drill in fleet.drills.items():
            drills[drill.deployment].append(name)
        return cls(frozenset(n.name for n in fleet.nodes if n.agent), dict(drills))

    def drill(self, deployment: str) -> str | None:
        found = self.drills.get(deployment, [])
        return found[0] if len(found) == 1 else None


def make_plan(fleet: Fleet, ask: Ask) -> Plan:
    """The waves for the ask. UnknownName for a name the fleet lacks; Refused with every
    reason the plan cannot be made (each names its model or deployment)."""
    check_names(fleet, ask)
    if not 1 <= ask.canary <= ask.max_unavailable:
        raise Refused(
            [f"--canary {ask.canary}: wants 1 to --max-unavailable ({ask.max_unavailable})"]
        )
    index = _Index.of(fleet)
    chosen = selected(fleet, ask)
    problems = [p for m, d in chosen if (p := _cannot_act(fleet, index, ask, m, d))]
    by_model: dict[str, list[Deployment]] = defaultdict(list)
    for model, dep in chosen:
        by_model[model.name].append(dep)
    kept: list[tuple[Model, list[Deployment], set[str], Deployment | None]] = []
    for model in fleet.models:
        if model.name not in by_model:
            continue
        deps = by_model[model.name]
        carriers = {d.id for d in model.deployments if d.weight > 0}
        standby = None
        lone = [d for d in deps if d.id in carriers] if len(carriers) == 1 else []
        if lone:  # its only carrying deployment is selected: out, the model serves nothing
            standby = _standby(model)
            if not ask.allow_standby or standby is None:
                problems.append(_no_carrier(index, ask, model, lone[0]))
                continue
            carriers.add(standby.id)
        kept.append((model, deps, carriers, standby))
    if problems:
        raise Refused(problems)
    groups = [_model_waves(index, ask, *each) for each in kept]
    depth = max((len(g) for g in groups), default=0)
    waves = [Wave(steps=[s for g in groups if i < len(g) for s in g[i]]) for i in range(depth)]
    return Plan(
        fleet=fleet.fleet.name,
        fleet_digest=fleet_digest(fleet),
        operation=ask.operation,
        profile=ask.profile if ask.operation == "profile" else None,
        tolerance=Tolerance(ttft_p95_ratio=ask.tolerance, itl_p95_ratio=ask.tolerance),
        max_unavailable=ask.max_unavailable,
        canary=ask.canary,
        allow_standby=ask.allow_standby,
        selection=Selection(
            models=list(ask.models),
            nodes=list(ask.nodes),
            deployments=list(ask.deployments),
            what_if=dict(ask.what_if),
        ),
        waves=waves,
    )


def _model_waves(
    index: _Index,
    ask: Ask,
    model: Model,
    deps: list[Deployment],
    carriers: set[str],
    standby: Deployment | None,
) -> list[list[Step]]:
    """One model's waves: the standby's start (if any), its canary, then the rest, each
    wave at most max_unavailable and never every carrying deployment at once. Two queues
    (carrying or not) keep it linear in the model's deployments at any wave count."""
    waves: list[list[Step]] = []
    if standby is not None:
        waves.append([_step(model, standby, "start-standby", profile=standby.profile)])
    room = len(carriers) - 1  # carrying deployments a wave may take out
    carrying = deque((i, d) for i, d in enumerate(deps) if d.id in carriers)
    idle = deque((i, d) for i, d in enumerate(deps) if d.id not in carriers)
    first = True
    while carrying or idle:
        size = ask.canary if first else ask.max_unavailable
        wave: list[Deployment] = []
        out = 0  # carrying deployments in this wave
        while len(wave) < size:
            may_carry = bool(carrying) and out < room
            if may_carry and (not idle or carrying[0][0] < idle[0][0]):
                wave.append(carrying.popleft()[1])
                out += 1
            elif idle:
                wave.append(idle.popleft()[1])
            else:
                break
        if not wave:  # make_plan refuses a lone carrier first; never loop on one
            raise Refused([f"model {model.name}: no wave keeps a deployment carrying traffic"])
        waves.append(
            [
                _step(
                    model,
                    d,
                    ask.operation,
                    canary=first,
                    profile=ask.profile if ask.operation == "profile" else None,
                    drill=index.drill(d.id) if ask.operation == "drill" else None,
                )
                for d in wave
            ]
        )
        first = False
    return waves


def _step(model: Model, dep: Deployment, operation: str, **extra: object) -> Step:
    return Step.model_validate(
        {
            "model": model.name,
            "deployment": dep.id,
            "node": dep.node,
            "engine": dep.engine,
            "operation": operation,
            **{k: v for k, v in extra.items() if v is not None},
        }
    )


def _standby(model: Model) -> Deployment | None:
    """The deployment a rollout may start to keep the model served: weight 0, a profile."""
    return next((d for d in model.deployments if d.weight == 0 and d.profile), None)


def _doing(ask: Ask, subject: str, drill: str | None) -> str:
    if ask.operation == "profile":
        return f"moving {subject} to profile {ask.profile!r}"
    if ask.operation == "drill":
        return f"running drill {drill!r} on {subject}" if drill else f"rebuilding {subject}"
    return f"restarting {subject}"


def _no_carrier(index: _Index, ask: Ask, model: Model, dep: Deployment) -> str:
    doing = _doing(ask, f"{model.name}/{dep.id}", index.drill(dep.id))
    head = f"model {model.name}: {doing} would leave it no deployment carrying traffic"
    if not ask.allow_standby:
        return f"{head}; add a deployment or --allow-standby"
    return (
        f"{head}, and --allow-standby has no standby to start: no deployment of "
        f"{model.name} has weight 0 and a launch profile"
    )


def _cannot_act(fleet: Fleet, index: _Index, ask: Ask, model: Model, dep: Deployment) -> str | None:
    """Why the operation cannot be done to this deployment, or None."""
    subject = f"model {model.name}: deployment {dep.id} on node {dep.node}"
    if dep.node not in index.agents:
        return f"{subject}: the node has no agent; a rollout acts through the node's agent"
    if ask.operation == "profile" and ask.profile in fleet.profiles:
        profile = fleet.profiles[ask.profile]
        if profile.node != dep.node or profile.engine != dep.engine:
            return (
                f"{subject} ({dep.engine}): profile {ask.profile!r} launches {profile.engine} "
                f"on node {profile.node}"
            )
    if ask.operation == "drill":
        name = index.drill(dep.id)
        if name is None:
            drills = index.drills.get(dep.id, [])
            found = f"drills {drills} rebuild it" if drills else "no drill rebuilds it"
            return f"{subject} ({dep.engine}): {found} in the fleet file; a rollout wants one"
        drill = fleet.drills[name]  # run on the release the what-if asks about, else its pin
        release = ask.what_if.get("tensorrt_llm") or drill.pins.tensorrt_llm
        cannot = drill_release_problems(drill, release) if release else []
        if cannot:
            return f"{subject} ({dep.engine}): drill {name}: " + "; ".join(w for _, w in cannot)
    return None


# -- checking a plan read back --------------------------------------------------------


def check_plan(plan: Plan, fleet: Fleet) -> list[str]:
    """What makes `plan` unfit to run on `fleet` now, one line each (empty: it fits): a
    deployment gone or changed, an operation that cannot be done, a broken rule, another
    fleet, or deployments that changed since the plan was made (the digest)."""
    problems: list[str] = []
    index = _Index.of(fleet)
    deployments = {d.id: (m, d) for m in fleet.models for d in m.deployments}
    if plan.fleet != fleet.fleet.name:
        problems.append(f"fleet: planned for fleet {plan.fleet!r}; this is {fleet.fleet.name!r}")
    if plan.profile is not None and plan.profile not in fleet.profiles:
        problems.append(f"profile: {plan.profile!r} is not a launch profile in the fleet file")
    seen: set[str] = set()
    out: dict[str, dict[int, list[Step]]] = defaultdict(lambda: defaultdict(list))
    started: dict[str, tuple[int, str]] = {}  # model -> (wave, standby) it started in
    for w, s, step in plan.steps():
        where = f"waves[{w}].steps[{s}]"
        found = deployments.get(step.deployment)
        if found is None:
            problems.append(f"{where}: deployment {step.deployment!r} is not in the fleet file")
            continue
        model, dep = found
        said = (step.model, step.node, step.engine)
        if said != (model.name, dep.node, dep.engine):
            problems.append(
                f"{where}: deployment {dep.id!r} is model {model.name}, node {dep.node}, "
                f"engine {dep.engine} in the fleet file; the plan says {', '.join(said)}"
            )
            continue
        problems += [f"{where}: {p}" for p in _step_problems(plan, fleet, index, model, dep, step)]
        if step.operation == "start-standby":
            started.setdefault(model.name, (w, dep.id))
            continue
        if dep.id in seen:
            problems.append(f"{where}: deployment {dep.id!r} is in the plan twice")
        seen.add(dep.id)
        out[model.name][w].append(step)
    for model in fleet.models:
        if model.name in out:
            problems += _rule_problems(plan, model, out[model.name], started.get(model.name))
    if plan.fleet_digest != fleet_digest(fleet):
        problems.append(
            "fleet_digest: the fleet file's models and deployments changed since this plan "
            "was made: plan again"
        )
    return problems


def _step_problems(
    plan: Plan, fleet: Fleet, index: _Index, model: Model, dep: Deployment, step: Step
) -> list[str]:
    if step.operation == "start-standby":
        if not plan.allow_standby:
            return ["a standby start in a plan made without allow_standby"]
        if dep.weight != 0 or not dep.profile or step.profile != dep.profile:
            return [f"{dep.id!r} is no standby (weight 0 and its own launch profile)"]
        return []
    if step.operation != plan.operation:
        return [f"operation {step.operation!r} in a plan whose operation is {plan.operation!r}"]
    if step.operation == "profile" and step.profile != plan.profile:
        return [f"profile {step.profile!r}; the plan moves to {plan.profile!r}"]
    if step.operation == "drill" and step.drill not in index.drills.get(dep.id, []):
        return [f"drill {step.drill!r} is not a drill of {dep.id!r} in the fleet file"]
    # The node's agent and the profile's fit, as the planner judged them.
    ask = Ask(operation="restart" if step.operation == "drill" else step.operation)
    if step.operation == "profile" and plan.profile in fleet.profiles:
        ask = Ask(operation="profile", profile=plan.profile)
    why = _cannot_act(fleet, index, ask, model, dep)
    return [] if why is None else [why]


def _rule_problems(
    plan: Plan, model: Model, waves: dict[int, list[Step]], standby: tuple[int, str] | None
) -> list[str]:
    problems = []
    order = sorted(waves)
    for w in order:
        steps = waves[w]
        names = ", ".join(s.deployment for s in steps)
        canaries = sum(s.canary for s in steps)
        if w == order[0] and (canaries != len(steps) or len(steps) > plan.canary):
            problems.append(
                f"model {model.name}: wave {w + 1} is its first and so its canary: "
                f"{plan.canary} canary deployment(s) and nothing else (it has {names})"
            )
        elif w != order[0] and canaries:
            problems.append(
                f"model {model.name}: wave {w + 1} has a canary after its first wave ({names})"
            )
        if len(steps) > plan.max_unavailable:
            problems.append(
                f"model {model.name}: wave {w + 1} takes {len(steps)} deployments out "
                f"({names}); max_unavailable is {plan.max_unavailable}"
            )
        carriers = {d.id for d in model.deployments if d.weight > 0}
        if standby is not None and standby[0] < w:
            carriers.add(standby[1])
        if carriers and carriers <= {s.deployment for s in steps}:
            problems.append(
                f"model {model.name}: wave {w + 1} takes out every deployment carrying "
                f"its traffic ({names})"
            )
    return problems


def counts(plan: Plan) -> tuple[int, int, int]:
    """(waves, deployments operated on, models) of a plan."""
    ops = [step for _, _, step in plan.steps() if step.operation != "start-standby"]
    return len(plan.waves), len(ops), len({s.model for s in ops})


def unique(names: Iterable[str]) -> list[str]:
    """Names in their first order, each once (a repeated flag)."""
    return list(dict.fromkeys(names))
