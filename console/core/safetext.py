"""Outside text made safe to show: on a terminal, and in Markdown.

Label values, node, engine and model names, engine answers, job logs and recordings are
written by whoever controls an exporter, an engine or a file. Shown raw, an ESC starts a
terminal sequence (retitle the window, clear the screen, hide the lines after it, a link
that is not what it says); a CR goes back to the start of the line and writes over it;
a bidi override reorders what follows; a zero-width character makes two names look the
same. Textual and Rich strip only BEL, BS, VT, FF and CR, so ESC and the rest get through.

Each such character is shown as its Python escape (`\\x1b`, `\\r`, `\\u202e`), never
dropped, so that "a", ZWSP, "b" does not read as "ab". The marker is plain ASCII, which no
terminal and no Markdown reads as a sequence.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from typing import TextIO

# Controls (C0, DEL, C1), format characters (bidi, zero-width, BOM, soft hyphen, tags),
# lone surrogates (which cannot even be printed), and the line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Characters that draw nothing but are not classed as format: the combining grapheme
# joiner, the Hangul fillers, the Khmer inherent vowels, the Mongolian variation selectors
# and the variation selectors.
_INVISIBLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
_KEPT_IN_LINES = frozenset("\n\t")  # a multi-line text (a log) keeps its lines and tabs


def _unsafe(ch: str, lines: bool) -> bool:
    if lines and ch in _KEPT_IN_LINES:
        return False
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES or _INVISIBLE.match(ch) is not None


def clean(text: str, lines: bool = False) -> bool:
    """True when `text` holds nothing to neutralize. This is the fast path: most names are
    printable ASCII, and a table cell asks for each row drawn."""
    if text.isprintable():  # no Cc, Cf, Cs, Zl, Zp (nor Zs other than the space)
        return text.isascii() or _INVISIBLE.search(text) is None
    return not any(_unsafe(ch, lines) for ch in text)


def marker(ch: str) -> str:
    """What stands in for `ch` on screen: `\\x1b`, `\\r`, `\\x9b`, `\\u202e`, `\\U000e0041`."""
    return ch.encode("unicode_escape").decode("ascii")


def marks(text: str, lines: bool = False) -> list[tuple[int, str]]:
    """Where `text` must change: (index, marker) for each character to neutralize, in
    order; empty when it is clean."""
    if clean(text, lines):
        return []
    return [(i, marker(ch)) for i, ch in enumerate(text) if _unsafe(ch, lines)]


def for_terminal(text: str, lines: bool = False) -> str:
    """`text` with every control, bidi, zero-width and invisible character shown as its
    escape. One line unless `lines`: then newlines and tabs stay (a log, a detail pane)."""
    found = marks(text, lines)
    if not found:
        return text
    out: list[str] = []
    last = 0
    for i, mark in found:
        out += (text[last:i], mark)
        last = i + 1
    out.append(text[last:])
    return "".join(out)


def say(text: str, file: TextIO | None = None, lines: bool = False) -> None:
    """print() for a line that holds outside text (stdout by default), made safe first."""
    print(for_terminal(text, lines), file=sys.stdout if file is None else file, flush=True)


# What changes Markdown's structure inline: the escape itself, code spans, emphasis and
# strikethrough, links and images, autolinks and HTML, entities (`&#x202e;` is a bidi
# override again), table cells, and GitHub's math.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>&|~$])")


def for_markdown_cell(text: object) -> str:
    """`text` as one line of inline Markdown (a table cell, a list item, a sentence): the
    terminal's neutralizing, newlines included, then every character that could end a
    cell, open a code span, a link, HTML or an entity escaped with a backslash."""
    return _MARKDOWN.sub(r"\\\1", for_terminal(str(text)))


def markdown_code(text: object) -> str:
    """`text` as an inline code span (not for a table cell: a `|` in a span still ends
    one). Backslashes do not escape in a span, so the fence is longer than any run of
    backticks in it."""
    body = for_terminal(str(text))
    ticks = "`" * (max(map(len, re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def markdown_block(lines: list[object]) -> list[str]:
    """`lines` as a fenced code block, fence lines included: each line neutralized (tabs
    kept), the fence longer than any run of backticks, so no line can close it."""
    body = [for_terminal(str(line), lines=True).replace("\n", marker("\n")) for line in lines]
    longest = max((len(run) for line in body for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]
