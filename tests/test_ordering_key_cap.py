"""The ordering key's cap on real PostgreSQL 17 and 18: at most 1024 bytes on
every enqueue path (single, scheduled, partitioned, batch, COPY), refused
with 22023 naming the length and the cap, nothing written; a key of exactly
1024 bytes is taken and lands on the lane its hash picks.

The cap exists because the key's hash runs byte by byte in PL/pgSQL and the
maintenance passes hash every key they move: without it one producer's job
scheduled for later with a key of megabytes stalls awa.promote_due, and with
it every queue's due jobs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awa_sql import routing
from tests.support.jobs import copy_rows, enqueue

AT_CAP = b"k" * 1024
OVER = b"k" * 1025
MESSAGE = "ordering_key must be at most 1024 bytes, got 1025"
LATER = datetime.now(UTC) + timedelta(hours=1)


def nothing_written(db) -> None:
    with db.connect() as su:
        assert su.execute("select (select count(*) from awa.ready)"
                          " + (select count(*) from awa.scheduled)"
                          " + (select count(*) from awa.copy_staging)").fetchone()[0] == 0


def test_a_key_over_the_cap_is_refused_by_a_single_enqueue_due_now_or_later(db, logins):
    with db.connect(logins.producer) as p:
        for run_at in (None, LATER):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                enqueue(p, "capq", ordering_key=OVER, run_at=run_at)
            assert err.value.diag.message_primary == MESSAGE
    nothing_written(db)


def test_a_key_over_the_cap_is_refused_before_a_partitioned_queue_routes_it(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_queue_partitions('capp', 4)")
    with db.connect(logins.producer) as p, \
            pytest.raises(psycopg.errors.InvalidParameterValue, match=MESSAGE):
        enqueue(p, "capp", ordering_key=OVER)
    nothing_written(db)


def test_a_batch_names_the_element_whose_key_is_over_the_cap(db, logins):
    with db.connect(logins.producer) as p:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            p.execute("select * from awa.enqueue_batch(array['capb', 'capb', 'capb'],"
                      " array['k', 'k', 'k'], ordering_keys => %s)",
                      [[b"a", None, OVER]])
        assert err.value.diag.message_primary == f"batch element 3 (1-based): {MESSAGE}"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch element 1 "):
            p.execute("select * from awa.enqueue_batch(array['capb'], array['k'],"
                      " ordering_keys => %s, run_ats => %s)", [[OVER], [LATER]])
    nothing_written(db)


@pytest.mark.parametrize("rows", [2, 3])
def test_a_copy_names_the_row_whose_key_is_over_the_cap(db, logins, rows):
    """Both movers: a set of one queue and priority (the set-based mover) and
    a mixed set (the general one)."""
    staged = [("capc", None, b"a", "k", Jsonb({}), None, None),
              ("capc", None, OVER, "k", Jsonb({}), None, None),
              ("capc2", 1, None, "k", Jsonb({}), None, None)][:rows]
    with (db.connect(logins.producer) as p,
          pytest.raises(psycopg.errors.InvalidParameterValue) as err, p.transaction()):
        copy_rows(p, staged)
        p.execute("select awa.enqueue_copied()")
    assert err.value.diag.message_primary == f"COPY row 2 (1-based): {MESSAGE}"
    nothing_written(db)


def test_a_key_at_the_cap_is_taken_on_every_path_and_lands_on_its_hash_lane(db, logins):
    shards = 8
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('capok', %s)", [shards])
    with db.connect(logins.producer) as p:
        one = enqueue(p, "capok", ordering_key=AT_CAP)
        batch = p.execute("select * from awa.enqueue_batch(array['capok'], array['k'],"
                          " ordering_keys => %s)", [[AT_CAP]]).fetchall()
        with p.transaction():
            copy_rows(p, [("capok", None, AT_CAP, "k", Jsonb({}), None, None)])
            p.execute("select awa.enqueue_copied()")
    with db.connect() as su:
        got = su.execute("select r.job_id, l.shard from awa.ready r"
                         " join awa.lanes l using (lane_id) where length(r.ordering_key) = 1024"
                         " order by r.job_id").fetchall()
    assert len(got) == 3 and {one[0], batch[0][0]} <= {j for j, _ in got}
    assert {s for _, s in got} == {routing.shard_for_ordering_key(AT_CAP, shards)}
