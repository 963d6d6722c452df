"""The console's one Diagnoser (console/collect/diagnose/diagnoser.py), looked through once per
view.

The first look waits until every node has answered once (or is known down) and the
gateway, where there is one, was asked: a diagnosis already there at the first look is
raised at once, so that look must see the whole fleet, not its first node. It waits
FIRST_LOOK_WAIT_S at most: a node no source ever lists is not waited for. A replay looks
at the replayed time; when its cursor goes back, what was first seen later is forgotten.

A look reads the whole fleet (at 1,000 nodes about 30 ms here, at 10,000 ten times that):
the live console looks at most BUDGET of its time (issue 30: 2 % of a core), so on a
large fleet a look is skipped until its share allows (at 1,000 nodes about every 1.5 s,
at 10,000 about every 15 s); a small fleet's is every view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from console.collect.clients.gateway_client import GatewayClient
from console.collect.diagnose.diagnoser import CannotTell, Diagnoser, Diagnosis
from console.collect.sources.source import NodeState
from console.collect.views.gateway_view import GatewayView
from console.collect.views.view import FleetView
from console.core import diagnosis as d
from console.core.config.load import Fleet

BUDGET = 0.02  # the share of the console's time its diagnoses may take
FIRST_LOOK_WAIT_S = 10.0  # the longest the first look waits for the fleet's first answers


@dataclass(frozen=True, slots=True)
class Findings:
    """The diagnoses as of one view, as the screens draw them (ViewBuilt.findings)."""

    found: tuple[Diagnosis, ...] = ()  # worst first, the resolved ones last
    looked: bool = False  # False until the first whole look: the count is unknown
    counts: tuple[int, int] | None = None  # ConsoleDiagnoses.counts
    now: float = 0.0  # the time they were judged at (the replayed time in a replay)
    cannot_tell: tuple[CannotTell, ...] = ()  # what could not be told, and why

    def get(self, key: tuple[str, str]) -> Diagnosis | None:
        return next((x for x in self.found if x.key == key), None)


class ConsoleDiagnoses:
    """What the console found, as the header and the Diagnoses screens read it."""

    def __init__(self, fleet: Fleet, offline: bool) -> None:
        self.fleet = fleet
        self.diagnoser = Diagnoser(fleet)
        self.found: list[Diagnosis] = []  # worst first, the resolved ones last
        self.looked = False  # False until the first whole look: the count is unknown
        self.gateway_expected = not offline and GatewayClient.configured(fleet)
        self._now: float | None = None
        self.clock = time.perf_counter  # what a look's cost is measured by
        self._next = 0.0  # the live console's next look, by `clock`
        self.skipped = 0  # views not looked at, to keep within BUDGET
        self._first_view: float | None = None  # by `clock`: when the first view came

    def update(
        self,
        view: FleetView,
        states: dict[str, NodeState],
        gateway: GatewayView | None,
        gateway_error: str | None,
        now: float | None = None,
    ) -> None:
        """One look at a new view. `now`: the replayed time; None for the live fleet."""
        started = self.clock()
        if not self.looked:
            first = self._first_view = started if self._first_view is None else self._first_view
            unasked = self.gateway_expected and gateway is None and gateway_error is None
            if (view.summary.nodes_waiting or unasked) and started - first < FIRST_LOOK_WAIT_S:
                return
        if now is None and self.looked and started < self._next:
            self.skipped += 1
            return
        if now is not None and self._now is not None and now < self._now:
            self.diagnoser = Diagnoser(self.fleet)  # a replay went back: start again there
        self._now = now
        self.found = self.diagnoser.update(view, states, gateway, now)
        self.looked = True
        ended = self.clock()
        self._next = ended + (ended - started) / BUDGET

    def now(self) -> float:
        """The time the diagnoses were judged at: the replayed time in a replay."""
        return time.time() if self._now is None else self._now

    def counts(self) -> tuple[int, int] | None:
        """(open, critical) for the header; None before the first look. A resolved
        diagnosis is listed for a while but is not counted."""
        if not self.looked:
            return None
        open_ = [x for x in self.found if x.state != "resolved"]
        return len(open_), sum(x.kind.severity == "critical" for x in open_)

    def get(self, key: tuple[str, str]) -> Diagnosis | None:
        return next((x for x in self.found if x.key == key), None)

    def findings(self) -> Findings:
        """What was found, as of this look, for the screens to draw."""
        return Findings(tuple(self.found), self.looked, self.counts(), self.now(),
                        tuple(self.diagnoser.cannot_tell))  # fmt: skip

    def moved(self, key: tuple[str, str], move: d.Move) -> None:
        """The operator made `move` for the diagnosis `key`: it is verified from now."""
        self.diagnoser.moved(key, move)
        found = self.get(key)
        if found is not None and found.state == "active":  # said at once, not next look
            found.state, found.detail = "verifying", f"verifying {move} (0 s)"
