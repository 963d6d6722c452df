"""The recording's format: its frame header, its bounds, the typed schema every record and
event is decoded against, and the per-node diffs (docs/recording.md has the file format;
console/collect/recordings/reader.py reads it, writer.py writes it).

A recording is outside text: someone else's file. The schema says what each record may
hold, and the MAX_ names bound what a reader inflates and holds (docs/security.md); the
writer keeps within the same bounds, so what it wrote always reads.
"""

from __future__ import annotations

import itertools
import re
import struct
from array import array
from typing import Annotated, Any

import msgspec

from console.core.snapshot import Percentiles

MAGIC = b"ERF1"
HEADER = struct.Struct(">4sBIddI")
HEAD, KEY, MORE, EVENTS = 1, 2, 3, 4
FORMAT = "engineroom-recording"
VERSION = 1

# What a reader takes from a file, whatever the file says (docs/security.md). The writer
# (recording_writer.Sink) keeps within the same bounds, so what it wrote always reads.
MAX_FRAME_BYTES = 64 * 2**20  # one frame's payload as stored; more is a torn or foreign file
MAX_HEAD_BYTES = 8 * 2**20  # the header frame: the settings and the fleet file
MAX_FRAMES = 4_000_000  # indexed on open, 29 bytes each: 46 days at a frame a second
MAX_INFLATED_FRAME = 32 * 2**20  # one frame's payload, inflated
MAX_INFLATED_BLOCK = 64 * 2**20  # a keyframe and its MOREs, inflated: what a cursor holds
# JSON values in a block (its commas, brackets and braces): what the block takes decoded,
# at most about 72 bytes each (an empty object in a list), whatever its bytes say.
MAX_BLOCK_VALUES = 4_000_000
MAX_RECORD_BYTES = 17 * 2**20  # one record: a snapshot (the collector takes 16 MiB) and more
MAX_EVENTS = 100_000  # alerts, actions and gaps in a file (all held once it is open)
MAX_EVENTS_PER_FRAME = 10_000
MAX_EVENTS_INFLATED = 64 * 2**20  # every EVENTS frame of a file together, inflated
MAX_EVENT_BYTES = 256 * 2**10  # one event
MAX_TEXT = 4096  # characters in a node's name, a status, an error, an event's field
MAX_DIFF_DEPTH = 64  # diffs nest no deeper; a deeper change is written whole
MAX_VALUE_DEPTH = 128  # a snapshot or an event, as the sink takes it (agents' configs)
# A record: its envelope, a diff's 64 levels (two a level) and what it replaces whole.
MAX_RECORD_DEPTH = 2 * MAX_DIFF_DEPTH + MAX_VALUE_DEPTH
MAX_TIME = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC, the last moment a date can show


class RecordingError(Exception):
    """The file is not a recording, or not one this version reads, or breaks its schema
    or a bound; says which file, where and why."""


class Malformed(Exception):
    """Inside the reader: what is wrong, before the reader adds the file and where."""


# -- the schema ---------------------------------------------------------------------------

Time = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]


class Which(msgspec.Struct, gc=False):
    """What a header says it is, read before the rest (another version may differ)."""

    format: object = None
    version: object = None


class Head(msgspec.Struct, gc=False):
    format: str
    version: int
    started: Time
    by: Text = "record"
    keyframe_s: Annotated[float, msgspec.Meta(gt=0.0, le=86400.0)] = 20.0
    flush_s: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 1.0
    fleet_source: Text = "fleet.toml"
    fleet_text: str = ""


class Change(msgspec.Struct, gc=False, omit_defaults=True):
    """A per-node diff: {"s": {key: new value}, "p": {key: nested diff}, "d": [removed]}."""

    s: dict[str, Any] = {}
    p: dict[str, Change] = {}
    d: list[str] = []


class _Record(msgspec.Struct, tag_field="k", gc=False):
    t: Time


class Snap(_Record, tag="snap"):
    """A node's whole snapshot (`key`: a keyframe's copy, `seen`: when the node sent it)."""

    n: Text
    v: dict[str, Any]
    key: bool = False
    seen: Time | None = None


class Diff(_Record, tag="diff"):
    """A node's snapshot as a change to its last (empty: it sent the same again)."""

    n: Text
    v: Change


class NodeStatus(_Record, tag="node"):
    n: Text
    status: Text | None = None
    error: Text | None = None


class GatewaySnap(_Record, tag="gw"):
    v: dict[str, Any]


class GatewayDiff(_Record, tag="gwd"):
    v: Change


class RolloutsSnap(_Record, tag="ro"):
    """The gateway's rollouts as the console read them (recording_rollouts.Rollouts)."""

    v: dict[str, Any]


class RolloutsDiff(_Record, tag="rod"):
    v: Change


Record = Snap | Diff | NodeStatus | GatewaySnap | GatewayDiff | RolloutsSnap | RolloutsDiff


class Event(msgspec.Struct, gc=False, omit_defaults=True):
    t: Time
    kind: Text
    severity: Text | None = None
    subject: Text | None = None
    message: Text | None = None
    who: Text | None = None
    why: Text | None = None
    node: Text | None = None
    job: Text | None = None
    source: Text | None = None


