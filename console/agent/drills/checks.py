"""A drill's validate and benchmark steps: OpenAI-compatible clients run by the agent.

Validate sends a fixed prompt set, greedy, to the candidate and to the baseline, and
compares the answers: the exact-match rate and the first-N-token agreement. Tokens come
from `logprobs.tokens` when both servers return them; otherwise the answers are split into
words, and the result says "words".

Benchmark runs a concurrency sweep of streaming completions against one server at a time
and reports, per level, TTFT and inter-token latency p95 (ms), output tokens per second and
requests per second, as the client saw them.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

import aiohttp

from console.core.config.load import Drill

WORD = re.compile(r"\s*\S+")


class CheckFailed(Exception):
    pass


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


async def _complete(
    http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int, logprobs: bool
) -> tuple[str, list[str] | None]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
    }
    if logprobs:
        body["logprobs"] = 1
    async with http.post(url + "/v1/completions", json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise CheckFailed(f"{url}: /v1/completions answered {resp.status}: {text[:200]}")
    try:
        choice = json.loads(text)["choices"][0]
        answer = choice["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CheckFailed(f"{url}: not an OpenAI completion: {text[:200]}") from None
    tokens = (choice.get("logprobs") or {}).get("tokens")
    return str(answer), tokens if isinstance(tokens, list) else None


async def validate(
    candidate: tuple[str, str],
    baseline: tuple[str, str],
    prompts: list[str],
    max_tokens: int,
    first_n: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Greedy answers of (url, model) `candidate` and `baseline`, compared prompt by prompt."""
    rows = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for prompt in prompts:
            (c_text, c_tok), (b_text, b_tok) = await asyncio.gather(
                _complete(http, *candidate, prompt, max_tokens, logprobs=True),
                _complete(http, *baseline, prompt, max_tokens, logprobs=True),
            )
            unit = "tokens" if c_tok is not None and b_tok is not None else "words"
            if unit == "words":
                c_tok, b_tok = WORD.findall(c_text), WORD.findall(b_text)
            assert c_tok is not None and b_tok is not None
            rows.append(
                {
                    "prompt": prompt,
                    "candidate": c_text,
                    "baseline": b_text,
                    "exact": c_text == b_text,
                    "first_n": c_tok[:first_n] == b_tok[:first_n],
                    "agree_tokens": _common_prefix(c_tok, b_tok),
                    "unit": unit,
                }
            )
    n = len(rows)
    units = {r["unit"] for r in rows}
    return {
        "prompts": n,
        "unit": units.pop() if len(units) == 1 else "mixed",
        "first_n": first_n,
        "exact_match": sum(bool(r["exact"]) for r in rows) / n if n else None,
        "first_n_agreement": sum(bool(r["first_n"]) for r in rows) / n if n else None,
        "rows": rows,
    }


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def _stream_one(
    http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int
) -> tuple[float | None, list[float], int]:
    """(TTFT s, inter-token gaps s, output tokens) of one streamed completion."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first: float | None = None
    last = sent
    gaps: list[float] = []
    chunks = 0
    usage: int | None = None
    async with http.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise CheckFailed(f"answered {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            data = json.loads(line[5:])
            if data.get("usage") and data["usage"].get("completion_tokens") is not None:
                usage = int(data["usage"]["completion_tokens"])
            if not any(c.get("text") for c in data.get("choices") or []):
                continue
            now = time.perf_counter()
            if first is None:
                first = now - sent
            else:
                gaps.append(now - last)
            last = now
            chunks += 1
    return first, gaps, usage if usage is not None else chunks


async def sweep_level(
    url: str,
    model: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    prompt: str,
    timeout_s: float,
) -> dict[str, Any]:
    ttfts: list[float] = []
    gaps: list[float] = []
    tokens = 0
    errors: list[str] = []
    queue = list(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def worker() -> None:
            nonlocal tokens
            while queue:
                queue.pop()
                try:
                    ttft, g, n = await _stream_one(http, url, model, prompt, max_tokens)
                except (TimeoutError, aiohttp.ClientError, CheckFailed, ValueError) as exc:
                    errors.append(str(exc)[:200] or type(exc).__name__)
                    continue
                if ttft is not None:
                    ttfts.append(ttft)
                gaps.extend(g)
                tokens += n

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    ttft95, itl95 = p95(ttfts), p95(gaps)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "ttft_p95_ms": None if ttft95 is None else round(ttft95 * 1000, 2),
        "itl_p95_ms": None if itl95 is None else round(itl95 * 1000, 2),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "requests_per_s": round((requests - len(errors)) / wall, 2) if wall > 0 else None,
        "wall_s": round(wall, 3),
    }


def requests_for(level: int, configured: int | None) -> int:
    return configured if configured is not None else max(8, 2 * level)


def benchmark_gates(drill: Drill, bench: dict[str, Any]) -> list[tuple[str, bool, str]]:
    spec = drill.benchmark
    gates = []
    errors = sum(
        (row.get(who) or {}).get("errors", 0) for row in bench["levels"] for who in ("candidate",)
    )
    gates.append(("benchmark errors", errors == 0, f"{errors} failed candidate requests"))
    cold = bench["cold_start_s"]["candidate"]
    if spec.max_cold_start_s is not None:
        ok = cold is not None and cold <= spec.max_cold_start_s
        gates.append(("cold start", ok, f"cold start {cold} s (max {spec.max_cold_start_s:g} s)"))
    top = bench["levels"][-1] if bench["levels"] else None
    for key, limit, label in (
        ("ttft_p95_ms", spec.max_ttft_p95_ratio, "TTFT p95"),
        ("itl_p95_ms", spec.max_itl_p95_ratio, "ITL p95"),
    ):
        if limit is None or top is None:
            continue
        c, b = top["candidate"].get(key), top["baseline"].get(key)
        ratio = c / b if c is not None and b else None
        ok = ratio is not None and ratio <= limit
        shown = "unknown" if ratio is None else f"{ratio:.2f}x"
        gates.append(
            (
                f"{label} ratio",
                ok,
                f"{label} at {top['concurrency']}: {shown} of vLLM (max {limit:g}x)",
            )
        )
    return gates


def sweep_summary(bench: dict[str, Any]) -> list[str]:
    """The cold starts and the highest concurrency, candidate against vLLM, in words."""
    out = []
    cold = bench["cold_start_s"]
    base = (cold.get("baseline") or {}).get("total_s")
    out.append(f"cold start {_num(cold.get('candidate'), 's')} vs vLLM {_num(base, 's')}")
    if bench["levels"]:
        top = bench["levels"][-1]
        c, b = top.get("candidate") or {}, top.get("baseline") or {}
        out.append(
            f"at {top['concurrency']}: TTFT p95 {_num(c.get('ttft_p95_ms'), 'ms')} vs "
            f"{_num(b.get('ttft_p95_ms'), 'ms')}, ITL p95 {_num(c.get('itl_p95_ms'), 'ms')} vs "
            f"{_num(b.get('itl_p95_ms'), 'ms')}, {_num(c.get('tokens_per_s'), 'tok/s')} vs "
            f"{_num(b.get('tokens_per_s'), 'tok/s')}"
        )
    return out


def _num(value: Any, unit: str) -> str:
    return "unknown" if value is None else f"{value:g} {unit}"
