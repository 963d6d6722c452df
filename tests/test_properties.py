"""Property tests of the parsers that read what others wrote: Prometheus text from engines,
fleet.toml from operators, SSE from Triton. Hypothesis makes the inputs; each property
says what must hold for all of them. Example counts are bounded (a few seconds in all)."""

from __future__ import annotations

import asyncio
import itertools
import math
import re
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from console.core.config.load import ConfigError, parse_fleet
from console.core.config.tomlpos import key_lines
from console.core.metrics import promtext
from console.gateway.http.relay import sse_events
from console.gateway.routing.upstream import UpstreamError

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same examples every run: CI finds what a developer can rerun
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- Prometheus text ---------------------------------------------------------------------

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
NAMES = st.builds(
    str.__add__, st.sampled_from(LETTERS + ":"), st.text(LETTERS + "0123456789:", max_size=30)
)
LABEL_NAMES = st.builds(
    str.__add__, st.sampled_from(LETTERS), st.text(LETTERS + "0123456789", max_size=15)
)
VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**53), 2**53).map(float)


def escape(value: str) -> str:
    """A label value as the exposition format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


SAMPLES = st.lists(
    st.tuples(NAMES, st.dictionaries(LABEL_NAMES, st.text(max_size=20), max_size=4), VALUES),
    max_size=12,
)


def render(samples: list[tuple[str, dict[str, str], float]]) -> str:
    lines = []
    for name, labels, value in samples:
        body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {number(value)}" if labels else f"{name} {number(value)}")
    return "\n".join(lines) + "\n"


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@SETTINGS
@given(SAMPLES)
# Found by this test: `\\n` in a label value (a backslash, then n) read as a newline, and a
# label value holding U+2028 or a bare CR cut the sample in two (it was lost as garbage).
@example([("m", {"path": "C:\\new"}, 1.0)])
@example([("m", {"model": "a\u2028b"}, 1.0), ("n", {"x": "\r"}, 2.0)])
def test_every_sample_written_in_the_exposition_format_reads_back_as_written(samples):
    parsed = promtext.parse(render(samples))
    assert parsed.bad_lines == 0, parsed.first_bad
    assert [(s.name, s.labels) for s in parsed.samples] == [(n, ls) for n, ls, _ in samples]
    assert all(same(s.value, v) for s, (_, _, v) in zip(parsed.samples, samples, strict=True))


@SETTINGS
@given(SAMPLES, st.lists(st.text(max_size=40), max_size=8), st.randoms())
def test_garbage_lines_cost_only_themselves(samples, garbage, rnd):
    """One bad line never hides the good ones, and every line is counted once."""
    lines = render(samples).split("\n")
    for line in garbage:
        lines.insert(rnd.randint(0, len(lines)), line)
    text = "\n".join(lines)
    try:
        parsed = promtext.parse(text)
    except promtext.MetricsGarbage:
        assert not samples  # only a text with no readable sample at all is garbage
        return
    good = [(s.name, s.labels) for s in parsed.samples]
    for name, labels, _ in samples:
        assert (name, labels) in good
    assert parsed.bad_lines + len(parsed.samples) <= parsed.lines


@SETTINGS
@given(st.text(max_size=300), st.lists(st.sampled_from(["", "vllm:", "engineroom_"]), max_size=3))
def test_any_text_parses_or_is_called_garbage(text, prefixes):
    try:
        parsed = promtext.parse(text, tuple(prefixes) or ("",))
    except promtext.MetricsGarbage as exc:
        assert "no readable Prometheus sample" in str(exc)
        return
    assert 0 <= parsed.bad_lines <= parsed.lines


# -- fleet.toml ----------------------------------------------------------------------------

VALID = """\
[fleet]
name = "prop"
refresh_s = 1.0

[[nodes]]
name = "n1"
agent = "http://127.0.0.1:9410"

[[models]]
name = "tiny"
slo = { ttft_p95_ms = 500 }
  [[models.deployments]]
  id = "tiny-vllm"
  node = "n1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:8000"

