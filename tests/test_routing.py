"""The routing hashes: the check values of docs/sql-api.md, and SQL equals Python."""

from __future__ import annotations

import random

import psycopg
import pytest

import awa_sql
from awa_sql import routing

CHECK_VALUES = [
    # key, hash64, shard S=4, shard S=8, partition P=4
    ("", 14695981039346656037, 1, 5, 2),
    ("customer-42", 695220319317454988, 0, 4, 3),
    ("order:1001", 14549007610802403233, 1, 1, 0),
]


@pytest.mark.parametrize(("key", "h", "s4", "s8", "p4"), CHECK_VALUES)
def test_python_check_values(key, h, s4, s8, p4):
    assert routing.ordering_key_hash64(key) == h
    assert routing.shard_for_ordering_key(key, 4) == s4
    assert routing.shard_for_ordering_key(key, 8) == s8
    assert routing.partition_for_ordering_key(key, 4) == p4


def test_sql_check_values(db):
    with db.connect(user=db.login_role("awa_reader")) as conn:
        for key, h, s4, s8, p4 in CHECK_VALUES:
            row = conn.execute(
                "select awa.ordering_key_hash64(k), awa.shard_for_ordering_key(k, 4),"
                " awa.shard_for_ordering_key(k, 8), awa.partition_for_ordering_key(k, 4),"
                " awa.shard_for_ordering_key(k, 1), awa.partition_for_ordering_key(k, 1)"
                " from (select convert_to(%s, 'UTF8') as k) as x", [key]).fetchone()
            assert row == (h, s4, s8, p4, 0, 0)
        assert conn.execute("select awa.contract_version()").fetchone()[0] == awa_sql.__version__


def _keys() -> list[bytes]:
    rng = random.Random(719)
    keys = [b"", b"\x00", b"\x00" * 17, b"\xff" * 64, b"\xff" * 1024, bytes(range(256))]
    keys += [rng.randbytes(1024) for _ in range(20)]
    keys += ["é".encode() * 40, "e\u0301".encode() * 40, "客户-42".encode(), "🦀".encode()]
    keys += [rng.randbytes(rng.randint(1, 40)) for _ in range(3000)]
    keys += [f"customer-{i}".encode() for i in range(1000)]
    return keys


def test_sql_and_python_agree_on_thousands_of_keys(db):
    keys = _keys()
    with db.connect() as conn:
        rows = conn.execute(
            "select awa.ordering_key_hash64(k), awa.partition_hash64(k),"
            " awa.shard_for_ordering_key(k, 7), awa.shard_for_ordering_key(k, 64),"
            " awa.partition_for_ordering_key(k, 5), awa.partition_for_ordering_key(k, 32767)"
            " from unnest(%s::bytea[]) with ordinality as u (k, i) order by i", [keys]
        ).fetchall()
    expected = [
        (routing.ordering_key_hash64(k), routing.partition_hash64(k),
         routing.shard_for_ordering_key(k, 7), routing.shard_for_ordering_key(k, 64),
         routing.partition_for_ordering_key(k, 5), routing.partition_for_ordering_key(k, 32767))
        for k in keys
    ]
    assert [tuple(int(v) for v in r) for r in rows] == expected


def test_sql_shard_equals_python_for_every_s_on_thousands_of_keys(db):
    """Every S from 1 to 64: powers of two take a six-bit shortcut in SQL."""
    keys = _keys()
    with db.connect() as conn:
        rows = conn.execute(
            "select s, array_agg(awa.shard_for_ordering_key(k, s) order by i)"
            "  from unnest(%s::bytea[]) with ordinality as u (k, i),"
            "       generate_series(1, 64) as s group by s order by s", [keys]).fetchall()
    for s, shards in rows:
        assert shards == [routing.shard_for_ordering_key(k, s) for k in keys], f"S = {s}"


def test_partition_queue_names(db):
    with db.connect() as conn:
        assert conn.execute("select awa.partition_queue_names('q', 1)").fetchone()[0] == ["q"]
        assert conn.execute("select awa.partition_queue_names('q', 3)").fetchone()[0] == [
            "q", "q__p1", "q__p2"]
    assert routing.partition_queue_names("q", 3) == ["q", "q__p1", "q__p2"]
    with pytest.raises(ValueError, match="between 1 and 32767"):
        routing.partition_queue_names("q", 0)


def test_stripe_hash_sql_equals_python_as_a_runtime_role(db):
    keys = [f"s{i}".encode() for i in range(2000)] + [b"", b"\xff" * 33]
    with db.connect(db.login_role("awa_reader")) as conn:
        rows = conn.execute(
            "select awa.stripe_for_ordering_key(k, 3), awa.stripe_for_ordering_key(k, 1)"
            " from unnest(%s::bytea[]) with ordinality as u (k, i) order by i", [keys]).fetchall()
    assert rows == [(routing.stripe_for_ordering_key(k, 3), 0) for k in keys]


@pytest.mark.parametrize("shards", [65, 128, 4096, 100_000, 2_147_483_647])
def test_shards_above_the_largest_s_are_refused_on_both_sides(db, shards):
    """A power of two above 64 took the six-bit shortcut (hash mod 64), and
    more than 32767 overflowed the smallint: refused, as the Python twin does."""
    with db.connect() as conn, pytest.raises(psycopg.errors.InvalidParameterValue,
                                             match=rf"(?m)at most 64 .* got {shards}$"):
        conn.execute("select awa.shard_for_ordering_key('order:1001', %s)", [shards])
    with pytest.raises(ValueError, match=rf"(?m)at most 64 .* got {shards}$"):
        routing.shard_for_ordering_key(b"order:1001", shards)