class _Deployment(msgspec.Struct, gc=False):
    """What the screens read of a deployment in the gateway's snapshot."""

    weight: int | float | None = None
    up: bool = True
    reason: str | None = None
    inflight: int | float | None = None
    error_rate: float | None = None
    ttft_s: Percentiles | None = None
    itl_s: Percentiles | None = None
    e2e_s: Percentiles | None = None


class GatewayShape(msgspec.Struct, gc=False):
    time: float | None = None
    models: dict[str, dict[str, _Deployment]] = {}


decode_head = msgspec.json.Decoder(Head).decode
decode_which = msgspec.json.Decoder(Which).decode
decode_record = msgspec.json.Decoder(Record).decode
decode_event = msgspec.json.Decoder(Event).decode


def one_line(exc: Exception) -> str:
    """A decoder's complaint as one printable line (it may quote the file's own text)."""
    text = str(exc) or exc.__class__.__name__
    text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    return text if len(text) <= 300 else text[:300] + "..."


def decode_line(decode: Any, line: bytes) -> Any:
    try:
        return decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Malformed(one_line(exc)) from None
    except RecursionError:
        raise Malformed("nested too deep") from None


def json_values(line: bytes) -> int:
    """About how many values a line of JSON decodes to (commas inside strings count too:
    an overestimate), at the cost of three byte scans rather than a decode."""
    return line.count(b",") + json_openers(line)


def json_openers(line: bytes) -> int:
    """Brackets and braces that open: no line nests deeper than this."""
    return line.count(b"{") + line.count(b"[")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(line: bytes) -> int:
    """How deep a line of JSON nests, without decoding it (msgspec has no depth bound, and
    the depth it reaches depends on the caller's stack): strings out, then the running
    sum of its brackets, all at C speed. For the lines that json_openers cannot clear."""
    signs = array("b", _STRING.sub(b"", line).translate(_SIGNS, _NOT_BRACKET))
    return max(itertools.accumulate(signs), default=0)


# -- per-node diffs: {"s": {key: new value}, "p": {key: nested diff}, "d": [removed keys]} -


def diff(old: Any, new: Any, depth: int = 0) -> dict[str, Any] | None:
    """What turns `old` into `new`; None when they are equal or the caller should replace
    the value whole. Lists of the same length are diffed element by element (a GPU's
    utilization changes, not the GPU list). Deeper than MAX_DIFF_DEPTH the value is
    replaced whole: a hostile config nested a thousand deep must not end the recording."""
    if old == new or depth >= MAX_DIFF_DEPTH:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        items_new, items_old = new.items(), old
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        items_new = ((str(i), v) for i, v in enumerate(new))  # type: ignore[assignment]
        items_old = {str(i): v for i, v in enumerate(old)}
    else:
        return None  # the caller replaces the value whole
    out: dict[str, Any] = {}
    for key, value in items_new:
        if key not in items_old:
            out.setdefault("s", {})[key] = value
        elif items_old[key] != value:
            sub = diff(items_old[key], value, depth + 1)
            if sub is None:
                out.setdefault("s", {})[key] = value
            else:
                out.setdefault("p", {})[key] = sub
    if isinstance(new, dict):
        gone = [k for k in old if k not in new]
        if gone:
            out["d"] = gone
    return out


def _index_of(key: str, items: list[Any]) -> int | None:
    try:
        i = int(key)
    except ValueError:
        return None
    return i if str(i) == key and 0 <= i < len(items) else None


def misfit(value: Any, change: Change, depth: int = 0) -> str | None:
    """Why `change` cannot be applied to `value` (None: it can). Checked before `patch`
    touches anything, so a bad diff leaves the state as it was."""
    if depth > MAX_DIFF_DEPTH:
        return f"a diff nested deeper than {MAX_DIFF_DEPTH}"
    if isinstance(value, list):
        if change.d:
            return "a diff removes keys from a list"
        for key in itertools.chain(change.s, change.p):
            if _index_of(key, value) is None:
                return f"a diff names item {key[:40]!r} of a list of {len(value)}"
    elif not isinstance(value, dict):
        return f"a diff applied to a {type(value).__name__}"
    for key, sub in change.p.items():
        # A list's index is in range: checked above.
        inner = value[int(key)] if isinstance(value, list) else value.get(key)
        if not isinstance(inner, dict | list):
            return f"a diff goes into {key[:40]!r}, which holds no object or list"
        if (why := misfit(inner, sub, depth + 1)) is not None:
            return why
    return None


def patch(value: Any, change: Change) -> Any:
    """`diff`'s inverse, in place: `value` becomes the new value (and is returned). The
    change must fit (`misfit` is None)."""
    is_list = isinstance(value, list)
    for key, v in change.s.items():
        value[int(key) if is_list else key] = v
    for key, sub in change.p.items():
        k = int(key) if is_list else key
        value[k] = patch(value[k], sub)
    for key in change.d:
        value.pop(key, None)
    return value
