"""The `/` filter: plain text, or simple predicates on a row's named values.

    gpu-a            rows whose text contains "gpu-a" (case-insensitive)
    util>80          numeric comparison: > >= < <= = !=
    engine=triton    text equality (case-insensitive); engine~trt for "contains"
    util>80 engine=vllm     several terms: all must hold

A term naming a field the row lacks does not match; an unknown value (None) never
matches a comparison. Parse errors are worded for the command line. Spaces around an
operator are allowed (`util > 80`). Each draw counts the rows tried and kept and the
fields the table has, so the screen can say "0 of 32 rows match" or "no field 'foo'".
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_SPACED_OP = re.compile(r"\s*(>=|<=|!=|=|>|<|~)\s*")
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


@dataclass
class Tally:
    """What one draw's filtering saw: rows tried and kept, and the fields of the rows."""

    tried: int = 0
    kept: int = 0
    fields: frozenset[str] | None = None  # the first row's; None: no row was tried


@dataclass(frozen=True)
class Filter:
    text: str
    terms: tuple[tuple[str, str, str], ...]  # (field, op, value); field "" = free text
    tally: Tally = field(default_factory=Tally, compare=False)

    def matches(self, fields: Mapping[str, Any], haystack: str) -> bool:
        tally = self.tally
        if tally.fields is None:
            tally.fields = frozenset(fields)
        tally.tried += 1
        kept = all(_term_matches(t, fields, haystack) for t in self.terms)
        tally.kept += kept
        return kept

    def start_draw(self) -> None:
        self.tally.tried = self.tally.kept = 0
        self.tally.fields = None

    def unknown_fields(self) -> list[str]:
        """Fields the terms name that the table's rows do not have (none known: none)."""
        have = self.tally.fields
        if have is None:
            return []
        return sorted({f for f, _, _ in self.terms if f and f not in have})

    def counted(self) -> str:
        """ "3 of 32 rows match", for the header."""
        return f"{self.tally.kept} of {self.tally.tried} rows match"


def parse_filter(text: str) -> Filter:
    terms = []
    for word in _SPACED_OP.sub(r"\1", text).split():
        match = _TERM.match(word)
        if match is None:
            if _SPACED_OP.search(word):  # `temp>`, `>80`: an operator without its two sides
                raise FilterError(f"{word}: write FIELD OP VALUE, such as util>80 or engine=vllm")
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
