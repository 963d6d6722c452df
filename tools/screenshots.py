"""`make screenshots`: every screen of the console on the SIMULATED demo fleet, as SVG and PNG.

    python -m tools.screenshots screenshots/ [--warmup 50]   (from the repository root)

It starts the demo fleet, lets the console collect history for --warmup seconds (the
demo's planned incidents, a TTFT SLO breach and a hot GPU, show by then), then drives
the app with Textual's pilot and saves each screen.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from console.core.config.load import load_fleet
from console.demo import start_sim
from console.sim.fleetfile import TOKEN_ENV
from console.tui.app import EngineroomApp

# (file name, keys typed after the previous screen, terminal size, seconds to wait after).
# A name starting with "+" keeps the screens open (a dialog, then what it leads to).
SHOTS = [
    ("fleet", [], (120, 36), 1.2),
    ("fleet-80x24", [], (80, 24), 1.2),
    ("models", [":models\r"], (120, 36), 1.2),
    ("model-detail", [":model llama-3.1-8b-instruct\r"], (120, 36), 1.2),
    ("node", [":node gpu-a1\r"], (120, 36), 1.2),
    ("gpus-hot", [":gpus\r", "/temp>80\r"], (120, 36), 1.2),
    ("engine", [":engine gpu-a1/{triton}\r"], (120, 36), 1.2),
    ("events", [":events\r"], (120, 36), 1.2),
    ("help", ["?"], (120, 36), 1.2),
    ("start-vllm", [":node gpu-a1\r", "s"], (120, 36), 2.0),
    ("+start-vllm-confirm", ["ctrl+s"], (120, 36), 0.8),
    ("+job-loading", ["y"], (120, 36), 4.0),  # the SIMULATED stand-in loads in ~7 s
    ("+job-ready", [], (120, 36), 5.0),
    ("jobs", [":jobs\r"], (120, 36), 1.2),
    ("failover-plan", [":models\r", "f"], (140, 40), 2.0),
    ("playbook", [":models\r", "p"], (140, 30), 1.5),
    ("drills", [":drills\r"], (140, 40), 2.0),
    ("+drill-confirm", ["R"], (140, 40), 0.8),
    ("+drill-job", ["y"], (140, 44), 7.0),  # the build (TEST DOUBLE) is running
    ("+drill-job-done", [], (140, 44), 24.0),
    ("drills-after", [":drills\r"], (140, 40), 2.0),
]
KEYS = {
    " ": "space",
    ":": "colon",
    "/": "slash",
    ">": "greater_than_sign",
    "<": "less_than_sign",
    "=": "equals_sign",
    "?": "question_mark",
    ".": "full_stop",
    "-": "minus",
    "_": "underscore",
    "\r": "enter",
}


def key_names(text: str) -> list[str]:
    """Key names for typing `text` with Textual's pilot ("\r" is Enter)."""
    return [KEYS.get(ch, ch) for ch in text]


async def shoot(fleet_path: Path, out: Path, warmup: float) -> list[Path]:
    fleet = load_fleet(fleet_path)
    saved: list[Path] = []
    app = EngineroomApp(fleet)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(warmup)
        for name, typed, size, wait in SHOTS:
            await pilot.resize_terminal(*size)
            if not name.startswith("+"):
                while len(app.screen_stack) > 2:
                    app.pop_screen()
            name = name.removeprefix("+")
            await pilot.pause(0.3)
            for text in typed:
                text = text.format(triton=_first_engine(app, "gpu-a1", "triton"))
                await pilot.press(*([text] if text.startswith("ctrl+") else key_names(text)))
                await pilot.pause(0.5)
            await pilot.pause(wait)  # a refresh after the last key, or a job's progress
            svg = out / f"{name}.svg"
            app.save_screenshot(svg.name, str(out))
            saved.append(svg)
    return saved


def _first_engine(app: EngineroomApp, node: str, kind: str) -> str:
    snap = app.collector.states[node].snapshot
    engines = [e.id for e in snap.engines if e.kind == kind] if snap else []
    return engines[0] if engines else "none"


EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence"


async def shoot_evidence(out: Path, kind: str = "h200x2") -> list[Path]:
    """The Fleet and Node screens rendered from what the agent printed on real H200s
    (docs/evidence/KIND-agent-once.json, recorded on the device machine)."""
    from console.collect.recordings.replay import ReplayCollector
    from console.core.config.load import parse_fleet
    from console.core.snapshot import decode_snapshot

    fleet = parse_fleet(
        f'[fleet]\nname = "{kind} (recorded on the device machine)"\n'
        f'[[nodes]]\nname = "{kind}"\nagent = "http://127.0.0.1:1"\n'
    )
    snap = decode_snapshot((EVIDENCE / f"{kind}-agent-once.json").read_text())
    app = EngineroomApp(fleet, collector=ReplayCollector(fleet, {kind: snap}))
    saved = []
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(1.5)
        for name, typed in ((f"{kind}-fleet", []), (f"{kind}-node", [f":node {kind}\r"])):
            for text in typed:
                await pilot.press(*key_names(text))
            await pilot.pause(1.2)
            svg = out / f"{name}.svg"
            app.save_screenshot(svg.name, str(out))
            saved.append(svg)
    return saved


def to_png(svg: Path) -> Path:
    """librsvg lays out the monospace grid exactly (cairosvg does not honour textLength),
    but drops leading spaces unless told to keep them, in the copy it reads."""
    png = svg.with_suffix(".png")
    text = svg.read_text().replace("<text ", '<text xml:space="preserve" ')
    with tempfile.NamedTemporaryFile("w", suffix=".svg") as tmp:
        tmp.write(text)
        tmp.flush()
        subprocess.run(["rsvg-convert", "-w", "1600", tmp.name, "-o", str(png)], check=True)
    return png


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--warmup", type=float, default=50.0)
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token
    proc, fleet_path = start_sim(args.nodes, Path(tempfile.mkdtemp(prefix="shots-")), token)
    try:
        for kind in ("h200x2", "h200x4"):
            for svg in asyncio.run(shoot_evidence(args.out, kind)):
                print(f"{svg} {to_png(svg)}")
        for svg in asyncio.run(shoot(fleet_path, args.out, args.warmup)):
            print(f"{svg} {to_png(svg)}")
    finally:
        proc.terminate()  # the fleet stops its agents, gateway and the engines it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
