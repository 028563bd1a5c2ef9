"""COPY ingestion: awa.copy_staging and awa.enqueue_copied()."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awa_sql import routing
from tests.support.jobs import COPY_SQL, claim_all, copy_rows, enqueue


def test_100k_rows_across_8_queues_land_in_their_lanes_in_order(db, logins):
    queues = [f"copy-{i}" for i in range(8)]
    with db.connect(logins.operator) as op:
        for q in queues:
            op.execute("select awa.set_enqueue_shards(%s, 4)", [q])
    rng = random.Random(5)
    rows = []
    for n in range(100_000):
        key = f"k{rng.randint(0, 499)}".encode() if rng.random() < 0.7 else None
        rows.append((queues[n % 8], None, key, "copy.job", Jsonb({"n": n}), None, None))
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, rows)
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 100_000
        conn.commit()
    with db.connect() as admin:
        landed = admin.execute(
            "select m.queue, l.shard, r.lane_seq, r.ordering_key, (r.args->>'n')::int"
            " from awa.ready r join awa.lanes l using (lane_id)"
            " join awa.queue_meta m on m.queue_id = r.queue_id"
            " order by l.lane_id, r.lane_seq").fetchall()
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0
    assert len(landed) == 100_000
    by_key: dict[tuple[str, bytes], list[int]] = {}
    for queue, shard, _seq, key, n in landed:
        assert queue == rows[n][0]
        if key is not None:
            assert shard == routing.shard_for_ordering_key(key, 4)
            by_key.setdefault((queue, key), []).append(n)
    assert by_key and all(ns == sorted(ns) for ns in by_key.values())  # per-key COPY order


def test_a_rollback_leaves_nothing_staged_or_enqueued(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, [("rb", None, None, "k", Jsonb({}), None, None)] * 100)
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 100
        conn.rollback()
        copy_rows(conn, [("rb", None, None, "k", Jsonb({}), None, None)] * 10)
        conn.rollback()
    with db.connect() as admin:
        assert admin.execute("select (select count(*) from awa.copy_staging),"
                             " (select count(*) from awa.ready)").fetchone() == (0, 0)


def test_four_concurrent_copy_producers_do_not_mix(db, logins):
    barrier = threading.Barrier(4)

    def produce(p):
        with db.connect(logins.producer, autocommit=False) as conn:
            copy_rows(conn, [("mix", None, f"p{p}-{i % 7}".encode(), "k", Jsonb({"p": p}),
                              None, None) for i in range(5000)])
            barrier.wait()  # all four have staged rows, none has moved them
            moved = conn.execute("select awa.enqueue_copied()").fetchone()[0]
            conn.commit()
            return moved

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(produce, range(4))) == [5000] * 4
    with db.connect(logins.worker) as w:
        got = claim_all(w, ["mix"], 1000)
    assert len(got) == 20_000
    assert sorted(c[7]["p"] for c in got) == sorted([0, 1, 2, 3] * 5000)


def test_csv_payloads_with_the_end_marker_and_null_marker_round_trip(db, logins):
    kind = "line one\n\\.\nline three"  # a line that is exactly \. inside a field
    csv_lines = [
        # unquoted empty field = NULL ordering key; quoted "" = the empty key
        'csv,,,"line one\n\\.\nline three","{""s"": ""\\\\.""}",,\n',
        'csv,,"",csv.job,"{}",,\n',
    ]
    with db.connect(logins.producer, autocommit=False) as conn:
        with conn.cursor().copy(f"{COPY_SQL} with (format csv)") as cp:
            for line in csv_lines:
                cp.write(line)
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 2
        conn.commit()
    with db.connect() as admin:
        stored = admin.execute("select kind, args, ordering_key from awa.ready order by job_id"
                               ).fetchall()
    assert stored == [(kind, {"s": "\\."}, None), ("csv.job", {}, b"")]


def test_a_bytea_key_in_text_format_takes_a_doubled_backslash_as_the_docs_say(db, logins):
    """docs/sql-api.md: text format reads a single backslash's \\x6b as an
    escape of its own and stores another key; the doubled one is hex."""
    with db.connect(logins.producer, autocommit=False) as conn:
        with conn.cursor().copy("copy awa.copy_staging (queue, ordering_key, kind)"
                                " from stdin") as cp:
            cp.write("text\t\\\\x6b6579\tdoubled\n")
            cp.write("text\t\\x6b6579\tsingle\n")
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 2
        conn.commit()
    with db.connect() as admin:
        assert admin.execute("select kind, ordering_key from awa.ready order by job_id"
                             ).fetchall() == [("doubled", b"key"), ("single", b"k6579")]


def test_a_bad_row_fails_the_copy_naming_the_row_and_enqueues_nothing(db, logins):
    rows = [("bad", None, None, "k", Jsonb({}), None, None)] * 3
    rows.append(("bad", 9, None, "k", Jsonb({}), None, None))
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, rows)
        with pytest.raises(psycopg.Error) as err:
            conn.execute("select awa.enqueue_copied()")
        conn.rollback()
    assert err.value.sqlstate == "22023" and "COPY row 4 (1-based)" in str(err.value)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0


@pytest.mark.parametrize("statement", [
    "select * from awa.copy_staging",
    "update awa.copy_staging set kind = 'x'",
    "delete from awa.copy_staging",
    "truncate awa.copy_staging",
    "insert into awa.copy_staging (queue, kind, staged_by) values ('q', 'k', 'someone')",
    "insert into awa.copy_staging (queue, kind, staged_xid) values ('q', 'k', '1')",
])
def test_producers_cannot_touch_staged_rows_or_provenance(db, logins, statement):
    with db.connect(logins.producer) as conn, pytest.raises(
            psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_rows_committed_without_enqueue_copied_are_enqueued_at_commit(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, [("orphan", None, None, "k", Jsonb({"i": i}), None, None)
                         for i in range(250)])
        copy_rows(conn, [("orphan", None, None, "k", Jsonb({"i": i}), None, None)
                         for i in range(250, 300)])
        conn.commit()
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0
        assert admin.execute("select count(*) from awa.copy_pending").fetchone()[0] == 0
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.move_staged()").fetchone()[0] == 0
    with db.connect(logins.worker) as w:
        got = claim_all(w, ["orphan"], 100)
    assert [c[7]["i"] for c in got] == list(range(300))


def test_two_maintenance_sessions_move_leftover_rows_once(db, logins):
    """Rows a transaction committed to staging without moving them (as before
    migration 0010; made here with the staging triggers off) are moved by one
    of two concurrent awa.move_staged() calls, never by both."""
    with db.connect() as admin:
        # No commit-time move: its trigger fires in every replication role.
        admin.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        admin.execute("insert into awa.copy_staging (queue, kind, args)"
                      " select 'leftover', 'k', jsonb_build_object('i', i)"
                      " from generate_series(1, 500) as i")
    with db.connect(logins.producer) as p:
        enqueue(p, "leftover")
    with db.connect(logins.operator) as op:  # a second lane free for a second mover
        op.execute("select awa.set_enqueue_shards('leftover', 2)")
    first = db.connect(logins.maintenance, autocommit=False)
    try:
        assert first.execute("select awa.move_staged()").fetchone()[0] == 500
        with db.connect(db.login_role("awa_maintenance")) as second:
            # The first mover holds the rows until it commits: skipped, not
            # waited for (a second move would block on them, then time out).
            second.execute("set lock_timeout = '5s'")
            assert second.execute("select awa.move_staged()").fetchone()[0] == 0
        first.commit()
    finally:
        first.close()
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.move_staged()").fetchone()[0] == 0
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 501
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


def test_enqueue_copied_then_more_copy_in_one_transaction(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, [("twice", None, None, "k", Jsonb({"i": i}), None, None)
                         for i in range(10)])
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 10
        copy_rows(conn, [("twice", None, None, "k", Jsonb({"i": i}), None, None)
                         for i in range(10, 15)])
        conn.commit()
    with db.connect(logins.worker) as w:
        assert [c[7]["i"] for c in claim_all(w, ["twice"])] == list(range(15))


def test_a_bad_row_left_staged_fails_the_commit_and_enqueues_nothing(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, [("late", None, None, "k", Jsonb({}), None, None)] * 2
                  + [("late", 0, None, "k", Jsonb({}), None, None)])
        with pytest.raises(psycopg.Error) as err:
            conn.commit()
    assert err.value.sqlstate == "22023" and "COPY row 3 (1-based)" in str(err.value)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


def test_staging_is_unlogged_and_its_triggers_run_as_the_owner(db):
    with db.connect() as admin:
        assert admin.execute("select relpersistence from pg_class"
                             " where oid = 'awa.copy_staging'::regclass").fetchone()[0] == "u"
        assert admin.execute("select relpersistence from pg_class"
                             " where oid = 'awa.copy_pending'::regclass").fetchone()[0] == "p"
        triggers = admin.execute(
            "select tgname, tgdeferrable, tginitdeferred from pg_trigger"
            " where tgrelid in ('awa.copy_staging'::regclass, 'awa.copy_pending'::regclass)"
            " and not tgisinternal order by tgname").fetchall()
    assert triggers == [("copy_pending_move", True, True), ("copy_staging_note", False, False)]


def test_priorities_future_run_at_and_keys_through_the_set_based_mover(db, logins):
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=1)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('mixed', 4)")
    rows = [("mixed", 1, None, "k", Jsonb({"i": i}), None, None) for i in range(10)]
    rows += [("mixed", 3, b"a", "k", Jsonb({"i": i}), None, 3) for i in range(10, 20)]
    rows += [("mixed", None, b"b", "k", Jsonb({"i": i}), later, None) for i in range(20, 25)]
    with db.connect(logins.producer, autocommit=False) as conn:
        copy_rows(conn, rows)
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 25
        conn.commit()
    with db.connect() as admin:
        ready = admin.execute(
            "select r.priority, l.shard, r.lane_seq, (r.args->>'i')::int, r.max_attempts"
            " from awa.ready r join awa.lanes l using (lane_id) order by r.lane_id, r.lane_seq"
        ).fetchall()
        scheduled = admin.execute(
            "select priority, ordering_key, run_at from awa.scheduled order by job_id").fetchall()
    by_priority = {p: [r for r in ready if r[0] == p] for p in (1, 3)}
    assert [r[3] for r in by_priority[1]] == list(range(10))
    assert len({r[1] for r in by_priority[1]}) == 1  # one lane for an unkeyed group
    assert [r[3] for r in by_priority[3]] == list(range(10, 20))
    assert {r[1] for r in by_priority[3]} == {routing.shard_for_ordering_key(b"a", 4)}
    assert all(r[4] == 3 for r in by_priority[3])
    for lane_rows in by_priority.values():  # one contiguous range per lane
        seqs = [r[2] for r in lane_rows]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert [(p, bytes(k)) for p, k, _ in scheduled] == [(2, b"b")] * 5
    assert all(abs((t - later).total_seconds()) < 1 for _, _, t in scheduled)


KEYED_COPY = ("copy awa.copy_staging (queue, ordering_key, kind, args, run_at, unique_key,"
              " unique_window) from stdin")


def test_a_keyed_load_of_several_passes_keeps_copy_order_and_its_duplicates(db, logins):
    """A load of more than 10,000 rows with unique keys takes them all before
    its first pass (ADR 027), then moves 10,000 rows a pass as before: the
    first row of a key in COPY order takes it, in any pass; a later row of
    it, or a key another job holds, is a duplicate and written nowhere; the
    rest land in COPY order within each lane, due or for later, a
    partitioned queue's rows in their partitions."""
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=1)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('kparts', 3)")
    with db.connect(logins.producer) as p:
        held = enqueue(p, "kplain", "held", unique_key=b"held")[0]
    rows, taken, expected = [], set(), set()
    taken.add(("kplain", b"held"))
    for n in range(25_000):
        queue = "kparts" if n % 5 == 0 else "kplain"
        key = f"k{n % 1400}".encode() if n % 7 == 0 else None
        if n == 12_345:
            key = b"held"
        ordering = f"o{n % 13}".encode() if queue == "kparts" else None
        run_at = later if n % 11 == 0 else None
        rows.append([queue, ordering, "job", Jsonb({"n": n}), run_at, key, None])
        if key is None or (queue, key) not in taken:
            expected.add(n)
            if key is not None:
                taken.add((queue, key))
    with db.connect(logins.producer, autocommit=False) as conn:
        with conn.cursor().copy(KEYED_COPY) as cp:
            for row in rows:
                cp.write_row(row)
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 25_000
        conn.commit()
    with db.connect() as admin:
        ready = admin.execute(
            "select m.queue, r.lane_id, (r.args->>'n')::int from awa.ready r"
            " join awa.queue_meta m using (queue_id) where r.job_id <> %s"
            " order by r.lane_id, r.lane_seq", [held]).fetchall()
        scheduled = admin.execute("select (args->>'n')::int from awa.scheduled").fetchall()
        keys = admin.execute(
            "select u.queue, u.unique_key, (coalesce(r.args, s.args)->>'n')::int"
            " from awa.unique_keys u left join awa.ready r using (job_id)"
            " left join awa.scheduled s using (job_id) where u.job_id <> %s", [held]).fetchall()
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0
    assert sorted([n for *_, n in ready] + [n for n, in scheduled]) == sorted(expected)
    assert {n for n, in scheduled} == {n for n in expected if n % 11 == 0}
    lanes: dict[int, list[int]] = {}
    for queue, lane, n in ready:
        assert queue == "kplain" if n % 5 else queue.startswith("kparts")
        lanes.setdefault(lane, []).append(n)
    assert all(ns == sorted(ns) for ns in lanes.values())  # COPY order within each lane
    assert len({q for q, *_ in ready if q.startswith("kparts")}) == 3
    # Each key is held by its first row's job.
    assert sorted((q, bytes(k), n) for q, k, n in keys) == sorted(
        (rows[n][0], rows[n][5], n) for n in expected if rows[n][5] is not None)


