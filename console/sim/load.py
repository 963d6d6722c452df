"""SIMULATED traffic on one engine: arrivals, batching, queueing and latency over time.

A fluid model, advanced once a second: requests arrive at a rate that drifts (slow sine,
noise, occasional bursts), enter the running batch while it has room and wait otherwise.
Latency follows the load: inter-token latency grows with the batch, time to first token
with KV-cache pressure and with the time spent waiting. Each finished request is recorded
the way the real engines count it (cumulative counters and histograms, never reset), so
the agent's windowed percentiles come out of the same bucket deltas as in production.

Requests that really arrive over HTTP (`plan`, `begin`, `finish`) are timed from the same
state and counted the same way, so they are served with the latency the engine reports: a
client through the gateway sees the engine's TTFT plus the API server and the network,
never less, as with real engines. Two things make that hold:

- a request's time to first token is spread evenly inside its histogram bucket. The agent
  (like Prometheus' histogram_quantile) interpolates percentiles linearly inside a bucket;
  with values spread that way the p95 it reports is the p95 the requests were served with.
  (A smooth distribution bunched at a bucket's low end would make the engine report,
  say, 230 ms while its requests got 150 ms.)
- an HTTP request's prompt costs at least a typical prompt of this traffic: the demo's
  clients send a few placeholder words for the traffic they stand for.

Routed traffic (the demo fleet's engines, `Routed`): the arrivals follow where a router
sends the demo's clients, not a rate of their own. Each client request that reaches the
engine (its prompt carries CLIENT_MARK) stands for `stands_for` simulated requests, so the
simulated rate is that many times the client requests the engine got over the last
ROUTED_WINDOW_S. A deployment the gateway gives weight 0 gets no client request, so its
simulated traffic falls to nothing, and the one that takes the traffic gets all of it,
with the queueing its batch limit makes of it. Canaries, warm-ups and a drill's benchmark
are served and counted, but stand for nobody else.
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py), as in the recorded fixtures.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# The API server's share of an HTTP request before the engine's clock starts (parse,
# tokenize, hand over): vLLM's TTFT histogram does not see it, a client does.
API_SERVER_S = 0.003
API_SERVER_PER_PROMPT_TOKEN_S = 2e-6
TICK_S = 1.0
WAITS_KEPT = 3600  # ticks of queue-wait history
WARMUP_S = 120.0  # simulated history before the first scrape, so nothing starts from zero

# Routed traffic: the window over which client requests set the simulated rate, and the
# words in a demo client's prompt that make a request stand for others (console.sim.fleet).
ROUTED_WINDOW_S = 20.0
CLIENT_MARK = "SIMULATED client"
ARRIVALS_KEPT = 100_000  # client arrivals remembered: a bound, far above the window's
STANDS_FOR_ENV = "ENGINEROOM_SIM_STANDS_FOR"  # a launched engine process's `stands_for`

# The two incidents a demo can show, on a cycle from the fleet's start (seconds).
BREACH_CYCLE_S, BREACH_FROM_S, BREACH_FOR_S = 300.0, 45.0, 90.0
SURGE_CYCLE_S, SURGE_FROM_S, SURGE_FOR_S = 360.0, 90.0, 75.0


class Histogram:
    """A Prometheus-style histogram: per-bucket counts, exported cumulative."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times  # buckets are "le" (<=)
        self.sum += value * times

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        return list(itertools.accumulate(self.counts))


@dataclass(frozen=True, slots=True)
class Traffic:
    """What a deployment's load looks like on a healthy day."""

    rate: float  # requests per second, on average
    prompt_tokens: float  # mean prompt length
    output_tokens: float  # mean answer length
    max_seqs: int  # the engine's batch limit (vLLM max_num_seqs)
    kv_tokens: int  # KV-cache capacity in tokens
    prefill_s: float  # time to first token for a mean prompt on an idle engine
    itl_s: float  # inter-token latency with a near-empty batch
    max_output: int = 2048
    period_s: float = 900.0  # the slow daily-like swing, compressed
    ttft_breach: bool = False  # now and then a wave of long prompts slows prefill
    queue_surge: bool = False  # now and then more traffic than the batch can take


