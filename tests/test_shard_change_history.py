"""The history of changes of S: kept for a retention by awa.prune_shard_changes,
and read from the top of its index whatever its length (the admin detail,
the runtimes panel, awa._shards_at)."""

from __future__ import annotations

import psycopg
import pytest

from awa_sql.admin import queries
from awa_sql.admin.app import Settings, make_pool
from tests.support.jobs import enqueue
from tests.support.reads import rows_read, rows_read_by

# Changes of other queues made after a quiet queue's only change: what a
# read of the quiet queue's latest change must not go through.
BUSY_CHANGES = 30_000


def _age(conn: psycopg.Connection, queue: str, days: int) -> None:
    conn.execute("update awa.shard_changes set changed_at = now() - make_interval(days => %s)"
                 " where queue = %s", [days, queue])


def _busy_history(conn: psycopg.Connection) -> None:
    """A quiet queue changed once, a year ago; then BUSY_CHANGES changes of five
    busy queues (names without lanes: the trigger records no lane rows)."""
    conn.execute("select awa.set_enqueue_shards('quiet', 2)")
    _age(conn, "quiet", 365)
    conn.execute("insert into awa.shard_changes (queue, old_shards, new_shards, lanes_created,"
                 " changed_at, source)"
                 " select 'busy' || i %% 5, 1, 2, 0, now() - make_interval(secs => i), 'auto'"
                 " from generate_series(1, %s) as i", [BUSY_CHANGES])
    conn.execute("analyze awa.shard_changes")


def test_prune_removes_old_changes_and_their_lanes_but_each_queues_latest(db, logins):
    with db.connect() as admin:
        for shards in (2, 4, 8):
            admin.execute("select awa.set_enqueue_shards('old', %s)", [shards])
        admin.execute("select awa.set_enqueue_shards('lone', 2)")
        admin.execute("select awa.set_enqueue_shards('new', 2)")
        admin.execute("select awa.set_enqueue_shards('new', 4)")
        _age(admin, "old", 100)
        _age(admin, "lone", 100)
        ids = dict(admin.execute("select queue, array_agg(change_id order by change_id)"
                                 " from awa.shard_changes group by queue").fetchall())
        assert admin.execute("select count(*) from awa.shard_change_lanes"
                             " where change_id = any(%s)", [ids["old"][:2]]).fetchone()[0] > 0
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_shard_changes()").fetchone()[0] == 2
        assert m.execute("select awa.prune_shard_changes()").fetchone()[0] == 0
    with db.connect() as admin:
        kept = admin.execute("select change_id from awa.shard_changes"
                             " order by change_id").fetchall()
        assert [k for (k,) in kept] == sorted([ids["old"][2], *ids["lone"], *ids["new"]])
        assert admin.execute("select count(*) from awa.shard_change_lanes"
                             " where change_id = any(%s)", [ids["old"][:2]]).fetchone()[0] == 0
        assert admin.execute("select count(*) from awa.shard_change_lanes"
                             " where change_id = %s", [ids["old"][2]]).fetchone()[0] > 0
        # What S a queue had: its latest change is kept, so the answer holds.
        assert admin.execute("select awa._shards_at('old', now())").fetchone()[0] == 8
        assert admin.execute("select awa._shards_at('lone', now())").fetchone()[0] == 2


def test_prune_takes_max_changes_at_a_time_oldest_first(db, logins):
    with db.connect() as admin:
        for shards in (2, 3, 4, 5, 6):
            admin.execute("select awa.set_enqueue_shards('steps', %s)", [shards])
        admin.execute("update awa.shard_changes set changed_at = now() - make_interval("
                      "days => 200 - new_shards) where queue = 'steps'")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_shard_changes(max_changes => 3)").fetchone()[0] == 3
    with db.connect() as admin:
        assert admin.execute("select array_agg(new_shards order by change_id)"
                             " from awa.shard_changes").fetchone()[0] == [5, 6]
    with db.connect(logins.maintenance) as m:
        # A longer retention keeps what a shorter one would remove.
        assert m.execute("select awa.prune_shard_changes('1000 days')").fetchone()[0] == 0
        assert m.execute("select awa.prune_shard_changes('1 day')").fetchone()[0] == 1


@pytest.mark.parametrize(("args", "sqlstate", "message"), [
    ("null::interval", "22004", "older_than must not be null"),
    ("'23 hours'", "22023", "older_than must be at least 1 day, got 23:00:00"),
    ("'90 days', -1", "22023", "max_changes must be 0 or more, got -1"),
    ("'90 days', null", "22004", "max_changes must not be null"),
])
def test_prune_refuses_bad_input_naming_it(db, logins, args, sqlstate, message):
    with db.connect(logins.maintenance) as m, pytest.raises(psycopg.Error, match=message) as err:
        m.execute(f"select awa.prune_shard_changes({args})")
    assert err.value.sqlstate == sqlstate


