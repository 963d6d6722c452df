"""asyncssh, imported once for the SSH source and its host keys, without its import-time
warning: asyncssh 2.24 loads cryptography's DSA support, which cryptography 51 deprecates
with a CryptographyDeprecationWarning at import. That went to stderr ahead of every
command's one-line error (replay, timeline, check: any command that loads the collector),
and an engineer can do nothing about it; engineroom never offers DSA keys."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated")
    import asyncssh

__all__ = ["asyncssh"]
