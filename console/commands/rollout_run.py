"""`engineroom rollout run PLAN [--wait] | list | show ID | pause ID | resume ID | abort ID`:
a rollout run in the gateway (console.gateway.rollouts.runner), followed and steered from here.
The rollout goes on in the gateway whatever happens to this command; `show` reattaches.

Exit codes: 0 started (with --wait: succeeded), or steered; 1 refused (the plan does not
fit, a rollout is open already, a step halted it, it was aborted); 2 a plan file that is
not one, a rollout id that is not one, or a gateway that did not answer; 3 a bad fleet
file or no gateway token.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from console.commands.base import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from console.core.safetext import say

if TYPE_CHECKING:
    from console.collect.clients.gateway_client import GatewayClient, GatewayError
    from console.core.config.load import Fleet
    from console.core.gateway_wire import RolloutRecord

ROLLOUT_ID = re.compile(r"[0-9a-f]{1,32}")
FOLLOW_EVERY_S = 1.0
MISSED_ANSWERS = 10  # polls in a row the gateway may miss before --wait gives up following
WHO_MAX = 500


def add_verbs(verbs: Any) -> None:
    run = verbs.add_parser("run", help="run a plan in the gateway (it outlives this command)")
    run.add_argument("plan", metavar="PLAN")
    run.add_argument("--why", default="", help="recorded with the rollout and in the audit")
    run.add_argument("--wait", action="store_true", help="follow it until it ends or halts")
    verbs.add_parser("list", help="the gateway's rollouts, newest first")
    show = verbs.add_parser("show", help="one rollout: its steps, phases and events")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true")
    for verb, what in (("pause", "at the end of the wave under way"),
                       ("resume", "a paused, halted or interrupted rollout"),
                       ("abort", "now, leaving every deployment as it is")):  # fmt: skip
        steer = verbs.add_parser(verb, help=f"{verb} a rollout: {what}")
        steer.add_argument("id", metavar="ID")
        steer.add_argument("--why", default="", help="recorded in the audit")


def run_verb(fleet: Fleet, args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.verb == "run":
        return _start(fleet, args.plan, args.why, args.wait, out)
    if args.verb != "list" and not ROLLOUT_ID.fullmatch(args.id):
        say(f"engineroom: rollout {args.verb}: {args.id!r} is not a rollout id", sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_ask(fleet, args, out))


def _who() -> str:
    try:
        return getpass.getuser()[:WHO_MAX]
    except (KeyError, OSError):
        return ""


def _start(fleet: Fleet, path: str, why: str, wait: bool, out: TextIO) -> int:
    from console.core.rollouts.plan_file import PlanError, join_problems, read_plan, to_data
    from console.core.rollouts.planner import check_plan

    try:
        plan = read_plan(path)
    except PlanError as exc:
        say(f"engineroom: rollout run: {exc}", sys.stderr)
        return EXIT_USAGE
    problems = check_plan(plan, fleet)
    if problems:
        say(f"engineroom: rollout run: {path}: does not fit {fleet.source}; nothing started:",
            sys.stderr)  # fmt: skip
        say(join_problems([f"{path}: {p}" for p in problems]), sys.stderr, lines=True)
        return EXIT_FAILED

    async def go() -> int:
        client = _client(fleet)
        try:
            record = await client.rollout_start(to_data(plan), _who(), why[:WHO_MAX])
            say(f"rollout {record.id} started: {len(record.steps)} step(s); it runs in "
                f"the gateway (engineroom rollout show {record.id})", out)  # fmt: skip
            return await _follow(client, record, out) if wait else EXIT_OK
        except _gateway_error() as exc:
            return _refused(exc, "rollout run")
        finally:
            await client.close()

    return asyncio.run(go())


async def _ask(fleet: Fleet, args: argparse.Namespace, out: TextIO) -> int:
    client = _client(fleet)
    try:
        if args.verb == "list":
            _table(await client.rollouts(), out)
            return EXIT_OK
        if args.verb == "show":
            record = await client.rollout(args.id)
            if args.json:
                text = json.dumps(record.model_dump(mode="json"), indent=2, ensure_ascii=True)
                out.write(text + "\n")
            else:
                show(record, out)
            return EXIT_OK
        record = await client.rollout_steer(args.id, args.verb, _who(), args.why[:WHO_MAX])
        say(f"rollout {record.id}: {args.verb} "
            f"{'asked (at the end of the wave under way)' if args.verb == 'pause' else 'done'}; "
            f"now {record.status}", out)  # fmt: skip
        return EXIT_OK
    except _gateway_error() as exc:
        return _refused(exc, f"rollout {args.verb}")
    finally:
        await client.close()


def _client(fleet: Fleet) -> GatewayClient:
    from console.collect.clients.gateway_client import GatewayClient

    return GatewayClient(fleet, timeout=10.0)


def _gateway_error() -> type[GatewayError]:
    from console.collect.clients.gateway_client import GatewayError

    return GatewayError


def _refused(exc: GatewayError, what: str) -> int:
    if exc.status is None:
        say(f"engineroom: {what}: the gateway did not answer: {exc.reason}", sys.stderr)
        return EXIT_UNREACHABLE
    say(f"engineroom: {what}: refused by the gateway: {exc.reason}", sys.stderr, lines=True)
    return EXIT_FAILED


async def _follow(client: GatewayClient, record: RolloutRecord, out: TextIO) -> int:
    """Print each phase as it ends until the rollout is no longer running."""
    printed: set[tuple[int, str]] = set()
    missed = 0
    while True:
        for n, step in enumerate(record.steps, 1):
            for phase, detail in step.details.items():
                if (n, phase) not in printed:
                    printed.add((n, phase))
                    say(f"  {n:>3} {step.deployment:<20} {phase:<9} {detail}", out)
        if record.status != "running":
            break
        await asyncio.sleep(FOLLOW_EVERY_S)
        try:
            record = await client.rollout(record.id)
            missed = 0
        except _gateway_error() as exc:
            missed += 1
            if missed >= MISSED_ANSWERS:
                say(f"engineroom: rollout {record.id}: the gateway stopped answering "
                    f"({exc.reason}); the rollout goes on there", sys.stderr)  # fmt: skip
                return EXIT_UNREACHABLE
    say(f"rollout {record.id}: {record.status}"
        + (f": {record.error}" if record.error else ""), out)  # fmt: skip
    return EXIT_OK if record.status == "succeeded" else EXIT_FAILED


def _table(records: list[RolloutRecord], out: TextIO) -> None:
    if not records:
        say("(no rollout)", out)
        return
    say(f"{'ID':<14} {'STATUS':<12} {'OPERATION':<10} {'STEP':<8} {'WHO':<12} STARTED", out)
    for r in records:
        created = (r.model_extra or {}).get("created")  # the gateway's, not in the model
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(created or 0))
        at = f"{min(r.current + 1, len(r.steps))}/{len(r.steps)}"
        say(f"{r.id:<14} {r.status:<12} {r.operation:<10} {at:<8} "
            f"{str(r.who)[:12]:<12} {started}", out)  # fmt: skip


def show(record: RolloutRecord, out: TextIO) -> None:
    """A rollout as an operator reads it: where it is, each model's capacity now, each step
    and phase, why it stopped."""
    from console.core.gateway_wire import ModelCapacity, capacity_head

    say(f"rollout {record.id}: {record.status}, {record.operation}, by {record.who}",
        out)  # fmt: skip
    if record.error:
        say(f"  {record.error}", out, lines=True)
    for model, weights in (record.weights_seen or {}).items():
        say(f"  {model}: weights read back from its data plane: {weights}", out)
    caps = record.capacity
    say(f"  {capacity_head(caps)}", out)
    for model, cap in (caps or {}).items():
        say(f"    {model}: {(cap or ModelCapacity()).words()}", out)
    say(f"  {'#':>3} {'WAVE':<4} {'DEPLOYMENT':<20} {'OPERATION':<13} {'STATE':<11} PHASE", out)
    for n, step in enumerate(record.steps, 1):
        say(f"  {n:>3} {step.wave:<4} {step.deployment:<20} {step.operation:<13} "
            f"{step.state:<11} {step.phase or ''}", out)  # fmt: skip
        for phase, detail in step.details.items():
            say(f"        {phase}: {detail}", out)
    for event in record.events[-10:]:
        when = time.strftime("%H:%M:%S", time.localtime(event.get("time") or 0))
        why = f": {event['why']}" if event.get("why") else ""
        say(f"  {when} {event.get('who')} {event.get('what')}{why}", out)
