"""The command line's verbs, one module each: its arguments (`add_arguments`) and its run
(`run`, the exit code), held in a `Command`. console.cli parses with them and calls one.

A verb's module imports what it calls inside `run`, so `engineroom --help` and the
headless verbs load neither Textual nor the other verbs' layers.
"""

from __future__ import annotations

from console.commands import (
    agent,
    check,
    demo,
    diagnose,
    drill,
    failover,
    gateway,
    haproxy,
    jobs,
    record,
    replay,
    rollout,
    rules,
    serve,
    timeline,
    tui,
    vllm,
)
from console.commands.base import Command

# In the order `engineroom --help` lists them.
COMMANDS: tuple[Command, ...] = (
    agent.COMMAND,
    demo.COMMAND,
    tui.COMMAND,
    record.COMMAND,
    replay.COMMAND,
    timeline.COMMAND,
    check.COMMAND,
    diagnose.COMMAND,
    vllm.COMMAND,
    gateway.COMMAND,
    failover.COMMAND,
    haproxy.COMMAND,
    drill.COMMAND,
    rollout.COMMAND,
    rules.COMMAND,
    jobs.COMMAND,
    serve.COMMAND,
)