def spread_in_bucket(value: float, bounds: tuple[float, ...], u: float) -> float:
    """`value` moved to the point `u` (0..1) of its histogram bucket; beyond the last
    bound it stays as it is."""
    i = bisect_left(bounds, value)
    if i >= len(bounds):
        return value
    lower = bounds[i - 1] if i > 0 else 0.0
    return lower + (bounds[i] - lower) * u


@dataclass(slots=True)
class Routed:
    """Arrivals that follow a router: `stands_for` simulated requests per client request
    that reached the engine; until the first window has passed, `prior` requests per
    second (the rate the fleet expects this deployment to get at its starting weight)."""

    stands_for: float
    prior: float
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))


@dataclass(slots=True)
class Plan:
    """How one request will be answered: when its first token comes and how fast the rest."""

    queue_s: float
    ttft_s: float  # as the engine measures it: from the moment the engine has the request
    itl_s: float
    tokens: int
    prompt_tokens: int
    reason: str  # finish reason when it runs to the end
    api_s: float = 0.0  # an HTTP request's time in the API server, before the engine's clock


def gpu_busy(batch: float) -> float:
    """0..1: a dozen sequences in the batch already keep an LLM's GPU near fully busy."""
    return 0.97 * (1 - math.exp(-batch / 8.0))


