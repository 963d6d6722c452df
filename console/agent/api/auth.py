"""Bearer tokens in two roles, viewer and operator, read from the environment.

Each variable holds one or more entries, comma-separated. An entry is `TOKEN` or
`NAME:TOKEN`; the name is what the audit log records (a token is never written
anywhere), and an unnamed token is recorded as `viewer-1`, `operator-2`, ...

- NAME: a letter, then letters, digits, `_`, `.`, `-`; at most 32 characters.
- TOKEN: at least 8 characters, no `:`, `,` or whitespace.

An entry that could be read two ways (two `:`, or a part before `:` that is not a
name) is refused at startup, naming the variable and the entry's place but never the
value: silently splitting a token that happened to contain `:` would both change the
token and write its first part to the audit log as a name. The same token twice, or
one name for two tokens, is refused as well. Every presented token is compared with
every known one in constant time.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from console.core.config.load import (
    DEFAULT_ADMIN_ENV,
    DEFAULT_GATEWAY_VIEWER_ENV,
    DEFAULT_OPERATOR_ENV,
    DEFAULT_VIEWER_ENV,
    Fleet,
)

Role = Literal["viewer", "operator"]
TOKEN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")
MIN_TOKEN_CHARS = 8
FORMAT = "comma-separated entries, each TOKEN or NAME:TOKEN; a token holds no ':' ',' or spaces"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role

    def can(self, role: Role) -> bool:
        return role == "viewer" or self.role == "operator"


@dataclass(frozen=True, slots=True)
class _Token:
    secret: bytes
    principal: Principal


class TokenError(Exception):
    pass


class Tokens:
    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens

    @classmethod
    def from_env(
        cls, viewer_env: str, operator_env: str, environ: Mapping[str, str] | None = None
    ) -> Tokens:
        """The tokens of both variables; TokenError naming the variable and the entry (never
        its value) for anything that does not read one way only."""
        env = os.environ if environ is None else environ
        tokens: list[_Token] = []
        where: list[str] = []  # "VAR entry N", alongside tokens
        for var, role in ((viewer_env, "viewer"), (operator_env, "operator")):
            entries = [t.strip() for t in env.get(var, "").split(",")]
            if entries == [""]:
                continue
            for n, entry in enumerate(entries, 1):
                token = _parse(var, n, entry, role)  # type: ignore[arg-type]
                for other, seen in zip(where, tokens, strict=True):
                    if hmac.compare_digest(seen.secret, token.secret):
                        raise TokenError(f"{var} entry {n}: the same token as {other}")
                    if seen.principal.name == token.principal.name:
                        raise TokenError(
                            f"{var} entry {n}: the name {token.principal.name!r} is "
                            f"already {other}'s; the audit log could not tell them apart"
                        )
                tokens.append(token)
                where.append(f"{var} entry {n}")
        if not tokens:
            raise TokenError(f"no tokens: set {viewer_env} and/or {operator_env} ({FORMAT})")
        return cls(tokens)

    def check(self, presented: str) -> Principal | None:
        """The principal whose token this is, or None. Compares with every token."""
        given = presented.encode()
        match: Principal | None = None
        for token in self._tokens:
            if hmac.compare_digest(given, token.secret) and match is None:
                match = token.principal
        return match


def _parse(var: str, n: int, entry: str, role: Role) -> _Token:
    here = f"{var} entry {n}"
    if not entry:
        raise TokenError(f"{here} is empty (a stray ','?); {FORMAT}")
    if any(c.isspace() for c in entry):
        raise TokenError(f"{here} holds whitespace; {FORMAT}")
    parts = entry.split(":")
    if len(parts) > 2:
        raise TokenError(f"{here} holds more than one ':', so it reads more than one way; {FORMAT}")
    if len(parts) == 2:
        name, secret = parts
        if not TOKEN_NAME.match(name):
            raise TokenError(
                f"{here}: the part before ':' is not a name (a letter, then letters, digits, "
                f"_ . -, at most 32), so it reads more than one way; {FORMAT}"
            )
    else:
        name, secret = f"{role}-{n}", entry
    if len(secret) < MIN_TOKEN_CHARS:
        raise TokenError(f"{here}: the token is shorter than {MIN_TOKEN_CHARS} characters")
    return _Token(secret.encode(), Principal(name, role))


def secret_env_names(fleet: Fleet) -> set[str]:
    """Every environment variable the fleet file names as holding a token or a key."""
    names = {
        DEFAULT_VIEWER_ENV,
        DEFAULT_OPERATOR_ENV,
        DEFAULT_ADMIN_ENV,
        DEFAULT_GATEWAY_VIEWER_ENV,
        fleet.agent.viewer_token_env,
        fleet.agent.operator_token_env,
    }
    names |= {n.token_env for n in fleet.nodes if n.token_env}
    names |= {d.token_env for d in fleet.dataplanes if d.token_env}  # the vLLM router's key
    if fleet.gateway is not None:
        names.add(fleet.gateway.token_env)
        names.add(fleet.gateway.viewer_token_env)
        if fleet.gateway.api_keys_env:
            names.add(fleet.gateway.api_keys_env)
    if (prometheus := fleet.prometheus) is not None:
        credentials = (prometheus.token_env, prometheus.username_env, prometheus.password_env)
        names |= {name for name in credentials if name}
    return names


def child_env(fleet: Fleet, *extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for a process the agent starts (an engine, a drill step): the
    agent's own, minus every token variable, plus `extra`. Engines never see the tokens."""
    secret = secret_env_names(fleet)
    env = {k: v for k, v in os.environ.items() if k not in secret}
    for more in extra:
        env.update(more)
    return env
