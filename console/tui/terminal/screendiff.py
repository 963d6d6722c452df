"""Write to the terminal only the cells whose shown text changed.

Textual's compositor writes every dirty region of a frame again, and sends each dirty
line of a widget from that widget's left edge (textual/_compositor.py,
`ChopsUpdate.render_segments` crops a line's chop at its right end only): a table row
whose UTIL changed went out again from its first column, every segment with its own
colours and a reset. Over an SSH link that was most of the bytes (issue 28: 244 kbit/s
at 1,000 nodes, idle on Fleet).

`ScreenDiff` keeps what the terminal shows, cell by cell (the character, its SGR
attributes and its OSC 8 link), reads each frame as Textual writes it, and writes only
the cells that differ: it moves the cursor over the cells that did not change and sets
attributes only where they change. The terminal ends each write with the cursor where
Textual put it and the attributes reset.

What it reads of a frame: cursor positions (CSI row;col H), SGR (CSI ... m), OSC 8 links,
text, CR and LF; Textual's frames are made of nothing else. Every other sequence goes
through as it came, in order. One that only sets a mode, asks the terminal something or
sets the title keeps what is known; any other (an erase, a scroll, the alternate screen,
a cursor move of another kind) makes every cell unknown, and an unknown cell is always
written. A terminal of another size shows cells nobody knows: all unknown again.
"""

from __future__ import annotations

import re
from itertools import groupby
from operator import itemgetter

from rich.cells import get_character_cell_size

# A segment as Textual writes one: SGR, text, reset; or text with no attributes.
_SEGMENT = r"\x1b\[([0-9;]*)m([^\x00-\x1f\x7f\x1b]*)\x1b\[0?m|([^\x00-\x1f\x7f\x1b]+)"
_SEGMENTS = re.compile(_SEGMENT)
# One token: a line as Textual writes one (a cursor position, then segments), a segment,
# a CSI sequence (parameters, intermediates, final byte), an OSC sequence (ended by BEL
# or ST), another escape, CR, LF, another C0 control, or a run of text.
_TOKEN = re.compile(
    r"\x1b\[([0-9]+);([0-9]+)H"
    r"((?:\x1b\[[0-9;]*m[^\x00-\x1f\x7f\x1b]*\x1b\[0?m|[^\x00-\x1f\x7f\x1b]+)+)"
    r"|\x1b\[([0-9;]*)m([^\x00-\x1f\x7f]+)\x1b\[0?m"
    r"|\x1b\[([0-?]*)([ -/]*)([@-~])"
    r"|\x1b\]([^\x07\x1b]*)(?:\x07|\x1b\\)"
    r"|(\x1b.?)"
    r"|(\r)|(\n)"
    r"|([\x00-\x1f\x7f])"
    r"|([^\x00-\x1f\x7f]+)",
    re.S,
)
# Private modes whose change leaves the screen as it is (mouse, focus, paste, sync...);
# the alternate screen (47, 1047, 1049) and the column mode (3) change what is shown.
_SCREEN_MODES = frozenset({"3", "47", "1047", "1049"})
_BRIDGE = 8  # at most this many unchanged cells are written again rather than skipped
_PENS = 4096  # SGR parameters remembered parsed; then forgotten and parsed again
_pen_of = itemgetter(1)

Cell = str | None  # a character (with any zero-width ones after it), "" for the right
# half of a wide one, None where what the terminal shows is not known


