"""`engineroom demo`: until the console's TUI lands, watch the agent on this machine.

It runs the agent's snapshot cycle against the example fleet and prints a summary every
refresh. Nothing here is simulated: on a machine without a GPU it says so.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from console.agent.node import NodeAgent
from console.agent.summary import summarize
from console.core.config import load_fleet

EXAMPLE_FLEET = Path(__file__).resolve().parents[1] / "fleet.toml"


def run_demo(*, no_tui: bool = False, nodes: int = 4) -> int:
    fleet = load_fleet(EXAMPLE_FLEET)
    print(f"fleet: {EXAMPLE_FLEET}", flush=True)
    return asyncio.run(_watch(fleet.nodes[0].name, fleet))


async def _watch(node: str, fleet: object) -> int:
    from console.core.config import Fleet

    assert isinstance(fleet, Fleet)
    agent = NodeAgent(fleet, node)
    try:
        while True:
            snap = await agent.cycle()
            print("\033[2J\033[H" + summarize(snap), flush=True)
            print("\n(the live TUI arrives with the console issue; Ctrl-C quits)", flush=True)
            await asyncio.sleep(fleet.fleet.refresh_s)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    finally:
        await agent.close()
