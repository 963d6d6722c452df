"""Line numbers for keys in a TOML text, so that a config error can say where it is.

tomllib gives a line only for syntax errors. For errors found after parsing (an unknown
key, a wrong type, a deployment naming a missing node) we map the key's path, such as
("nodes", 1, "agent"), back to the line that wrote it. The scan understands table
headers, arrays of tables, dotted keys and inline tables; a path it cannot place falls
back to its nearest placed parent.
"""

from __future__ import annotations

import re

Path = tuple[str | int, ...]

_KEY = re.compile(
    r"""^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_-]+|"[^"]*")\s*=""")


def _split_dotted(name: str) -> list[str]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", name)
    return [p.strip("\"'") for p in parts]


def key_lines(text: str) -> dict[Path, int]:
    """Map each key path written in `text` to its 1-based line number."""
    lines: dict[Path, int] = {}
    counts: dict[Path, int] = {}  # array-of-tables path -> index of its last element

    def resolve(parts: list[str]) -> Path:
        path: Path = ()
        for part in parts:
            path = (*path, part)
            if path in counts:
                path = (*path, counts[path])
        return path

    current: Path = ()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            parts = _split_dotted(line[2 : line.find("]]")])
            array = (*resolve(parts[:-1]), parts[-1])
            counts[array] = counts.get(array, -1) + 1
            lines.setdefault(array, number)
            current = (*array, counts[array])
            lines[current] = number
        elif line.startswith("["):
            current = resolve(_split_dotted(line[1 : line.find("]")]))
            lines.setdefault(current, number)
        else:
            match = _KEY.match(line)
            if not match:
                continue
            path = (*current, *_split_dotted(match.group(1)))
            lines.setdefault(path, number)
            rest = line[match.end() :]
            for inner in _INLINE_KEY.finditer(rest):
                lines.setdefault((*path, inner.group(1).strip('"')), number)
    return lines


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of `path`, or of its nearest parent that has one; a table the file only
    made implicitly (`[[nodes.ssh]]` makes `nodes`) is placed at its first child."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    children = [n for key, n in lines.items() if key[: len(path)] == path and path]
    return min(children) if children else None


def format_path(path: Path) -> str:
    """("nodes", 1, "agent") -> "nodes[1].agent"."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