class ScreenDiff:
    """What the terminal shows, and the writes that change only what differs."""

    def __init__(self) -> None:
        self._chars: dict[int, list[Cell]] = {}  # row -> what each cell shows
        self._pens: dict[int, list[str | None]] = {}  # row -> each cell's attributes
        # This write's rows as they will be, and the cells it wrote on each [from, to).
        self._want_chars: dict[int, list[Cell]] = {}
        self._want_pens: dict[int, list[str | None]] = {}
        self._touched: dict[int, tuple[int, int]] = {}
        self.size: tuple[int, int] | None = None  # (columns, rows) the cells are for
        # Where Textual's stream has the cursor, and its attributes: a pen is the SGR
        # parameters, and "\x00" and the link's when in a link.
        self._at: tuple[int, int] | None = None  # (x, y)
        self._sgr = ""
        self._link = ""
        self._pen = ""
        self._sgr_after: dict[tuple[str, str], str] = {}  # (SGR, parameters) -> SGR then
        # Where our output left the terminal's cursor, and its attributes.
        self._out_at: tuple[int, int] | None = None
        self._out_pen = ""
        self._out: list[str] = []

    def reset(self) -> None:
        """Every cell unknown: the next frame writes all it draws."""
        self._chars.clear()
        self._pens.clear()
        self._out_at = None

    def resized(self, size: tuple[int, int] | None) -> None:
        """The terminal's size now: another than the cells are for makes them unknown."""
        if size != self.size:
            self.size = size
            self.reset()

    def row(self, y: int) -> str:
        """What row `y` shows, as far as known (unknown cells as spaces)."""
        return "".join(" " if c is None else c for c in self._chars.get(y, ()))

    def feed(self, data: str) -> str:
        """What to write instead of `data`, one write of Textual's."""
        out: list[str] = []
        self._out = out
        for match in _TOKEN.finditer(data):
            (
                line_y, line_x, line, seg_sgr, seg_text, csi_params, csi_mid, csi_final, osc,
                _, cr, lf, ctrl, text,
            ) = match.groups()  # fmt: skip
            if line is not None:
                if self._place(int(line_x) - 1, int(line_y) - 1):
                    self._line(line)
                else:
                    self._barrier(match.group(0))
            elif seg_text is not None:
                self._set_sgr(seg_sgr)
                self._text(seg_text)
                self._set_sgr("0")
            elif text is not None:
                self._text(text)
            elif csi_final is not None:
                self._csi(match.group(0), csi_params, csi_mid, csi_final)
            elif osc is not None:
                self._osc(match.group(0), osc)
            elif cr is not None:
                if self._at is not None:
                    self._at = (0, self._at[1])
            elif lf is not None:
                self._line_feed(lf)
            elif ctrl == "\x07":  # the bell: nothing on screen
                self._through(ctrl)
            else:  # another escape or control: it may move the cursor or change cells
                self._barrier(match.group(0))
        self._flush()
        self._settle()
        self._out = []
        return "".join(out)

    # reading Textual's stream
    def _place(self, x: int, y: int) -> bool:
        """The cursor to (x, y); False off the screen (what the shadow keeps is the
        terminal's size at most: what goes there is written as it came)."""
        x, y = max(0, x), max(0, y)
        if self.size is not None and (x >= self.size[0] or y >= self.size[1]):
            return False
        self._at = (x, y)
        return True

    def _csi(self, whole: str, params: str, mid: str, final: str) -> None:
        if final in "Hf" and not mid and not params.startswith("?"):
            row, _, col = params.partition(";")
            if not self._place(int(col or 1) - 1, int(row or 1) - 1):
                self._barrier(whole)
        elif final == "m" and not mid:
            self._set_sgr(params)
        elif final in "ABCDG" and not mid and (params.isdigit() or not params):
            self._move(final, int(params or 1))
        elif params.startswith("?") and final in "hl" and not mid:
            if _SCREEN_MODES.isdisjoint(params[1:].split(";")):
                self._through(whole)
            else:
                self._barrier(whole)
        elif (mid == "$" and final == "p") or final in "cnut" or (mid == " " and final == "q"):
            # a question to the terminal, the keyboard protocol, the window, the cursor's
            # shape: nothing on screen
            self._through(whole)
        else:
            self._barrier(whole)

    def _set_sgr(self, params: str) -> None:
        key = (self._sgr, params)
        sgr = self._sgr_after.get(key)
        if sgr is None:
            if len(self._sgr_after) >= _PENS:
                self._sgr_after.clear()
            sgr = self._sgr_after[key] = _sgr_after(self._sgr, params)
        self._sgr = sgr
        self._pen = sgr if not self._link else f"{sgr}\x00{self._link}"

    def _move(self, final: str, n: int) -> None:
        """A cursor move of another kind (Textual's frames have none; ours have CSI n C)."""
        if self._at is None:
            return
        x, y = self._at
        if final == "G":
            x = n - 1
        else:
            dx, dy = {"A": (0, -n), "B": (0, n), "C": (n, 0), "D": (-n, 0)}[final]
            x, y = x + dx, y + dy
        if self.size is not None:  # a terminal stops the cursor at its edges
            x, y = min(x, self.size[0] - 1), min(y, self.size[1] - 1)
        self._at = (max(0, x), max(0, y))

    def _osc(self, whole: str, body: str) -> None:
        if body.startswith("8;"):  # a link starts ("8;params;uri") or ends ("8;;")
            params, _, uri = body[2:].partition(";")
            self._link = f"{params};{uri}" if uri else ""
            self._pen = self._sgr if not self._link else f"{self._sgr}\x00{self._link}"
        else:  # the title, the pointer's shape, the clipboard: nothing on screen
            self._through(whole)

    def _line_feed(self, lf: str) -> None:
        at = self._at
        if at is None or self.size is None or at[1] + 1 >= self.size[1]:
            self._barrier(lf)  # at the bottom a line feed scrolls the screen
        else:
            self._at = (at[0], at[1] + 1)

    def _line(self, line: str) -> None:
        """A line of segments at a known place: its cells made at once, ASCII ones."""
        if self._sgr or self._link or not line.isascii():
            for match in _SEGMENTS.finditer(line):  # one segment at a time
                sgr, text, plain = match.groups()
                if plain is not None:
                    self._text(plain)
                else:
                    self._set_sgr(sgr)
                    self._text(text)
                    self._set_sgr("0")
            return
        cells: list[Cell] = []
        pens: list[str | None] = []
        after = self._sgr_after
        for sgr, text, plain in _SEGMENTS.findall(line):
            if plain:
                cells += plain
                pens += [""] * len(plain)
            else:
                pen = after.get(("", sgr))
                if pen is None:
                    pen = after[("", sgr)] = _sgr_after("", sgr)
                cells += text
                pens += [pen] * len(text)
        if not self._fits(len(cells)):
            self._barrier(line)
            return
        self._put(cells, pens, self._at[0] if self._at else 0)

    def _text(self, text: str) -> None:
        if self._at is None:  # text at a place we do not know: written as it came
            self._barrier(text)
            return
        x, y = self._at
        lo = x
        if text.isascii():
            cells: list[Cell] = list(text)
        else:
            cells = []
            for ch in text:
                width = get_character_cell_size(ch)
                if width == 0:  # a combining mark: part of the cell before
                    chars = self._row(y)[0]
                    if cells:
                        cells[-1] = f"{cells[-1]}{ch}"
                    elif 0 < x <= len(chars) and chars[x - 1]:
                        chars[x - 1] = f"{chars[x - 1]}{ch}"
                        lo = x - 1
                    continue
                cells.append(ch)
                cells.extend([""] * (width - 1))
        if not self._fits(len(cells)):
            self._barrier(text)
            return
        self._put(cells, [self._pen] * len(cells), lo)

    def _fits(self, cells: int) -> bool:
        """Whether `cells` at the cursor end within the screen's width."""
        return self.size is None or self._at is None or self._at[0] + cells <= self.size[0]

    def _row(self, y: int) -> tuple[list[Cell], list[str | None]]:
        """Row y as this write leaves it (so far)."""
        chars = self._want_chars.get(y)
        if chars is None:
            chars = self._want_chars[y] = list(self._chars.get(y, ()))
            self._want_pens[y] = list(self._pens.get(y, ()))
        return chars, self._want_pens[y]

    def _put(self, cells: list[Cell], cell_pens: list[str | None], lo: int) -> None:
        """`cells` and their pens written at the cursor; `lo`: the first cell changed
        (a combining mark changes the one before the cursor)."""
        assert self._at is not None
        x, y = self._at
        chars, pens = self._row(y)
        end = x + len(cells)
        if len(chars) < end + 1:
            chars.extend([None] * (end + 1 - len(chars)))
            pens.extend([None] * (end + 1 - len(pens)))
        # Half a wide character written over: the terminal blanks the other half.
        if cells and chars[x] == "" and x > 0:
            chars[x - 1] = None
        if chars[end] == "":
            chars[end] = None
        chars[x:end] = cells
        pens[x:end] = cell_pens
        was = self._touched.get(y)
        self._touched[y] = (lo, end + 1) if was is None else (min(was[0], lo), max(was[1], end + 1))
        self._at = (end, y)

    # writing what changed
    def _flush(self) -> None:
        """Write the cells of this write that differ from what the terminal shows."""
        for y in sorted(self._touched):
            lo, hi = self._touched[y]
            lo = max(0, lo - 1)  # the cell before may have lost half a wide character
            chars, pens = self._want_chars[y], self._want_pens[y]
            hi = min(hi, len(chars))
            old_chars = self._chars.setdefault(y, [])
            old_pens = self._pens.setdefault(y, [])
            if len(old_chars) < hi:
                old_chars.extend([None] * (hi - len(old_chars)))
                old_pens.extend([None] * (hi - len(old_pens)))
            if chars[lo:hi] != old_chars[lo:hi] or pens[lo:hi] != old_pens[lo:hi]:
                self._write_row(y, lo, hi, chars, pens, old_chars, old_pens)
                old_chars[lo:hi] = chars[lo:hi]
                old_pens[lo:hi] = pens[lo:hi]
        self._want_chars.clear()
        self._want_pens.clear()
        self._touched.clear()

    def _write_row(
        self,
        y: int,
        lo: int,
        hi: int,
        chars: list[Cell],
        pens: list[str | None],
        old_chars: list[Cell],
        old_pens: list[str | None],
    ) -> None:
        changed = [
            x
            for x, new, old, pen, old_pen in zip(
                range(lo, hi),
                chars[lo:hi],
                old_chars[lo:hi],
                pens[lo:hi],
                old_pens[lo:hi],
                strict=True,
            )
            if new is not None and (new != old or pen != old_pen)
        ]
        runs: list[list[int]] = []  # [from, to) of cells to write
        for x in changed:
            if runs and x <= runs[-1][1]:
                if x == runs[-1][1] and chars[x] != "":
                    runs[-1][1] = x + 1
                    if x + 1 < len(chars) and chars[x + 1] == "":
                        while runs[-1][1] < len(chars) and chars[runs[-1][1]] == "":
                            runs[-1][1] += 1
                continue  # or written with the wide character it is the right half of
            start = x
            while start > 0 and chars[start] == "":
                start -= 1  # the right half of a wide character: from its left half
            if chars[start] in (None, ""):
                continue  # half of a character nobody drew: nothing to write
            end = x + 1
            while end < len(chars) and chars[end] == "":
                end += 1
            if runs and start == runs[-1][1]:
                runs[-1][1] = end
            else:
                runs.append([start, end])
        out = self._out
        for start, end in runs:
            at = self._out_at
            gap = start - at[0] if at is not None and at[1] == y else -1
            if gap > 0 and not (gap <= _BRIDGE and self._bridged(chars, pens, start - gap, start)):
                out.append(f"\x1b[{gap}C" if gap > 1 else "\x1b[C")
            elif gap < 0:
                out.append(f"\x1b[{y + 1};{start + 1}H")
            self._cells(chars, pens, start, end)
            self._out_at = (end, y)

    def _bridged(self, chars: list[Cell], pens: list[str | None], a: int, b: int) -> bool:
        """Write cells [a, b) again, unchanged, when that costs less than moving the
        cursor over them; whether it did."""
        if chars[a] == "" or None in chars[a:b]:
            return False
        pen, cost = self._out_pen, 0
        for char, at in zip(chars[a:b], pens[a:b], strict=True):
            cost += len(_switch(pen, at or "")) + len(char or "")
            pen = at or ""
        to = pens[b] or ""
        if cost + len(_switch(pen, to)) > 4 + len(_switch(self._out_pen, to)):  # CSI n C
            return False
        self._cells(chars, pens, a, b)
        return True

    def _cells(self, chars: list[Cell], pens: list[str | None], a: int, b: int) -> None:
        """Write cells [a, b), each run of one pen at once."""
        out = self._out
        for pen, cells in groupby(zip(chars[a:b], pens[a:b], strict=True), _pen_of):
            if (pen or "") != self._out_pen:
                out.append(_switch(self._out_pen, pen or ""))
                self._out_pen = pen or ""
            out.append("".join([" " if char is None else char for char, _ in cells]))

    def _settle(self) -> None:
        """Leave the terminal's cursor where Textual put it, with no attributes set."""
        if self._out_pen:
            self._out.append(_switch(self._out_pen, ""))
            self._out_pen = ""
        if self._at is not None and self._out_at != self._at:
            x, y = self._at
            self._out.append(f"\x1b[{y + 1};{x + 1}H")
            self._out_at = self._at

    def _through(self, sequence: str) -> None:
        """A sequence that changes nothing on screen: written in its place."""
        self._flush()
        self._settle()
        self._out.append(sequence)

    def _barrier(self, sequence: str) -> None:
        """A sequence that may change cells or move the cursor: written in its place, with
        the terminal's cursor and attributes as Textual's stream has them; after it,
        nothing on screen is known."""
        self._flush()
        self._settle()
        if self._pen:
            self._out.append(_switch("", self._pen))
            self._out_pen = self._pen
        self._out.append(sequence)
        self.reset()
        self._at = None


def _sgr_after(sgr: str, params: str) -> str:
    """The SGR set after `params` on `sgr`: they add to it; 0 (or nothing) resets. Textual
    writes each segment as its SGR, its text and a reset."""
    fields = params.split(";")
    kept = sgr.split(";") if sgr else []
    i = 0
    while i < len(fields):
        field = fields[i]
        if field in ("38", "48", "58") and i + 1 < len(fields):  # a colour's arguments
            n = {"5": 3, "2": 5}.get(fields[i + 1], 1)
            kept.extend(fields[i : i + n])
            i += n
            continue
        if field in ("", "0"):
            kept = []
        else:
            kept.append(field)
        i += 1
    return ";".join(kept)


def _switch(pen: str, to: str) -> str:
    """What sets the terminal's attributes and link from `pen`'s to `to`'s."""
    if pen == to:
        return ""
    sgr, _, link = pen.partition("\x00")
    to_sgr, _, to_link = to.partition("\x00")
    out = ""
    if to_sgr != sgr:
        out = f"\x1b[0;{to_sgr}m" if to_sgr else "\x1b[0m"
    if to_link != link:
        out += f"\x1b]8;{to_link}\x1b\\" if to_link else "\x1b]8;;\x1b\\"
    return out
