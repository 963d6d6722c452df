"""`engineroom demo` as a newcomer runs it: in a real terminal, then `q`."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT
from tests.support.terminal import TMUX, Terminal, console_env


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make test does)")
def test_make_demo_then_q_leaves_nothing_in_tmp(tmp_path):
    """Issue 28 #15: every `make demo` then `q` left a /tmp/engineroom-demo-* folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = console_env(TMPDIR=str(tmp))
    env.pop("ENGINEROOM_DEMO_TOKEN", None)
    with Terminal([sys.executable, "-m", "console.cli", "demo"], (100, 30), env, ROOT) as term:
        term.wait_for("gpu-a1", timeout=90, what="the demo fleet on screen")
        assert list(tmp.glob("engineroom-demo-*")), "the demo's folder is where TMPDIR says"
        term.keys("q")
        term.wait_exit(60, what="the demo ended")
    assert list(tmp.iterdir()) == []