def test_only_maintenance_may_prune(db, logins):
    for role in ("producer", "worker", "reader", "operator"):
        with db.connect(getattr(logins, role)) as conn, pytest.raises(
                psycopg.errors.InsufficientPrivilege):
            conn.execute("select awa.prune_shard_changes()")


def test_prune_reads_what_it_removes_not_the_history(db, logins):
    with db.connect() as admin:
        _busy_history(admin)
        for shards in (3, 4, 5, 6):
            admin.execute("select awa.set_enqueue_shards('quiet', %s)", [shards])
        _age(admin, "quiet", 365)
    with db.connect(logins.maintenance) as m:
        read = rows_read(m, "awa.shard_changes", "select awa.prune_shard_changes()")
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.shard_changes"
                             " where queue = 'quiet'").fetchone()[0] == 1
    # 4 removed: the changed_at index's entries, their probes for a later
    # change and their deletes; not the 30,000 changes since.
    assert read <= 40, read


def test_shards_at_reads_a_quiet_queues_change_not_the_history_since(db):
    with db.connect() as admin:
        _busy_history(admin)
        statement = "select awa._shards_at('quiet', now())"
        # Past the plan cache's first five calls, when a plan for any queue
        # would take over.
        for _ in range(8):
            assert admin.execute(statement).fetchone()[0] == 2
        assert rows_read(admin, "awa.shard_changes", statement) <= 10


def test_admin_reads_a_quiet_queues_changes_not_the_history_since(db):
    with db.connect() as admin:
        _busy_history(admin)
    pool = make_pool(Settings(db.dsn()), open_now=True)
    try:
        with pool.connection() as conn:
            # Past psycopg's five runs before it prepares a statement and
            # PostgreSQL's five custom plans before a plan for any queue.
            for _ in range(12):
                detail = queries.queue_detail(conn, "quiet")
            assert [(c["old_shards"], c["new_shards"])
                    for c in detail["shard_changes"]] == [(1, 2)]
            assert rows_read_by(conn, "awa.shard_changes",
                                lambda: queries.queue_detail(conn, "quiet")) <= 50
    finally:
        pool.close()


def test_prune_takes_the_latest_change_of_a_queue_that_no_longer_exists(db, logins):
    """A queue's latest change is kept for the readers of the queue: once the
    queue is gone (dropped, and removed by awa.finish_drops), nothing reads it
    and it goes with the rest of the history. Kept for good, it was one row
    more (and one per lane) for every queue ever dropped, each read again by
    every prune."""
    with db.connect(logins.operator) as op:
        for queue in ("gone", "kept"):
            op.execute("select awa.set_enqueue_shards(%s, 2)", [queue])
        with db.connect() as admin:
            gone_id = admin.execute("select queue_id from awa.queue_meta where queue = 'gone'"
                                    ).fetchone()[0]
        assert op.execute("select awa.drop_queue('gone')").fetchone()[0] is True
    with db.connect(logins.maintenance) as m:
        assert [r[2] for r in m.execute("select * from awa.finish_drops()")] == ["removed"]
    with db.connect() as admin:
        # The drop renamed the queue's history with its row (ADR 044).
        _age(admin, f"#dropped#{gone_id}", 100)
        _age(admin, "kept", 100)
        gone = admin.execute("select change_id from awa.shard_changes where queue = %s",
                             [f"#dropped#{gone_id}"]).fetchone()[0]
        # The names of queues removed long ago, one old change each.
        admin.execute("insert into awa.shard_changes (queue, old_shards, new_shards,"
                      " lanes_created, changed_at)"
                      " select 'removed-' || i, 1, 2, 0, now() - interval '100 days'"
                      " from generate_series(1, 2000) as i")
        admin.execute("analyze awa.shard_changes")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_shard_changes()").fetchone()[0] == 2001
    with db.connect() as admin:
        admin.execute("vacuum awa.shard_changes")  # the dead rows, as autovacuum would
    with db.connect(logins.maintenance) as m:
        # What is left to read is the kept change of each queue that exists.
        assert rows_read(m, "awa.shard_changes", "select awa.prune_shard_changes()") <= 20
    with db.connect() as admin:
        assert admin.execute("select queue from awa.shard_changes").fetchall() == [("kept",)]
        assert admin.execute("select count(*) from awa.shard_change_lanes"
                             " where change_id = %s", [gone]).fetchone()[0] == 0
        assert admin.execute("select awa._shards_at('kept', now())").fetchone()[0] == 2
    with db.connect(logins.producer) as p:
        enqueue(p, "gone")
    with db.connect() as admin:
        # A queue made again under the name reads its own S, not the old one's.
        assert admin.execute("select awa._shards_at('gone', now())").fetchone()[0] == 1
