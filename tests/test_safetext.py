"""The one sanitizer for outside text on a terminal and in Markdown (issue 27, defect 6).

The paths that use it are tested with real parts in tests/test_escape_injection.py; this
is the function itself: what it neutralizes, what it leaves alone, and a property over
any text."""

from __future__ import annotations

import re
import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from console.core.safetext import (
    clean,
    for_markdown_cell,
    for_terminal,
    markdown_block,
    markdown_code,
)

HOSTILE = {
    "ESC": "a\x1bb",
    "OSC title": "\x1b]0;title\x07",
    "OSC link": "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\",
    "CSI clear": "\x1b[2J",
    "CSI colour": "\x1b[31mred",
    "8-bit CSI": "\x9b2J",
    "8-bit OSC": "\x9d0;title\x9c",
    "CR": "ok\rFAIL",
    "bidi override": "rtl\u202egnp.exe",
    "bidi isolate": "a\u2066b\u2069",
    "LRM": "a\u200eb",
    "ALM": "a\u061cb",
    "ZWSP": "a\u200bb",
    "ZWJ": "a\u200db",
    "word joiner": "a\u2060b",
    "BOM": "a\ufeffb",
    "DEL": "a\x7fb",
    "NUL": "a\x00b",
    "tag": "a\U000e0041b",
    "line separator": "a\u2028b",
    "variation selector": "a\ufe0fb",
    "Hangul filler": "a\u3164b",
    "lone surrogate": "a\udc80b",
}


def _unsafe(ch: str, lines: bool = False) -> bool:
    """The property's own definition, from the Unicode database: what must never reach
    the output."""
    if lines and ch in "\n\t":
        return False
    return (
        unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        or ch in "\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0"
        or "\u180b" <= ch <= "\u180f"
        or "\ufe00" <= ch <= "\ufe0f"
        or "\U000e0100" <= ch <= "\U000e01ef"
    )


def test_each_hostile_character_becomes_its_escape_never_dropped():
    for what, text in HOSTILE.items():
        shown = for_terminal(text)
        assert not any(_unsafe(ch) for ch in shown), what
        assert shown.isascii() and shown.isprintable(), (what, shown)
    assert for_terminal("ok\rFAIL") == "ok\\rFAIL"
    assert for_terminal("a\u200bb") == "a\\u200bb"  # not "ab"
    assert for_terminal("\x1b]0;t\x07") == "\\x1b]0;t\\x07"
    assert for_terminal("\x9b2J") == "\\x9b2J"
    assert for_terminal("rtl\u202egnp") == "rtl\\u202egnp"


def test_one_line_unless_asked():
    assert for_terminal("a\nb\tc") == "a\\nb\\tc"
    assert for_terminal("a\nb\tc\x1b", lines=True) == "a\nb\tc\\x1b"
    assert for_terminal("a\r\nb", lines=True) == "a\\r\nb"


def test_ordinary_text_passes_unchanged():
    for text in (
        "node-01.example",
        "vllm 0.11.0",
        "ノード一",
        "café",
        "e\u0301",
        "Ωμέγα",
        "a b",
        "",
    ):
        assert clean(text) and for_terminal(text) == text


def test_every_unsafe_character_of_this_pythons_unicode_is_neutralized():
    """The fast path (isprintable) and the slow one agree on every code point."""
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if _unsafe(ch):
            assert not clean(ch), hex(code)
            assert not any(_unsafe(c) for c in for_terminal(ch)), hex(code)
        elif ch.isprintable():
            assert for_terminal(ch) == ch, hex(code)


@given(st.text())
def test_the_output_never_holds_a_control_bidi_or_invisible_character(text):
    for lines in (False, True):
        shown = for_terminal(text, lines)
        assert not any(_unsafe(ch, lines) for ch in shown)
        if not any(_unsafe(ch, lines) for ch in text):
            assert shown == text
    assert "\n" not in for_markdown_cell(text) and "\r" not in for_markdown_cell(text)


LETTERS = st.text(
    st.characters(categories=("Lu", "Ll", "Lt", "Lo", "Nd", "Mn", "Pd", "Zs")).filter(
        lambda c: not _unsafe(c)
    )
)


@given(LETTERS)
def test_letters_of_any_script_pass_unchanged(text):
    assert for_terminal(text) == text


@given(st.text())
def test_a_markdown_cell_stays_one_escaped_cell(text):
    cell = for_markdown_cell(text)
    assert "\n" not in cell and not any(_unsafe(ch) for ch in cell)
    # Every structural character is escaped: an odd run of backslashes before it.
    for m in re.finditer(r"[`*_\[\]<>&|~$]", cell):
        run = len(cell[: m.start()]) - len(cell[: m.start()].rstrip("\\"))
        assert run % 2 == 1, (text, cell)


def test_markdown_cell_escapes_structure():
    assert for_markdown_cell("a|b") == "a\\|b"
    assert for_markdown_cell("`x`") == "\\`x\\`"
    assert for_markdown_cell("[click](http://evil)") == "\\[click\\](http://evil)"
    assert for_markdown_cell("<img src=x>") == "\\<img src=x\\>"
    assert for_markdown_cell("&#x202e;") == "\\&#x202e;"
    assert for_markdown_cell("ok\rFAIL\nnext") == "ok\\\\rFAIL\\\\nnext"
    assert for_markdown_cell("vllm-8000 0.11.0") == "vllm-8000 0.11.0"
    assert for_markdown_cell(None) == "None"


def test_code_spans_and_blocks_cannot_be_closed_from_inside():
    assert markdown_code("abc") == "`abc`"
    assert markdown_code("a``b") == "```a``b```"
    assert markdown_code("`x") == "`` `x ``"
    assert markdown_code("a\x1bb") == "`a\\x1bb`"
    block = markdown_block(["ok", "```", "````", "\x1b[2J\tx"])
    assert block[0] == block[-1] == "`````"
    assert block[1:-1] == ["ok", "```", "````", "\\x1b[2J\tx"]
    assert markdown_block(["one"]) == ["```", "one", "```"]
