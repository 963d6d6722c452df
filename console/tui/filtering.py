"""The `/` filter: plain text, or simple predicates on a row's named values.

    gpu-a            rows whose text contains "gpu-a" (case-insensitive)
    util>80          numeric comparison: > >= < <= = !=
    engine=triton    text equality (case-insensitive); engine~trt for "contains"
    util>80 engine=vllm     several terms: all must hold

A term naming a field the row lacks does not match; an unknown value (None) never
matches a comparison. Parse errors are worded for the command line.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_TERM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|!=|=|>|<|~)\s*(.+)$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "=": operator.eq,
    "!=": operator.ne,
}


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class Filter:
    text: str
    terms: tuple[tuple[str, str, str], ...]  # (field, op, value); field "" = free text

    def matches(self, fields: Mapping[str, Any], haystack: str) -> bool:
        return all(_term_matches(t, fields, haystack) for t in self.terms)


def parse_filter(text: str) -> Filter:
    terms = []
    for word in text.split():
        match = _TERM.match(word)
        if match is None:
            terms.append(("", "~", word.lower()))
            continue
        field, op, value = match.groups()
        if op in (">", ">=", "<", "<="):
            try:
                float(value)
            except ValueError:
                raise FilterError(f"{word}: {op} needs a number, got {value!r}") from None
        terms.append((field.lower(), op, value.lower()))
    return Filter(text, tuple(terms))


def _term_matches(term: tuple[str, str, str], fields: Mapping[str, Any], haystack: str) -> bool:
    field, op, value = term
    if not field:
        return value in haystack.lower()
    if field not in fields:
        return False
    actual = fields[field]
    if actual is None:
        return False
    if op == "~":
        return value in str(actual).lower()
    if isinstance(actual, int | float) and not isinstance(actual, bool):
        try:
            return _OPS[op](float(actual), float(value))
        except ValueError:
            return False
    if op in ("=", "!="):
        return _OPS[op](str(actual).lower(), value)
    return False
