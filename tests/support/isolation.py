"""The refusal every TRUNCATE-based maintenance call shares
(awa._check_read_committed): outside read committed it changes nothing."""

from __future__ import annotations

import psycopg
import pytest

# The levels whose snapshot can be older than a lock the call takes.
OLDER_SNAPSHOTS = ["repeatable read", "serializable"]


def assert_refused_outside_read_committed(db, login: str, call: str, isolation: str) -> None:
    """`select <call>` as `login`, in a transaction at `isolation`, fails
    with 25000 naming the call and the level."""
    with db.connect(login, autocommit=False) as conn:
        conn.execute(f"begin isolation level {isolation}")
        with pytest.raises(psycopg.Error) as err:
            conn.execute(f"select {call}")
        assert err.value.sqlstate == "25000"
        assert f"{call} needs a read committed transaction, got {isolation}" in str(err.value)