def test_every_ready_job_of_a_keyed_load_of_several_passes_is_found_by_id(db, logins):
    """A keyed row, then 10,000 unkeyed rows in its lane, in a load of two
    passes: the prologue drew ids for the keyed rows only, so the unkeyed
    ones had ids below the keyed row's awa.ready_late stamp, and once the
    lane's head reached the keyed row awa.job and awa.cancel_job found none
    of them (awa.jobs listed them)."""
    with db.connect(logins.producer) as p:
        enqueue(p, "hidden", "seed")
    with db.connect(logins.producer, autocommit=False) as p:
        p.execute("insert into awa.copy_staging (queue, kind, unique_key)"
                  " values ('hidden', 'keyed', 'key-1')")
        p.execute("insert into awa.copy_staging (queue, kind)"
                  " select 'hidden', 'plain' from generate_series(1, 10000)")
        assert p.execute("select awa.enqueue_copied()").fetchone()[0] == 10001
        p.commit()
    with db.connect(logins.worker) as w:
        assert w.execute("select kind from awa.claim(array['hidden'], 1, 'w')"
                         ).fetchall() == [("seed",)]
    with db.connect(logins.operator) as op, db.connect() as su:
        ids = [r[0] for r in su.execute(
            "select r.job_id from awa.ready as r join awa.queue_meta as m using (queue_id)"
            " where m.queue = 'hidden' order by r.lane_seq").fetchall()]
        assert len(ids) == 10001
        sample = [*ids[::97], ids[-1]]
        unfound = [j for j in sample
                   if op.execute("select count(*) from awa.job(%s)", [j]).fetchone()[0] != 1]
        assert unfound == []
        assert op.execute("select awa.cancel_job(%s)", [ids[5000]]).fetchone()[0] is True


