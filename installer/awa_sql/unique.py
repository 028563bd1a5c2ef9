"""A unique key derived from a job's kind and args (ADR 027), the same in any
language that follows the recipe below.

    key = SHA-256( b"awa-unique-v1" 0x00 kind 0x00 canonical(args) )

``kind`` is UTF-8. ``canonical(args)`` is the JSON text of ``args`` (null
or absent args: ``{}``) in UTF-8 with no whitespace, object keys sorted by
code point at every level, non-ASCII characters written as themselves, and
strings escaped as JSON requires (``"`` and ``\\`` with a backslash; control characters as ``\\b``,
``\\f``, ``\\n``, ``\\r``, ``\\t``, the rest as ``\\u00XX`` in lower case):
what Python's ``json.dumps(args, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` and JavaScript's ``JSON.stringify`` of an object whose
keys were sorted give alike (docs/sql-api.md has the Node function).
Integers, strings, booleans, null, arrays and objects are portable; floats
are not (Python writes ``1e-07`` and ``100.0`` where JavaScript writes
``1e-7`` and ``100``), nor are integers beyond 2^53 in magnitude (JavaScript
reads them as doubles: 2^53 + 1 becomes 2^53): put numbers a key depends on
as integers within that range, or as strings. Object keys must be strings,
as JSON's are: one of another type is refused, since ``{10: 1, 9: 2}``
would be written in numeric order and read back from JSON (``{"10": 1,
"9": 2}``) give another key. A string (kind, key or value) holding a lone
surrogate (a code point U+D800 to U+DFFF; in JavaScript, one not in a
pair) is refused: it is not text,
UTF-8 cannot encode it (JavaScript would hash U+FFFD in its place) and
PostgreSQL cannot store it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

DOMAIN = b"awa-unique-v1"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(text: str, where: str) -> None:
    """Refuses a str holding a lone surrogate (ValueError)."""
    found = _SURROGATE.search(text)
    if found:
        raise ValueError(
            f"{where} holds a lone surrogate ({found.group()!r} at index {found.start()}):"
            " it is not text, which UTF-8 cannot encode nor PostgreSQL store")


def _check(value: Any, where: str) -> None:
    """Refuses, at any level of ``value``, an object key that is not a str
    (TypeError) and a str, key or value, holding a lone surrogate (ValueError)."""
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has the key {key!r} ({type(key).__name__}): object keys must be"
                    " strings, as JSON's are (write it as one)")
            _check_text(key, f"the key {key!r} of {where}")
            _check(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]")


def canonical_json(args: Mapping[str, Any] | None) -> bytes:
    """``args`` (None: ``{}``) as the canonical JSON text the recipe hashes;
    an object key that is not a str, at any level, is refused (TypeError),
    and so is a str holding a lone surrogate (ValueError)."""
    args = dict(args or {})
    _check(args, "args")
    return json.dumps(args, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def unique_key(kind: str, args: Mapping[str, Any] | None = None) -> bytes:
    """The 32-byte unique key of a job of ``kind`` with ``args``: pass it as
    ``unique_key=`` so that a second enqueue of the same job is a duplicate
    while the first is live (or within its ``unique_window``). To allow the
    same job again once per period, put the period in ``args`` or the key
    (e.g. ``unique_key(kind, {**args, "hour": "2026-12-02T10"})``). An
    object key in ``args`` that is not a str, at any level, is refused
    (TypeError); so is a lone surrogate in ``kind`` or in a str of ``args``
    (ValueError). ``args`` None is ``{}``."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    _check_text(kind, "kind")
    return hashlib.sha256(
        DOMAIN + b"\0" + kind.encode("utf-8") + b"\0" + canonical_json(args)).digest()
