"""A small, strict-enough parser for the Prometheus text exposition format.

Engines expose hundreds of series and the agent reads a handful, so the parser takes
the metric-name prefixes it cares about and skips everything else before touching the
labels. Lines it cannot read are counted, not fatal: one garbage line does not hide the
rest, and a text with no readable sample at all is reported as garbage.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    bad_lines: int = 0
    first_bad: str | None = None
    lines: int = 0


class MetricsGarbage(ValueError):
    """The text had lines but not one readable sample."""


_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ESCAPED = {"n": "\n", '"': '"', "\\": "\\"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    # One pass, left to right: `\\n` is a backslash and an n, not a backslash and a newline.
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(0)), value)


def parse_value(text: str) -> float:
    """A sample's value (or a bucket's `le`) as the format writes it: ValueError if it is
    not one. ASCII only, no `_`: Python's float() also reads "١٢" as 12 and "1_0" as 10,
    which Prometheus' own parser refuses."""
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if not text.isascii() or "_" in text:
        raise ValueError(f"not a number: {text[:40]!r}")
    return float(text)  # float() also reads NaN


def finite(text: str) -> float | None:
    """A finite number written as text (a sample, a CSV cell), else None: unknown."""
    try:
        value = parse_value(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse(text: str, prefixes: tuple[str, ...] = ("",)) -> Exposition:
    """Parse the samples whose names start with one of `prefixes`.

    Raises MetricsGarbage when the text has content but no sample can be read at all.
    """
    out = Exposition()
    any_sample_line = False
    # Lines end at \n only: str.splitlines() would also cut a label value at \r, \x1c or
    # U+2028, which the format lets a label value hold as they are.
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        out.lines += 1
        any_sample_line = True
        if not line.startswith(prefixes):
            # Still check that it looks like a sample, so that a page of garbage is noticed.
            if not _NAME.match(line):
                _bad(out, line)
            continue
        sample = _parse_line(line)
        if sample is None:
            _bad(out, line)
        else:
            out.samples.append(sample)
    if any_sample_line and out.bad_lines == out.lines:
        raise MetricsGarbage(
            f"no readable Prometheus sample in {out.lines} lines "
            f"(first: {(out.first_bad or '')[:80]!r})"
        )
    return out


def _bad(out: Exposition, line: str) -> None:
    out.bad_lines += 1
    if out.first_bad is None:
        out.first_bad = line


def _parse_line(line: str) -> Sample | None:
    name_match = _NAME.match(line)
    if not name_match:
        return None
    name = name_match.group(0)
    rest = line[name_match.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        close = _closing_brace(rest)
        if close < 0:
            return None
        body = rest[1:close]
        pos = 0
        while pos < len(body):
            match = _LABEL.match(body, pos)
            if not match:
                if body[pos:].strip(" ,"):
                    return None
                break
            labels[match.group(1)] = _unescape(match.group(2))
            pos = match.end()
        rest = rest[close + 1 :]
    parts = rest.split()
    if not parts or len(parts) > 2:
        return None
    try:
        value = parse_value(parts[0])
    except ValueError:
        return None
    return Sample(name, labels, value)


def _closing_brace(text: str) -> int:
    in_quotes = False
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "}" and not in_quotes:
            return i
    return -1