[profiles.tiny]
engine = "vllm"
node = "n1"
model = "/models/tiny"
served_model_name = "tiny"
port = 8000
"""
KEYS = ["name", "agent", "refresh_s", "node", "engine", "endpoint", "weight", "port", "id",
        "model", "slo", "args", "token_env", "ssh", "environment", "url", "steps", "nodes",
        "x"]  # fmt: skip
SCALARS = st.one_of(
    st.integers(-5, 70000),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.text(max_size=12).map(lambda s: '"' + s.replace("\\", "").replace('"', "") + '"'),
    st.just("[]"),
    st.just("{ }"),
    st.just('{ ttft_p95_ms = "x" }'),
)
HEADERS = ["[fleet]", "[[nodes]]", "[[models]]", "[[models.deployments]]", "[profiles.p]",
           "[gateway]", "[agent]", "[keys]", "[drills.d]", "[[nodes.ssh]]", "[nodes]"]  # fmt: skip
TOML_LINES = st.one_of(
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(KEYS), SCALARS.map(str)),
    st.sampled_from(HEADERS),
)


def edit(lines: list[str], rnd, new: list[str]) -> str:
    """The valid fleet with some lines dropped and some written in."""
    out = [line for line in lines if rnd.random() > 0.15]
    for line in new:
        out.insert(rnd.randint(0, len(out)), line)
    return "\n".join(out) + "\n"


def assert_said_where(exc: ConfigError, text: str) -> None:
    """The error names the file and the line that is wrong; only a key that is missing
    from a table the file never wrote has no line to point at."""
    first = str(exc).splitlines()[0]
    match = re.match(r"fleet\.toml:(\d+): \S", first)
    if match is None:
        assert re.match(r"fleet\.toml: \S+: missing required key", first), (
            f"no line in {first!r} for:\n{text}"
        )
        return
    assert 1 <= int(match.group(1)) <= max(1, len(text.splitlines())), first


@SETTINGS
@given(st.lists(TOML_LINES, max_size=6), st.randoms())
def test_an_edited_fleet_file_loads_or_says_which_line_is_wrong(new, rnd):
    text = edit(VALID.splitlines(), rnd, new)
    try:
        parse_fleet(text)
    except ConfigError as exc:
        assert_said_where(exc, text)


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_as_a_fleet_file_loads_or_says_which_line_is_wrong(text):
    try:
        parse_fleet(text)
    except ConfigError as exc:
        assert_said_where(exc, text)
    key_lines(text)  # the line finder reads anything


# Found by the property above: tomllib says "at end of document", not a line.
def test_a_toml_error_at_the_end_of_the_file_names_its_line():
    text = VALID + "agent"  # a key with no value on the last line, which has no newline
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text)
    assert str(caught.value).startswith(f"fleet.toml:{len(text.splitlines())}: not valid TOML")


# -- SSE relaying ---------------------------------------------------------------------------

PAYLOADS = st.lists(
    st.text(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"),
        min_size=1,
        max_size=60,
    ).map(lambda s: s.strip().encode() or b"x"),
    max_size=10,
)


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def relay(parts: list[bytes], limit: int = 1 << 20) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [event async for event in sse_events(_chunks(parts), limit)]

    return asyncio.run(collect())


@SETTINGS
@given(
    PAYLOADS,
    st.lists(st.integers(0, 10_000), max_size=20),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),
)
def test_sse_payloads_out_are_the_payloads_in_however_the_stream_is_cut(
    payloads, points, newline, extras
):
    events = []
    for i, payload in enumerate(payloads):
        fields = [b"event: message", b"id: " + str(i).encode(), b": a comment"] if extras else []
        events.append(newline.join([*fields, b"data: " + payload]) + newline + newline)
    stream = b"".join(events)
    assert relay(cut(stream, points)) == payloads


@SETTINGS
@given(st.integers(1, 64), st.lists(st.integers(0, 10_000), max_size=20))
def test_an_sse_line_that_never_ends_is_cut_at_the_limit(limit, points):
    stream = b"data: " + b"x" * (limit + 10)  # no newline, ever
    with pytest.raises(UpstreamError, match="over"):
        relay(cut(stream, points), limit)
