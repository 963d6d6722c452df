"""What fleet.toml's names may hold, checked where the file is read (console.core.config.load).

Names travel into files other programs read (HAProxy's configuration, Prometheus' rules),
label values, URLs and terminals, so each kind allows only what it needs; the renderers
escape as well (docs/security.md). Each check is a pydantic field validator: a ValueError
becomes `fleet.toml:LINE: key: wants ...; got '...'`.

- model names, as Hugging Face and vLLM spell them: meta-llama/Llama-3.1-8B-Instruct,
  llama-3.1-70b, llama3:8b;
- ids (deployments, nodes, data planes): gpu-a1.dc1, llama-h200-a;
- HAProxy's own names (backend, server): what HAProxy allows in an identifier;
- paths and addresses given to HAProxy: anything printable but `$`, which HAProxy expands
  in an address however it is quoted;
- free text (the fleet's name, an engine's own model name): anything printable
  (console.core.safetext decides what is not).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from console.core.safetext import clean

_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
HAPROXY_CHARS = "A-Za-z0-9_.:-"  # HAProxy's identifier (its invalid_char())
_HAPROXY_NAME = re.compile(f"[{HAPROXY_CHARS}]{{1,128}}")
_UNIX_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _matching(pattern: re.Pattern[str], allowed: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        if value is not None and pattern.fullmatch(value) is None:
            raise ValueError(f"{allowed}; got {value!r}")
        return value

    return check


model_name = _matching(
    _MODEL_NAME, "wants letters, digits and . _ - : / @ + (first a letter or a digit)"
)
an_id = _matching(_ID, "wants letters, digits and . _ - : (first a letter or a digit)")
haproxy_name = _matching(_HAPROXY_NAME, "wants letters, digits and . _ - : (HAProxy's identifier)")
unix_user = _matching(_UNIX_USER, "wants a user or group name: letters, digits and . _ -")


def path(value: str | None) -> str | None:
    if value is not None and (not value or not clean(value) or "$" in value):
        raise ValueError(f"wants a path without control characters or '$'; got {value!r}")
    return value


def text(value: str | None) -> str | None:
    if value is not None and not clean(value):
        raise ValueError(f"wants text without control characters; got {value!r}")
    return value
