"""The queue limit (migration 0029) on real PostgreSQL 17 and 18: an enqueue to
a new name creates a queue, with eight sequences, only while the physical
queues number less than awa.queue_limit.max_queues; past it the call fails
with 53400 naming the count and the limit, and creates nothing. Partitions
count. Two creations at the last place: one wins, the other is refused; a
second creation of the same name is not refused. awa.set_max_queues is the
operator's, with 22004/22023 for bad values; `awa storage queue-limit` shows
and sets it with the database's message for a value out of range.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.support.jobs import behind, copy_rows, enqueue

LIMIT_REACHED = psycopg.errors.ConfigurationLimitExceeded


def queues(db) -> int:
    with db.connect() as su:
        return su.execute("select count(*) from awa.queue_meta").fetchone()[0]


def sequences(db) -> int:
    with db.connect() as su:
        return su.execute("select count(*) from pg_class where relkind = 'S'"
                          " and relnamespace = 'awa'::regnamespace").fetchone()[0]


def room_for(db, logins, n: int) -> None:
    """Sets the limit to leave room for n more queues."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_max_queues(%s)", [queues(db) + n])


def test_a_fresh_install_allows_ten_thousand_queues(db, logins):
    with db.connect(logins.reader) as r:
        assert r.execute("select max_queues from awa.queue_limit").fetchone() == (10000,)


def test_past_the_limit_a_new_name_is_refused_and_nothing_is_created(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "known")
        room_for(db, logins, 1)
        enqueue(p, "second")
        before = (queues(db), sequences(db))
        with pytest.raises(LIMIT_REACHED) as err:
            enqueue(p, "third")
        n = before[0]
        assert err.value.diag.message_primary == (
            f"queue limit reached: {n} queues exist and at most {n} may")
        assert "awa.set_max_queues" in err.value.diag.message_hint
        for call in ("select count(*) from awa.enqueue_batch(array['known', 'fourth'],"
                     " array['k', 'k'])",
                     "select * from awa.enqueue('fifth', 'k', run_at => now() + interval '1 h')"):
            with pytest.raises(LIMIT_REACHED):
                p.execute(call)
        # Known queues still take jobs.
        enqueue(p, "known")
        enqueue(p, "second")
    assert (queues(db), sequences(db)) == before
    room_for(db, logins, 1)
    with db.connect(logins.producer) as p:
        enqueue(p, "third")
    assert queues(db) == before[0] + 1


def lane_ids_spent(db) -> int:
    with db.connect() as su:
        return su.execute("select last_value from awa.lanes_lane_id_seq").fetchone()[0]


@pytest.mark.parametrize("path", ["batch", "copy"])
def test_a_call_with_more_new_names_than_room_is_refused_before_it_creates_any(db, logins,
                                                                               path):
    """Queues were created one by one, each with its lanes: a batch refused at
    the last place had spent the lane ids and sequences of all the others
    first (never given back), and a client that tried again spent as many
    again. The whole call is checked first now."""
    with db.connect(logins.producer) as p:
        enqueue(p, "known")
    room_for(db, logins, 3)
    names = [f"tenant-{i}" for i in range(10)]
    before = (queues(db), lane_ids_spent(db))
    for _ in range(2):  # as a client that tries again
        with db.connect(logins.producer, autocommit=False) as p, \
                pytest.raises(LIMIT_REACHED) as err:
            if path == "batch":
                p.execute("select count(*) from awa.enqueue_batch(%s, %s)",
                          [["known", *names], ["k"] * 11])
            else:
                copy_rows(p, [(q, None, None, "k", "{}", None, None) for q in ["known", *names]])
                p.execute("select awa.enqueue_copied()")
        n = before[0]
        assert err.value.diag.message_primary == (
            f"queue limit reached: {n} queues exist and at most {n + 3} may;"
            " this call would create 10 more ('tenant-0', ...)")
    assert (queues(db), lane_ids_spent(db)) == before
    room_for(db, logins, 10)
    with db.connect(logins.producer) as p:
        p.execute("select count(*) from awa.enqueue_batch(%s, %s)", [names, ["k"] * 10])
    assert queues(db) == before[0] + 10


@pytest.mark.parametrize("layout", ["partitions", "stripes"])
def test_partitions_count_and_a_refused_call_leaves_none_behind(db, logins, layout):
    """Partitions and stripes count, and a call that makes more than there is
    room for is refused before it makes any: made one by one, each with its
    lanes, the refused call had spent the lane ids of those before the last
    place for good, at every try."""
    with db.connect(logins.producer) as p:
        enqueue(p, "orders")
    room_for(db, logins, 2)
    before = (queues(db), sequences(db), lane_ids_spent(db))
    change = (f"select * from awa.set_queue_{layout}('orders', 4)")
    first = "orders__p1" if layout == "partitions" else "orders#0"
    more = 3 if layout == "partitions" else 4
    for _ in range(2):
        with db.connect(logins.operator) as op, pytest.raises(LIMIT_REACHED) as err:
            op.execute(change)
        n = before[0]
        assert err.value.diag.message_primary == (
            f"queue limit reached: {n} queues exist and at most {n + 2} may;"
            f" this call would create {more} more ('{first}', ...)")
    assert (queues(db), sequences(db), lane_ids_spent(db)) == before
    room_for(db, logins, more)
    with db.connect(logins.operator) as op:
        assert len(op.execute(change).fetchall()) == 4
    assert queues(db) == before[0] + more