def test_a_keyed_load_of_several_passes_marks_its_queues_at_once(db, logins):
    """A keyed load of two passes into a partitioned queue, the first pass's
    rows in partition 1, the second's in partition 0, and a pause of the
    queue while the load stops after its first mark of a queue: marked pass
    by pass, the load held fam__p1's row and then waited for fam's, which
    the pause held while it waited for fam__p1's: 40P01. The prologue marks
    every keyed queue of the load in lock order now."""
    from tests.support.crash import Hold
    from tests.support.jobs import Call, waits_for_a_lock
    from tests.support.waiting import wait_until

    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('fam', 2)")
        keys = {}
        for i in range(100):
            key = f"cust-{i}".encode()
            keys.setdefault(op.execute("select awa.partition_for_ordering_key(%s, 2)",
                                       [key]).fetchone()[0], key)
    with db.connect() as admin:
        hold = Hold(admin, "awa.queue_meta", "update")
        load = db.connect(logins.producer, autocommit=False)
        for partition, rows, tag in ((1, 10000, "a"), (0, 10, "b")):
            load.execute("insert into awa.copy_staging (queue, ordering_key, kind, unique_key)"
                          " select 'fam', %s, 'k', (%s || g)::bytea"
                          " from generate_series(1, %s) as g", [keys[partition], tag, rows])
        copy = Call(load, lambda c: c.execute("select awa.enqueue_copied()").fetchone()[0])
        copy.start()
        try:
            wait_until(lambda: hold.waiting(copy.pid), 30, "the load's first mark")
            pause = Call(db.connect(logins.operator, autocommit=False),
                         lambda c: c.execute("select awa.pause_queue('fam')").fetchone()[0])
            pause.start()
            wait_until(lambda: waits_for_a_lock(admin, pause.pid), 15, "the pause to wait")
        finally:
            hold.close()
        copy.join(60)
        pause.join(60)
    assert copy.error is None and copy.result == 10010, copy.error
    assert pause.error is None and pause.result is True, pause.error


