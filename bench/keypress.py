"""Key-to-screen, as bench.console_scale and bench.prom_scale measure it.

From the key entering the app's message queue, as a terminal's would, until the first
frame that the target screen composes after its draw: Textual's compositor renders the
changed lines of the top screen (headless, the frame is made but not written to a
terminal). That is what the operator waits for.

Before, the benches stopped the clock when their own polling loop saw the draw end. That
left out the frame, which comes one of Textual's update periods (1/60 s) or more after
the draw: 20 ms later at 10 nodes, up to 90 ms at 1,000 streamed nodes (docs/evidence/
bench-console-scale.txt). `noticed_ms` keeps the old figure, so runs before and after
compare.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from textual.app import App
from textual.screen import Screen

_composed: dict[int, float] = {}  # id(screen) -> when it last composed a frame on top
_patched = False


def watch_frames() -> None:
    """Note when each top screen composes a frame (this process only; a bench's)."""
    global _patched
    if _patched:
        return
    original = Screen._compositor_refresh

    def composed(screen: Screen) -> None:
        original(screen)
        if screen.is_current:
            _composed[id(screen)] = time.monotonic()

    Screen._compositor_refresh = composed  # type: ignore[method-assign,assignment]
    _patched = True


@dataclass
class KeyTime:
    frame_ms: float  # key -> the target screen's first frame after its draw
    noticed_ms: float  # key -> the bench's loop saw the draw end (the old measure)


async def press(app: App, key: str, target: type[Screen], timeout: float = 30.0) -> KeyTime:
    """Press `key` and wait for `target` to be drawn (its `drawn_at`) and composed."""
    watch_frames()
    t0 = time.monotonic()
    app.simulate_key(key)
    noticed = None
    while time.monotonic() - t0 < timeout:
        screen = app.screen
        drawn = getattr(screen, "drawn_at", 0.0)
        if isinstance(screen, target) and drawn >= t0:
            if noticed is None:
                noticed = time.monotonic()
            frame = _composed.get(id(screen), 0.0)
            if frame >= drawn:
                return KeyTime((frame - t0) * 1000, (noticed - t0) * 1000)
        await asyncio.sleep(0.001)
    raise TimeoutError(f"{key!r}: {target.__name__} not shown in {timeout:.0f} s")
