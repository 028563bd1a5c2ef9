"""Where a command finds its database."""

from __future__ import annotations

import os

import psycopg


def resolve_dsn(dsn: str | None = None) -> str:
    """``--dsn``, else ``AWA_DATABASE_URL``, else ``DATABASE_URL``, else libpq's
    own environment (PGHOST, PGDATABASE, ...), which an empty string selects."""
    return dsn or os.environ.get("AWA_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""


def connect(dsn: str | None = None, **kwargs) -> psycopg.Connection:
    kwargs.setdefault("application_name", "awa-sql")
    return psycopg.connect(resolve_dsn(dsn), **kwargs)