def test_a_bad_row_of_a_keyed_load_of_several_passes_is_named(db, logins):
    """The first bad row, named as its pass would name it, before any key is
    taken; nothing is enqueued."""
    rows = [["kbad", None, "job", Jsonb({}), None, f"k{n}".encode(), None]
            for n in range(15_000)]
    rows[12_345][2] = None  # COPY row 12,346: no kind
    rows[13_000][5] = None  # a window without a key, later
    rows[13_000][6] = "1 hour"
    with db.connect(logins.producer, autocommit=False) as conn:
        with conn.cursor().copy(KEYED_COPY) as cp:
            for row in rows:
                cp.write_row(row)
        with pytest.raises(psycopg.Error) as err:
            conn.execute("select awa.enqueue_copied()")
        conn.rollback()
    assert err.value.sqlstate == "22004" and "COPY row 12346 (1-based)" in str(err.value)
    with db.connect() as admin:
        assert admin.execute("select (select count(*) from awa.ready),"
                             " (select count(*) from awa.unique_keys)").fetchone() == (0, 0)


def test_move_staged_does_not_read_the_rows_of_an_open_load(db, logins):
    """awa maintain calls awa.move_staged every 5 s: an open COPY load is
    skipped by its xid, not read row by row (the call used to read every
    staged row)."""
    with db.connect(logins.producer, autocommit=False) as load:
        copy_rows(load, [("open", None, None, "k", Jsonb({"i": i}), None, None)
                         for i in range(5_000)])
        with db.connect(logins.maintenance, autocommit=False) as m:
            assert m.execute("select awa.move_staged()").fetchone()[0] == 0
            assert m.execute("select pg_stat_get_xact_blocks_fetched("
                             "'awa.copy_staging'::regclass)").fetchone()[0] == 0
        load.commit()
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 5_000