def test_below_the_limit_a_change_that_creates_nothing_passes(db, logins):
    """A limit lowered below the count refuses only new queues: a layout
    change that makes no member, and a batch of known names, pass."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_queue_partitions('orders', 3)")
        op.execute("select * from awa.set_queue_stripes('mail', 2)")
        room_for(db, logins, -2)
        before = queues(db)
        for change in ("select * from awa.set_queue_partitions('orders', 3)",
                       "select * from awa.set_queue_partitions('orders', 2)",
                       "select * from awa.set_queue_stripes('mail', 2)"):
            op.execute(change)
    with db.connect(logins.producer) as p:
        p.execute("select count(*) from awa.enqueue_batch(array['orders', 'mail', 'orders'],"
                  " array['k', 'k', 'k'])")
    assert queues(db) == before


def _create_behind(db, login, holder, queue):
    """The error of an enqueue to `queue` as `login` run while `holder` holds
    the provisioning lock (committed once it waits), or None."""
    with db.connect(login) as c:
        return behind(db, holder, c, lambda conn: enqueue(conn, queue)).error


def test_two_creations_at_the_last_place_one_wins(db, logins):
    room_for(db, logins, 1)
    with db.connect(logins.producer, autocommit=False) as a:
        enqueue(a, "first-in")
        error = _create_behind(db, logins.producer, a, "second-in")
    assert isinstance(error, LIMIT_REACHED)
    with db.connect() as su:
        names = {r[0] for r in su.execute("select queue from awa.queue_meta")}
    assert "first-in" in names and "second-in" not in names


def test_a_name_made_meanwhile_by_another_is_not_refused(db, logins):
    room_for(db, logins, 1)
    with db.connect(logins.producer, autocommit=False) as a:
        enqueue(a, "same")
        assert _create_behind(db, logins.producer, a, "same") is None
    with db.connect() as su:
        assert su.execute("select count(*) from awa.ready r join awa.queue_meta m"
                          " using (queue_id) where m.queue = 'same'").fetchone()[0] == 2


@pytest.mark.parametrize(("value", "error", "message"), [
    (None, psycopg.errors.NullValueNotAllowed, "max_queues must not be null"),
    (0, psycopg.errors.InvalidParameterValue,
     "max_queues must be between 1 and 1000000, got 0"),
    (1_000_001, psycopg.errors.InvalidParameterValue,
     "max_queues must be between 1 and 1000000, got 1000001"),
])
def test_set_max_queues_refuses_bad_values_and_changes_nothing(db, logins, value, error,
                                                                message):
    with db.connect(logins.operator) as op:
        with pytest.raises(error) as err:
            op.execute("select awa.set_max_queues(%s)", [value])
        assert err.value.diag.message_primary == message
        assert op.execute("select max_queues from awa.queue_limit").fetchone() == (10000,)


def test_set_max_queues_returns_the_queues_there_are_and_is_the_operators(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "one")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.set_max_queues(5)").fetchone() == (queues(db),)
    for login in (logins.producer, logins.worker, logins.reader, logins.maintenance):
        with db.connect(login) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("select awa.set_max_queues(100)")


def test_a_scrape_shows_the_queues_and_the_limit(db, logins):
    from awa_sql.metrics.database import scrape

    with db.connect(logins.producer) as p:
        for name in ("m1", "m2", "m3"):
            enqueue(p, name)
    room_for(db, logins, 7)
    with db.connect(logins.reader) as r:
        values = {f.name: f.samples[0].value for f in scrape(r)
                  if f.name in ("awa_queues", "awa_queues_max")}
    assert values == {"awa_queues": queues(db), "awa_queues_max": queues(db) + 7}


def test_a_repeatable_read_creation_with_a_stale_snapshot_cannot_pass_the_limit(db, logins):
    """A count from the caller's snapshot saw room that later creations had
    taken: each such transaction created queues past the limit."""
    with db.connect(logins.producer) as p:
        enqueue(p, "known")
    room_for(db, logins, 2)
    cap = queues(db) + 2
    with db.connect(logins.producer, autocommit=False) as old:
        old.execute("begin isolation level repeatable read")
        enqueue(old, "known")  # the snapshot, taken before the others' creations
        with db.connect(logins.producer) as p:
            enqueue(p, "fill-1")
            enqueue(p, "fill-2")
        with pytest.raises((psycopg.errors.SerializationFailure, LIMIT_REACHED)):
            enqueue(old, "late-1")
        old.rollback()
    assert queues(db) == cap


def test_the_count_follows_creations_and_a_rollback_gives_the_place_back(db, logins):
    def counted() -> int:
        with db.connect(logins.reader) as r:
            return r.execute("select queues from awa.queue_limit").fetchone()[0]

    assert counted() == queues(db)
    with db.connect(logins.producer, autocommit=False) as p:
        enqueue(p, "rolled-back")
        p.rollback()
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_queue_partitions('parted', 3)")
    assert counted() == queues(db)
    room_for(db, logins, 0)
    with db.connect(logins.producer) as p, pytest.raises(LIMIT_REACHED):
        enqueue(p, "refused")
    assert counted() == queues(db)


@pytest.mark.parametrize(("existing", "cap"), [(0, 10_000), (6_000, 12_000),
                                               (600_000, 1_000_000)])
def test_the_upgrade_gives_an_install_with_many_queues_twice_what_it_has(db, existing, cap):
    """Migration 0029 on an install that already has queues: a day after the
    upgrade, its producers may still make new ones."""
    from awa_sql.source import load_migrations

    (migration,) = [m for m in load_migrations() if m.version == 29]
    with db.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("drop table awa.queue_limit")
        conn.execute("insert into awa.queue_meta (queue) select 'up-' || g"
                     " from generate_series(1, %s) g", [existing])
        conn.execute(migration.text)
        n = conn.execute("select count(*) from awa.queue_meta").fetchone()[0]
        assert conn.execute("select max_queues, queues from awa.queue_limit").fetchone() == (
            cap, n)


# -- awa storage queue-limit -----------------------------------------------------------------


def limit(db) -> int:
    with db.connect() as su:
        return su.execute("select max_queues from awa.queue_limit").fetchone()[0]


@pytest.mark.one_version
def test_awa_storage_queue_limit_shows_and_sets_the_limit(db, logins):
    """The runbook's "raise the queue limit" without SQL: read as a reader,
    set as an operator, for people and for scripts."""
    with db.connect(logins.producer) as p:
        enqueue(p, "one")
    shown = db.awa("storage", "queue-limit", user=logins.reader, check=True)
    assert shown.stdout == "queue limit 10000: 1 queue exists\n"
    as_json = db.awa("storage", "queue-limit", "--json", user=logins.reader, check=True)
    assert json.loads(as_json.stdout) == {"max_queues": 10000, "queues": 1}
    raised = db.awa("storage", "queue-limit", "20000", user=logins.operator, check=True)
    assert raised.stdout == "queue limit 20000 (was 10000): 1 queue exists\n"
    assert limit(db) == 20000
    lowered = db.awa("storage", "queue-limit", "5", "--json", user=logins.operator, check=True)
    assert json.loads(lowered.stdout) == {"max_queues": 5, "previous": 20000, "queues": 1}


@pytest.mark.one_version
@pytest.mark.parametrize("value", ["0", "-5", "1000001"])
def test_awa_storage_queue_limit_out_of_range_exits_2_with_the_database_s_message(
        db, logins, value):
    with db.connect(logins.operator) as op, pytest.raises(psycopg.Error) as sql:
        op.execute("select awa.set_max_queues(%s)", [int(value)])
    result = db.awa("storage", "queue-limit", value, user=logins.operator)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"awa: {sql.value.diag.message_primary} [22023]\n"
    assert f"between 1 and 1000000, got {value}" in result.stderr
    assert limit(db) == 10000


@pytest.mark.one_version
@pytest.mark.parametrize(("value", "says"), [
    ("2147483648", "a PostgreSQL integer (-2147483648..2147483647), got '2147483648'"),
    ("-2147483649", "a PostgreSQL integer (-2147483648..2147483647), got '-2147483649'"),
    ("lots", "a whole number, got 'lots'"),
    ("1.5", "a whole number, got '1.5'"),
])
def test_awa_storage_queue_limit_that_is_no_integer_exits_2_naming_it(db, logins, value, says):
    result = db.awa("storage", "queue-limit", value, user=logins.operator)
    assert result.returncode == 2, result.stderr
    assert f"argument MAX_QUEUES: the queue limit must be {says}" in result.stderr
    assert limit(db) == 10000


@pytest.mark.one_version
def test_awa_storage_queue_limit_set_by_a_reader_exits_7_naming_the_role(db, logins):
    result = db.awa("storage", "queue-limit", "20000", user=logins.reader)
    assert result.returncode == 7, result.stderr
    assert "permission denied for function set_max_queues" in result.stderr
    assert "this command needs a login that holds awa_operator" in result.stderr
    assert limit(db) == 10000
