"""`engineroom rollout plan ... | check PLAN`: plan a fleet rollout (issue 31) as waves,
and hold a plan file to the fleet as it is now. `run`, `list`, `show`, `pause`, `resume`
and `abort` run and steer one in the gateway (console.commands.rollout_run).

The planner is console.core.rollouts.planner; `--what-if` asks the agents what `drill what-if` asks
them (console.commands.drill.what_if_rows) and selects every deployment they say goes
stale. Exit codes: 0 planned (or the plan fits), 1 refused (a rule, an operation that
cannot be done, a plan that no longer fits) or not written, 2 a name the fleet file lacks,
a plan file that is not one, or an agent that did not answer the what-if, 3 a bad fleet
file. Nothing is written unless the whole plan is made.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from console.commands.base import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Command,
    fleet_arg,
    fleet_of,
)
from console.commands.drill import WHAT_IF_FLAGS
from console.commands.rollout_run import add_verbs, run_verb
from console.core.rollouts.plan_file import DEFAULT_TOLERANCE
from console.core.safetext import clean, say

if TYPE_CHECKING:
    from console.core.config.load import Fleet
    from console.core.rollouts.plan_file import Plan

# The what-if's verdicts for an engine that the change leaves unfit: a rebuild, an engine
# already built for it in the cache (a swap), or, on TensorRT-LLM's PyTorch backend, no
# build but a validation against the baseline. "unknown" is none: said, not planned.
STALE_VERDICTS = ("rebuild", "cache", "re-validate")


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"wants 1 or more, got {value}")
    return number


def _ratio(value: str) -> float:
    number = float(value)
    if not 1.0 <= number <= 100.0:
        raise argparse.ArgumentTypeError(f"wants a ratio from 1.0 to 100, got {value}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", required=True)
    plan = verbs.add_parser(
        "plan", help="the waves of a rollout: restart, another profile or the drill"
    )
    what = plan.add_mutually_exclusive_group(required=True)
    what.add_argument("--restart", action="store_true", help="restart each deployment's engine")
    what.add_argument("--profile", metavar="NAME", help="move each to launch profile NAME")
    what.add_argument("--drill", action="store_true", help="run each one's rebuild drill")
    plan.add_argument("--model", action="append", default=[], help="its deployments (repeat)")
    plan.add_argument("--node", action="append", default=[], help="the deployments on it")
    plan.add_argument("--deployment", action="append", default=[], help="this one")
    plan.add_argument(
        "--what-if",
        action="store_true",
        help="every deployment `drill what-if` says the node facts below make stale",
    )
    for flag in WHAT_IF_FLAGS:
        plan.add_argument(f"--{flag}", default=None, metavar="VERSION", help="with --what-if")
    plan.add_argument("--max-unavailable", type=_at_least_one, default=1, metavar="K")
    plan.add_argument("--canary", type=_at_least_one, default=1, metavar="N")
    plan.add_argument(
        "--allow-standby",
        action="store_true",
        help="start a model's standby first where its only carrying deployment goes out",
    )
    plan.add_argument(
        "--tolerance",
        type=_ratio,
        default=DEFAULT_TOLERANCE,
        metavar="RATIO",
        help=f"p95 TTFT and ITL over the baseline a deployment may come back with "
        f"(default {DEFAULT_TOLERANCE})",
    )
    plan.add_argument("--out", metavar="FILE", help="write the plan (TOML if FILE ends .toml)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    check = verbs.add_parser("check", help="does a plan file still fit the fleet file")
    check.add_argument("plan", metavar="PLAN")
    add_verbs(verbs)
    for action in verbs.choices.values():
        fleet_arg(action)


def run(args: argparse.Namespace) -> int:
    if args.verb == "check":
        return check_plan_file(fleet_of(args), args.plan)
    if args.verb != "plan":
        return run_verb(fleet_of(args), args)
    change = {
        key: getattr(args, key)
        for key in (f.replace("-", "_") for f in WHAT_IF_FLAGS)
        if getattr(args, key) is not None
    }
    for key, value in change.items():  # they go into the plan file, and to every agent
        if not clean(value):
            say(f"engineroom: rollout plan: --{key.replace('_', '-')}: wants a version "
                f"without control characters; got {value!r}", sys.stderr)  # fmt: skip
            return EXIT_USAGE
    if change and not args.what_if:
        say("engineroom: rollout plan: --driver, --gpu and the like go with --what-if", sys.stderr)
        return EXIT_USAGE
    if not (args.model or args.node or args.deployment or args.what_if):
        print(
            "engineroom: rollout plan: select deployments with --model, --node, --deployment "
            "or --what-if",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return plan_rollout(fleet_of(args), args, change)


def plan_rollout(
    fleet: Fleet, args: argparse.Namespace, change: dict[str, str], out: TextIO | None = None
) -> int:
    out = out or sys.stdout  # read at the call: a test's captured stdout
    from console.core.rollouts.plan_file import join_problems, write_plan
    from console.core.rollouts.planner import (
        Ask,
        Refused,
        UnknownName,
        check_plan,
        make_plan,
        unique,
    )

    stale: list[str] = []
    if args.what_if:
        found = _stale(fleet, change)
        if found is None:
            return EXIT_UNREACHABLE
        stale = found
    ask = Ask(
        operation="profile" if args.profile is not None else "drill" if args.drill else "restart",
        profile=args.profile,
        models=unique(args.model),
        nodes=unique(args.node),
        deployments=unique(args.deployment),
        what_if=change,
        what_if_selected=stale,
        max_unavailable=args.max_unavailable,
        canary=args.canary,
        allow_standby=args.allow_standby,
        tolerance=args.tolerance,
    )
    try:
        plan = make_plan(fleet, ask)
    except UnknownName as exc:
        say(f"engineroom: rollout plan: {exc}", sys.stderr)
        return EXIT_USAGE
    except Refused as exc:
        refused = join_problems([f"engineroom: rollout plan: refused: {p}" for p in exc.problems])
        say(refused, sys.stderr, lines=True)
        return EXIT_FAILED
    broken = check_plan(plan, fleet)  # the planner's waves held to the rules a run will check
    if broken:
        problems = join_problems(broken)
        say(f"engineroom: rollout plan: the plan breaks its rules:\n{problems}", sys.stderr, True)
        return EXIT_FAILED
    if args.out:
        try:
            write_plan(plan, args.out)
        except OSError as exc:
            why = exc.strerror or exc
            say(f"engineroom: rollout plan: cannot write {args.out}: {why}", sys.stderr)
            return EXIT_FAILED
    if args.json:
        from console.core.rollouts.plan_file import to_json

        print(to_json(plan), file=out, end="")
    else:
        show(plan, out, fleet)
    if args.out:
        say(f"wrote {args.out}", sys.stderr if args.json else out)
    return EXIT_OK


def _stale(fleet: Fleet, change: dict[str, str]) -> list[str] | None:
    """The deployments the agents say the change makes stale; None (and why, said) when
    one did not answer: a plan on part of the fleet would leave engines stale unseen."""
    from console.commands.drill import what_if_rows

    if not change:
        print(
            "engineroom: rollout plan: --what-if needs at least one of "
            + ", ".join(f"--{f}" for f in WHAT_IF_FLAGS),
            file=sys.stderr,
        )
        return None
    rows, problems = what_if_rows(fleet, change)
    for problem in problems:
        say(f"engineroom: rollout plan: --what-if: {problem}", sys.stderr)
    if problems:
        say("engineroom: rollout plan: not every agent answered the what-if: no plan", sys.stderr)
        return None
    for node in fleet.nodes:
        if node.agent is None and fleet.deployments_on(node.name):
            say(f"engineroom: rollout plan: --what-if: node {node.name} has no agent to ask: "
                "its deployments are not judged", sys.stderr)  # fmt: skip
    known = {d.id for m in fleet.models for d in m.deployments}
    stale = []
    for row in rows:
        dep, verdict = _field(row, "deployment"), _field(row, "verdict")
        if dep not in known:
            say(f"engineroom: rollout plan: --what-if: an agent named deployment {dep!r}, "
                "which is not in the fleet file: left out", sys.stderr)  # fmt: skip
        elif verdict in STALE_VERDICTS:
            stale.append(dep)
        elif verdict != "serves":
            why = "; ".join(str(w) for w in row.get("why") or []) if isinstance(row, dict) else ""
            say(f"engineroom: rollout plan: --what-if: {dep} not planned: the what-if says "
                f"{verdict} ({why or 'no reason given'})", sys.stderr)  # fmt: skip
    return stale


def _field(row: Any, key: str) -> str:
    """A what-if row's text field; an agent's answer is outside text of any shape."""
    value = row.get(key) if isinstance(row, dict) else None
    return value if isinstance(value, str) else repr(value)


def show(plan: Plan, out: TextIO, fleet: Fleet | None = None) -> None:
    """The plan's waves, a line per step; with `fleet`, what each drill costs its backend
    (TensorRT-LLM's engine backend rebuilds; its PyTorch backend re-validates, no build)."""
    from console.core.rollouts.planner import counts

    waves, deployments, models = counts(plan)
    doing = f"profile {plan.profile!r}" if plan.operation == "profile" else plan.operation
    say(
        f"Rollout plan: {doing} on fleet {plan.fleet!r} ({plan.fleet_digest[:19]}), "
        f"{waves} wave(s), {deployments} deployment(s) of {models} model(s)",
        out,
    )
    say(
        f"at most {plan.max_unavailable} out per model, canary {plan.canary}, tolerance "
        f"p95 TTFT x{plan.tolerance.ttft_p95_ratio:g}, ITL x{plan.tolerance.itl_p95_ratio:g}",
        out,
    )
    print(
        f"{'WAVE':>4}  {'MODEL':<24} {'DEPLOYMENT':<24} {'NODE':<14} {'ENGINE':<7} WHAT", file=out
    )
    for number, wave in enumerate(plan.waves, 1):
        for step in wave.steps:
            what: str = step.operation
            if step.operation in ("profile", "start-standby"):
                what += f" {step.profile!r}"
            elif step.drill:
                what += f" {step.drill!r}"
                drill = fleet.drills.get(step.drill) if fleet is not None else None
                if drill is not None:
                    cost = "re-validate, no build" if drill.pipeline == "pytorch" else "rebuild"
                    what += f" ({drill.pipeline} backend: {cost})"
            say(
                f"{number:>4}  {step.model:<24} {step.deployment:<24} {step.node:<14} "
                f"{step.engine:<7} {what}{' (canary)' if step.canary else ''}",
                out,
            )
    if not plan.waves:
        print("(nothing selected: no waves)", file=out)


def check_plan_file(fleet: Fleet, path: str, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from console.core.rollouts.plan_file import PlanError, join_problems, read_plan
    from console.core.rollouts.planner import check_plan, counts

    try:
        plan = read_plan(path)
    except PlanError as exc:
        say(f"engineroom: rollout check: {exc}", sys.stderr)
        return EXIT_USAGE
    problems = check_plan(plan, fleet)
    if problems:
        say(f"engineroom: rollout check: {path}: does not fit {fleet.source}:", sys.stderr)
        say(join_problems([f"{path}: {p}" for p in problems]), sys.stderr, lines=True)
        return EXIT_FAILED
    waves, deployments, models = counts(plan)
    say(
        f"{path}: fits {fleet.source}: {plan.operation}, {waves} wave(s), "
        f"{deployments} deployment(s) of {models} model(s)",
        out,
    )
    return EXIT_OK


COMMAND = Command(
    "rollout",
    "plan a rollout in waves (restart, another profile, the drill), check it, run and steer it",
    add_arguments,
    run,
)