def test_move_staged_moves_leftovers_on_both_sides_of_an_open_load(db, logins):
    """Leftover rows of transactions that ended before and after an open load
    began are moved while it runs; its own rows wait for its commit."""
    def leftover(admin, n):
        admin.execute("insert into awa.copy_staging (queue, kind)"
                      " select 'left', 'k' from generate_series(1, %s)", [n])

    with db.connect() as admin:
        # No commit-time move: its trigger fires in every replication role.
        admin.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        leftover(admin, 3)
        with db.connect(logins.producer, autocommit=False) as load:
            copy_rows(load, [("left", None, None, "k", Jsonb({}), None, None)] * 7)
            leftover(admin, 4)
            with db.connect(logins.maintenance) as m:
                assert [m.execute("select awa.move_staged()").fetchone()[0]
                        for _ in range(3)] == [3, 4, 0]
            load.commit()
        with db.connect(logins.maintenance) as m:
            assert [m.execute("select awa.move_staged()").fetchone()[0]
                    for _ in range(2)] == [7, 0]
        assert admin.execute("select (select count(*) from awa.ready),"
                             " (select count(*) from awa.copy_staging)").fetchone() == (14, 0)


def test_a_leftover_load_with_a_bad_row_is_named_and_does_not_hold_back_the_next(db, logins):
    """Rows committed with the staging triggers off were checked by no
    commit: one bad row failed every awa.move_staged call, and every later
    leftover load waited behind it for good."""
    with db.connect() as admin:
        # No commit-time move: its trigger fires in every replication role.
        admin.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        bad = admin.execute("insert into awa.copy_staging (queue, kind, priority)"
                            " values ('left', 'k', 9) returning staged_xid::text").fetchone()[0]
        admin.execute("insert into awa.copy_staging (queue, kind)"
                      " select 'left', 'k' from generate_series(1, 3)")
    warnings: list[str] = []
    with db.connect(logins.maintenance) as m:
        m.add_notice_handler(lambda n: warnings.append(n.message_primary or ""))
        assert [m.execute("select awa.move_staged()").fetchone()[0] for _ in range(2)] == [3, 0]
    assert warnings and all(f"staging transaction {bad} left staged: " in w
                            and "priority must be between 1" in w for w in warnings), warnings
    with db.connect() as admin:
        assert admin.execute("select (select count(*) from awa.ready),"
                             " (select count(*) from awa.copy_staging)").fetchone() == (3, 1)


def test_move_staged_moves_one_staging_transaction_a_call(db, logins):
    """awa.move_staged moves one staging transaction per call, oldest first: a
    second in the same transaction would take its keys (ADR 027) and lanes
    while holding the first's lanes. The third's rows are all duplicates of
    the second's keys: moved, none enqueued."""
    with db.connect() as admin:
        # No commit-time move: its trigger fires in every replication role.
        admin.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        for keyed in (False, True, True, False):
            admin.execute("insert into awa.copy_staging (queue, kind, unique_key)"
                          " select 'left', 'k', case when %s then ('u' || i)::bytea end"
                          " from generate_series(1, 5) as i", [keyed])
    with db.connect(logins.maintenance) as m:
        assert [m.execute("select awa.move_staged()").fetchone()[0]
                for _ in range(5)] == [5, 5, 5, 5, 0]
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 15
