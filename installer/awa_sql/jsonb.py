"""jsonb that Python's JSON decoder refuses, read without failing the read.

PostgreSQL keeps as valid jsonb what ``json.loads`` refuses: an integer of
more than 4,300 digits (``1e5000`` is stored as one), arrays nested some
thousands deep (a RecursionError). Without this, such a job's args fail
the whole fetch: a worker's claim (every job of the batch already
claimed), the admin API's job and page of jobs (a 500), ``awa jobs show``
and ``awa jobs list``."""

from __future__ import annotations

import traceback
from typing import Any, TypeVar

import psycopg

Conn = TypeVar("Conn", bound=psycopg.Connection)


class Undecodable:
    """A jsonb value that the JSON decoder refused, in place of the value."""

    def __init__(self, error: BaseException) -> None:
        self.error = "".join(traceback.format_exception_only(error)).strip()

    def __repr__(self) -> str:
        return f"<undecodable args: {self.error}>"


def decode_apart(conn: Conn) -> Conn:
    """Makes the connection's jsonb loaders (those it has, so a
    ``set_json_loads`` is kept) return an Undecodable instead of raising;
    returns the connection."""
    oid = conn.adapters.types["jsonb"].oid
    for fmt in (psycopg.pq.Format.TEXT, psycopg.pq.Format.BINARY):
        base = conn.adapters.get_loader(oid, fmt)
        if base is None:
            continue

        class Tolerant(base):  # type: ignore[misc, valid-type]
            def load(self, data: Any) -> Any:
                try:
                    return super().load(data)
                except Exception as err:  # RecursionError, ValueError, DataError
                    return Undecodable(err)

        conn.adapters.register_loader(oid, Tolerant)
    return conn


def shown(value: Any) -> Any:
    """A value as the admin API and ``awa jobs`` show it: an Undecodable as
    ``{"undecodable": "<the decoder's error>"}`` (docs/admin.md)."""
    return {"undecodable": value.error} if isinstance(value, Undecodable) else value