class Workload:
    """One engine's simulated traffic and its cumulative counters."""

    def __init__(
        self,
        traffic: Traffic,
        *,
        seed: int,
        start: float,
        responses: bool = False,
        routed: Routed | None = None,
    ) -> None:
        self.traffic = traffic
        self.routed = routed
        self.rng = random.Random(seed)
        self.start = start  # the fleet's start: incidents are scheduled from it
        self.phase = self.rng.uniform(0, 2 * math.pi)
        self.running = 0.0
        self.waiting = 0.0
        self.live = 0  # requests answered over HTTP right now
        self.kv_usage = 0.0
        self.preemptions = 0
        self._burst_until = -math.inf
        self._burst_factor = 1.0
        self._finish_carry = 0.0
        # (time, queue wait) at each tick, newest last: an hour of ticks at most.
        self._waits: deque[tuple[float, float]] = deque(maxlen=WAITS_KEPT)
        # cumulative, as the engines keep them
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_total = 0
        self.generation_total = 0
        self.queue_s_total = 0.0
        self.success_s_total = 0.0  # end-to-end time of the requests that did not fail
        self.prefix_queries = 0
        self.prefix_hits = 0
        # Triton times every response of a streaming model. Kept per answer length (how
        # many answers had n responses, their first responses' and later responses' time),
        # so a finished request costs one addition; `responses()` makes the per-index view.
        self.timed_responses = responses
        self._by_length: dict[int, list[float]] = {}  # n -> [answers, first s, later s]
        self.last_finish = start
        self._now = start - WARMUP_S
        while self._now < start:
            self.tick(self._now + TICK_S)

    # --- what the GPUs see
    @property
    def batch(self) -> float:
        return self.running + self.live

    @property
    def gpu_busy(self) -> float:
        return gpu_busy(self.batch)

    @property
    def batch_fill(self) -> float:
        return min(1.0, self.batch / self.traffic.max_seqs)

    # --- the model
    def _in_window(self, now: float, cycle: float, begin: float, length: float) -> bool:
        return begin <= (now - self.start) % cycle < begin + length

    def breaching(self, now: float) -> bool:
        return self.traffic.ttft_breach and self._in_window(
            now, BREACH_CYCLE_S, BREACH_FROM_S, BREACH_FOR_S
        )

    def surging(self, now: float) -> bool:
        return self.traffic.queue_surge and self._in_window(
            now, SURGE_CYCLE_S, SURGE_FROM_S, SURGE_FOR_S
        )

    def arrived(self, now: float) -> None:
        """A client request reached the engine (routed traffic only)."""
        if self.routed is not None:
            self.routed.arrivals.append(now)

    def routed_rate(self, now: float) -> float:
        """Simulated requests per second that the client requests of the last window stand
        for; the prior until a window has passed since the start."""
        assert self.routed is not None
        if now < self.start + ROUTED_WINDOW_S:
            seen = sum(1 for t in self.routed.arrivals if t >= self.start)
            known = max(0.0, now - self.start) / ROUTED_WINDOW_S
            guessed = self.routed.prior * (1 - known)
            return guessed + self.routed.stands_for * seen / ROUTED_WINDOW_S
        arrivals = self.routed.arrivals
        while arrivals and arrivals[0] < now - ROUTED_WINDOW_S:
            arrivals.popleft()
        return self.routed.stands_for * len(arrivals) / ROUTED_WINDOW_S

    def rate(self, now: float) -> float:
        t = self.traffic
        swing = 1 + 0.3 * math.sin(2 * math.pi * now / t.period_s + self.phase)
        if self.routed is not None:
            # Where the router sends the clients; their own arrivals make the bursts. A
            # surge is a flood of the traffic routed here, so a drained deployment has none.
            rate = self.routed_rate(now) * swing
            if self.surging(now) and rate > 0:
                rate = max(rate, 1.25 * self.capacity())
            return max(0.0, rate * self.rng.gauss(1.0, 0.08))
        if now >= self._burst_until and self.rng.random() < TICK_S / 180:
            self._burst_until = now + self.rng.uniform(8, 20)
            self._burst_factor = self.rng.uniform(1.4, 2.0)
        burst = self._burst_factor if now < self._burst_until else 1.0
        rate = t.rate * swing * burst
        if self.surging(now):
            # A batch job floods the deployment: a quarter more than a full batch serves.
            rate = max(rate, 1.25 * self.capacity())
        return max(0.0, rate * self.rng.gauss(1.0, 0.08))

    def capacity(self) -> float:
        """Requests per second a full batch finishes."""
        t = self.traffic
        return t.max_seqs / (t.prefill_s + t.output_tokens * t.itl_s * 1.8)

    def itl_now(self) -> float:
        return self.traffic.itl_s * (1 + 0.8 * self.batch_fill)

    def prefill_now(self, now: float) -> float:
        prefill = self.traffic.prefill_s * (1 + 1.5 * max(0.0, self.kv_usage - 0.5))
        return prefill * (5.0 if self.breaching(now) else 1.0)

    def queue_wait_now(self) -> float:
        """Little's law: the queue drains at the rate requests leave the batch."""
        leave_rate = max(self.batch, 1.0) / self.e2e_now(0.0)
        return self.waiting / leave_rate

    def queue_wait_felt(self, now: float) -> float:
        """The wait of the requests whose first token comes now: they arrived one wait
        ago, when the queue was what it was then. The engine's histogram and a client
        both count a request when its first token comes, so while a queue grows the two
        agree only if a simulated request is timed this way (with the wait of a request
        arriving now, the engine ran ahead of its clients by the whole wait)."""
        wait = self.queue_wait_now()
        for when, then in reversed(self._waits):  # newest first; a minute or so back
            if when <= now - wait:
                return then
        return wait

    def e2e_now(self, prefill: float) -> float:
        return prefill + self.traffic.output_tokens * self.itl_now()

    def tick(self, now: float) -> None:
        """Advance the fluid model to `now` and record the requests that finished."""
        dt = now - self._now
        if dt <= 0:
            return
        self._now = now
        self._waits.append((now, self.queue_wait_now()))
        t = self.traffic
        arrivals = self.rate(now) * dt
        e2e = self.e2e_now(self.prefill_now(now))
        leaving = self.running * min(1.0, dt / e2e)
        room = max(0.0, t.max_seqs - self.live - (self.running - leaving))
        admitted = min(self.waiting + arrivals, room)
        self.running += admitted - leaving
        self.waiting += arrivals - admitted
        if self.running < 0.01:  # a fluid batch only tends to empty: a drained one is empty
            self.running = 0.0
        context = t.prompt_tokens + t.output_tokens / 2
        self.kv_usage = min(0.995, self.batch * context / t.kv_tokens * self.rng.gauss(1, 0.03))
        if self.kv_usage > 0.95 and self.rng.random() < 0.3:
            self.preemptions += 1
        self._finish_carry += leaving
        done = int(self._finish_carry)
        self._finish_carry -= done
        for _ in range(done):
            plan = self.plan(now)
            self.record(plan, plan.tokens, plan.reason)

    # --- single requests
    def _lognormal(self, mean: float, sigma: float) -> float:
        return mean * math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))

    def plan(
        self, now: float, prompt_tokens: int | None = None, max_tokens: int | None = None
    ) -> Plan:
        """A simulated request's plan; with `prompt_tokens`, one that came over HTTP."""
        t = self.traffic
        breach = self.breaching(now)
        mean_prompt = t.prompt_tokens * (8.0 if breach else 1.0)
        typical = max(1, int(self._lognormal(mean_prompt, 0.6)))
        counted = typical if prompt_tokens is None else prompt_tokens
        timed = max(typical, counted)
        wanted = max(1, min(t.max_output, int(self._lognormal(t.output_tokens, 0.6))))
        tokens = wanted if max_tokens is None else max(1, min(wanted, max_tokens))
        reason = "length" if max_tokens is not None and tokens == max_tokens else "stop"
        if max_tokens is None and self.rng.random() < 0.12:
            reason = "length"  # some clients set max_tokens and hit it
        # Rare enough that a healthy deployment stays well inside a 1% error SLO even over
        # the first few seconds of a window.
        roll = self.rng.random()
        if roll < 0.0003:
            reason = "error"
        elif roll < 0.002:
            reason = "abort"
        # Scheduling takes a fraction of a millisecond even with nobody waiting. A request
        # over HTTP waits from now on; a simulated one is counted as its first token comes.
        wait = self.queue_wait_now() if prompt_tokens is not None else self.queue_wait_felt(now)
        queue = (wait + 0.0004) * self._lognormal(1.0, 0.3)
        prefill = self.traffic.prefill_s * (timed / t.prompt_tokens) ** 0.8
        prefill *= 1 + 1.5 * max(0.0, self.kv_usage - 0.5)
        ttft = queue + self._lognormal(prefill, 0.35)
        api = 0.0
        if prompt_tokens is not None:
            api = self._lognormal(API_SERVER_S + counted * API_SERVER_PER_PROMPT_TOKEN_S, 0.3)
        return Plan(
            queue_s=queue,
            ttft_s=max(queue, spread_in_bucket(ttft, self.ttft.bounds, self.rng.random())),
            itl_s=self._lognormal(self.itl_now(), 0.12),
            tokens=tokens,
            prompt_tokens=counted,
            reason=reason,
            api_s=api,
        )

    def begin(self) -> None:
        self.live += 1

    def finish(self, plan: Plan, tokens: int, reason: str) -> None:
        """A request answered over HTTP ended (`tokens` sent; reason "abort" if cut off)."""
        self.live -= 1
        self.record(plan, tokens, reason)

    def record(self, plan: Plan, tokens: int, reason: str) -> None:
        self.finished[reason] += 1
        self.prompt_total += plan.prompt_tokens
        self.generation_total += tokens
        self.prefix_queries += plan.prompt_tokens
        self.prefix_hits += int(plan.prompt_tokens * 0.35)
        self.queue_s_total += plan.queue_s
        e2e = plan.ttft_s + max(0, tokens - 1) * plan.itl_s
        if tokens > 0:
            self.ttft.observe(plan.ttft_s)
        if tokens > 1:
            self.itl.observe(plan.itl_s, tokens - 1)
        self.e2e.observe(e2e)
        if reason != "error":
            self.success_s_total += e2e
        if self.timed_responses and tokens > 0:
            n = min(tokens, self.traffic.max_output)
            slot = self._by_length.setdefault(n, [0, 0.0, 0.0])
            slot[0] += 1
            slot[1] += plan.ttft_s - plan.queue_s
            slot[2] += plan.itl_s  # each of its n - 1 later responses took this long
        self.last_finish = self._now

    def responses(self) -> list[tuple[int, float]]:
        """Per response index, (responses sent, seconds they took), as Triton times a
        streaming model's responses; empty unless the workload times them."""
        if not self._by_length:
            return []
        longest = max(self._by_length)
        answers = [0] * (longest + 1)  # answers with exactly n responses
        later = [0.0] * (longest + 1)  # the time of one later response, summed over them
        first_s = 0.0
        for n, (count, first, each) in self._by_length.items():
            answers[n] += int(count)
            later[n] += each
            first_s += first
        out: list[tuple[int, float]] = []
        reaching, per_response = 0, 0.0  # answers with more than i responses, their time
        suffix = [(0, 0.0)] * (longest + 1)
        for n in range(longest, 0, -1):
            reaching += answers[n]
            per_response += later[n]
            suffix[n] = (reaching, per_response)
        out.append((suffix[1][0], first_s))
        out += [suffix[i + 1] for i in range(1, longest)]
        return out

    @property
    def requests_total(self) -> int:
        return sum(self.finished.values())
