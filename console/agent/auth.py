"""Bearer tokens in two roles, viewer and operator, read from the environment.

Each variable may hold several tokens, comma-separated, each optionally named
(`alice:TOKEN`), so the audit log can say who acted without ever holding the token.
Every presented token is compared with every known one in constant time.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from console.core.config import (
    DEFAULT_ADMIN_ENV,
    DEFAULT_OPERATOR_ENV,
    DEFAULT_VIEWER_ENV,
    Fleet,
)

Role = Literal["viewer", "operator"]


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
        env = os.environ if environ is None else environ
        tokens: list[_Token] = []
        for var, role in ((viewer_env, "viewer"), (operator_env, "operator")):
            entries = [t.strip() for t in env.get(var, "").split(",") if t.strip()]
            for n, entry in enumerate(entries, 1):
                name, sep, secret = entry.partition(":")
                if not sep:
                    name, secret = f"{role}-{n}", entry
                if len(secret) < 8:
                    raise TokenError(f"{var}: token {n} is shorter than 8 characters")
                tokens.append(_Token(secret.encode(), Principal(name, role)))  # type: ignore[arg-type]
        if not tokens:
            raise TokenError(
                f"no tokens: set {viewer_env} and/or {operator_env} "
                "(comma-separated; NAME:TOKEN names a token for the audit log)"
            )
        return cls(tokens)

    def check(self, presented: str) -> Principal | None:
        """The principal whose token this is, or None. Compares with every token."""
        given = presented.encode()
        match: Principal | None = None
        for token in self._tokens:
            if hmac.compare_digest(given, token.secret) and match is None:
                match = token.principal
        return match


def secret_env_names(fleet: Fleet) -> set[str]:
    """Every environment variable the fleet file names as holding a token or a key."""
    names = {
        DEFAULT_VIEWER_ENV,
        DEFAULT_OPERATOR_ENV,
        DEFAULT_ADMIN_ENV,
        fleet.agent.viewer_token_env,
        fleet.agent.operator_token_env,
    }
    names |= {n.token_env for n in fleet.nodes if n.token_env}
    if fleet.gateway is not None:
        names.add(fleet.gateway.token_env)
        if fleet.gateway.api_keys_env:
            names.add(fleet.gateway.api_keys_env)
    return names


def child_env(fleet: Fleet, *extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for a process the agent starts (an engine, a drill step): the
    agent's own, minus every token variable, plus `extra`. Engines never see the tokens."""
    secret = secret_env_names(fleet)
    env = {k: v for k, v in os.environ.items() if k not in secret}
    for more in extra:
        env.update(more)
    return env
