"""A unique key derived from a job's kind and args (ADR 027), the same in any
language that follows the recipe below.

    key = SHA-256( b"awa-unique-v1" 0x00 kind 0x00 canonical(args) )

``kind`` is UTF-8. ``canonical(args)`` is the JSON text of ``args`` in
UTF-8 with no whitespace, object keys sorted by code point at every level,
non-ASCII characters written as themselves, and strings escaped as JSON
requires (``"`` and ``\\`` with a backslash; control characters as ``\\b``,
``\\f``, ``\\n``, ``\\r``, ``\\t``, the rest as ``\\u00XX`` in lower case):
what Python's ``json.dumps(args, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` and JavaScript's ``JSON.stringify`` of an object whose
keys were sorted give alike (docs/sql-api.md has the Node function).
Integers, strings, booleans, null, arrays and objects are portable; floats
are not (Python writes ``1e-07`` and ``100.0`` where JavaScript writes
``1e-7`` and ``100``): put numbers a key depends on as integers or strings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

DOMAIN = b"awa-unique-v1"


def canonical_json(args: Mapping[str, Any] | None) -> bytes:
    """``args`` as the canonical JSON text the recipe hashes."""
    return json.dumps(dict(args or {}), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def unique_key(kind: str, args: Mapping[str, Any] | None = None) -> bytes:
    """The 32-byte unique key of a job of ``kind`` with ``args``: pass it as
    ``unique_key=`` so that a second enqueue of the same job is a duplicate
    while the first is live (or within its ``unique_window``). To allow the
    same job again once per period, put the period in ``args`` or the key
    (e.g. ``unique_key(kind, {**args, "hour": "2026-12-02T10"})``)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    return hashlib.sha256(
        DOMAIN + b"\0" + kind.encode("utf-8") + b"\0" + canonical_json(args)).digest()
