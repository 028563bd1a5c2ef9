"""The fast paths of awa.enqueue and awa.enqueue_batch give the jobs the general paths give.

awa.enqueue serves a job due now for a known plain queue, keyed or not, in
one lookup (else it routes the name first: awa._route_queue).
awa.enqueue_batch serves calls whose rows are all valid, unkeyed, due now,
for one plain queue at one priority with one lane range (else
awa._enqueue_rows); COPY ingestion does the same for a transaction's staged
rows, keyed ones too (else awa._move_staged_sets). Each case checks, beside
the stored jobs, which path served it (pg_stat_get_xact_function_calls), so a
case meant for one path cannot silently test the other.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from awa_sql import client, routing
from tests.support.jobs import claim_all, copy_rows, enqueue, function_calls


@contextlib.contextmanager
def tracked(db, login):
    """One transaction as `login` that counts function calls; commits at the end."""
    with db.connect(autocommit=False) as conn:
        conn.execute("set local track_functions = 'all'")
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(login)))
        yield conn




def batch(conn, params):
    """awa.enqueue_batch with these arrays; returns (rows, general path calls)."""
    before = function_calls(conn, "awa._enqueue_rows")
    names = ", ".join(f"{k} => %({k})s" for k in params if k not in ("queues", "kinds"))
    rows = conn.execute(
        f"select * from awa.enqueue_batch(%(queues)s::text[], %(kinds)s::text[]"
        f"{', ' if names else ''}{names})", params).fetchall()
    return rows, function_calls(conn, "awa._enqueue_rows") - before


def batch_as(db, login, params):
    with tracked(db, login) as conn:
        return batch(conn, params)


def stored(db, queue):
    with db.connect() as admin:
        return admin.execute(
            "select r.job_id, r.kind, r.args, r.priority, r.max_attempts, r.ordering_key,"
            "       r.attempt, l.shard, r.lane_seq"
            "  from awa.ready as r join awa.queue_meta as m using (queue_id)"
            "  join awa.lanes as l using (lane_id)"
            " where m.queue = %s order by r.lane_seq", [queue]).fetchall()


FAST_SHAPES = {
    "defaults": {},
    "every column given": {
        "args": [Jsonb({"i": i}) if i % 3 else None for i in range(30)],
        "priorities": [3] * 30,
        "max_attempts": [7] * 30,
        "ordering_keys": [None] * 30,
        "run_ats": [None] * 30,
    },
    "null elements meaning the defaults": {
        "priorities": [None] * 15 + [2] * 15,
        "max_attempts": [25] * 15 + [None] * 15,
    },
    "all-null priorities and max_attempts, as the Python client sends": {
        "priorities": [None] * 30,
        "max_attempts": [None] * 30,
    },
}


def _given(values, default):
    return next((v for v in values if v is not None), default)


@pytest.mark.parametrize("shape", sorted(FAST_SHAPES))
def test_fast_path_stores_what_it_was_given_in_input_order(db, logins, shape):
    extra = FAST_SHAPES[shape]
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('fast', 4)")
    kinds = [f"kind{i}" for i in range(30)]
    rows, general = batch_as(db, logins.producer,
                             {"queues": ["fast"] * 30, "kinds": kinds, **extra})
    assert general == 0
    priority = _given(extra.get("priorities", []), 2)
    attempts = _given(extra.get("max_attempts", []), 25)
    args = [a.obj if a else {} for a in extra.get("args", [None] * 30)]
    # one row per input, in input order, one lane, one contiguous range
    assert [r[1:3] for r in rows] == [("fast", priority)] * 30
    assert len({r[3] for r in rows}) == 1
    first = rows[0][4]
    assert [r[4] for r in rows] == list(range(first, first + 30))
    assert len({r[0] for r in rows}) == 30
    jobs = stored(db, "fast")
    assert [(j[0], j[8]) for j in jobs] == [(r[0], r[4]) for r in rows]
    assert [(j[1], j[2], j[3], j[4], j[5], j[6], j[7]) for j in jobs] == [
        (kinds[i], args[i], priority, attempts, None, 0, rows[0][3]) for i in range(30)]
    with db.connect(logins.worker) as w:
        assert [c[6] for c in claim_all(w, ["fast"])] == kinds


GENERAL_SHAPES = {
    "two queues": {"queues": ["fast", "other"] * 5},
    "a key": {"ordering_keys": [None] * 9 + [b"k"]},
    "a future run_at": {"run_ats": [None] * 9 + ["2999-01-01T00:00:00Z"]},
    "two priorities": {"priorities": [1] * 9 + [2]},
    "a null and another priority": {"priorities": [None] * 9 + [3]},
    "another priority and a null": {"priorities": [3] * 9 + [None]},
    "two max_attempts": {"max_attempts": [5] * 9 + [6]},
    "a new queue": {"queues": ["brand-new"] * 10},
    "a partitioned queue": {"queues": ["parted"] * 10},
}


@pytest.mark.parametrize("shape", sorted(GENERAL_SHAPES))
def test_other_calls_take_the_general_path(db, logins, shape):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('parted', 2)")
    with db.connect(logins.producer) as p:
        for q in ("fast", "other"):
            enqueue(p, q)
    params = {"queues": ["fast"] * 10, "kinds": ["k"] * 10, **GENERAL_SHAPES[shape]}
    rows, general = batch_as(db, logins.producer, params)
    assert general == 1
    assert len(rows) == 10


@pytest.mark.parametrize(("extra", "sqlstate", "words"), [
    ({"priorities": [5] * 3}, "22023", "batch element 1"),
    ({"priorities": [0] * 3}, "22023", "batch element 1"),
    ({"max_attempts": [0] * 3}, "22023", "batch element 1"),
    ({"kinds": ["k", None, "k"]}, "22004", "batch element 2"),
    ({"kinds": ["k", "k"]}, "22023", "kinds has 2 elements but queues has 3"),
    ({"args": [None]}, "22023", "args has 1 elements but queues has 3"),
    # Empty is a length, not "every default" (array_dims('{}') is null).
    ({"args": "{}"}, "22023", "args has 0 elements but queues has 3"),
    ({"priorities": "{}"}, "22023", "priorities has 0 elements but queues has 3"),
    ({"ordering_keys": "{}"}, "22023", "ordering_keys has 0 elements but queues has 3"),
    ({"unique_keys": "{}"}, "22023", "unique_keys has 0 elements but queues has 3"),
    ({"unique_windows": "{}"}, "22023", "unique_windows has 0 elements but queues has 3"),
    ({"kinds": "{}"}, "22023", "kinds has 0 elements but queues has 3"),
    ({"queues": ["x" * 201] * 3}, "22023", "batch element 1"),
    ({"queues": ["a#b"] * 3}, "22023", "batch element 1"),
    ({"queues": "[0:2]={fast,fast,fast}"}, "22023", "array queues must be one-dimensional"),
    ({"kinds": "[0:2]={a,b,c}"}, "22023", "array kinds must be one-dimensional and indexed "
                                          "from 1, got [0:2]"),
    ({"args": '[2:4]={"{}","{}","{}"}'}, "22023", "array args must be one-dimensional"),
    ({"priorities": "[0:2]={3,3,3}"}, "22023", "array priorities must be one-dimensional"),
    ({"max_attempts": "[0:2]={7,7,7}"}, "22023", "array max_attempts must be one-dimensional"),
    ({"kinds": "{{a,b},{c,d}}", "queues": ["fast"] * 4}, "22023",
     "array kinds must be one-dimensional and indexed from 1, got [1:2][1:2]"),
    ({"ordering_keys": "{{NULL,NULL},{NULL,NULL}}", "queues": ["fast"] * 4,
      "kinds": ["k"] * 4}, "22023", "array ordering_keys must be one-dimensional"),
    ({"run_ats": "{{NULL},{NULL},{NULL}}"}, "22023", "array run_ats must be one-dimensional"),
])
def test_bad_calls_that_look_fast_fail_like_the_general_path(db, logins, extra, sqlstate,
                                                             words):
    with db.connect(logins.producer) as p:
        enqueue(p, "fast")
    params = {"queues": ["fast"] * 3, "kinds": ["k"] * 3, **extra}
    with pytest.raises(psycopg.Error) as err:
        batch_as(db, logins.producer, params)
    assert err.value.sqlstate == sqlstate
    assert words in str(err.value)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 1


def test_an_empty_batch_with_empty_arrays_enqueues_nothing(db, logins):
    params = {"queues": [], "kinds": [], "args": "{}", "ordering_keys": "{}",
              "unique_keys": "{}"}
    rows, _general = batch_as(db, logins.producer, params)
    assert rows == []
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0


def test_fast_path_keeps_the_lane_its_transaction_holds(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('sticky', 8)")
    with tracked(db, logins.producer) as conn:
        single = enqueue(conn, "sticky")
        first, general = batch(conn, {"queues": ["sticky"] * 5, "kinds": ["k"] * 5})
        second, _ = batch(conn, {"queues": ["sticky"] * 5, "kinds": ["k"] * 5})
    assert general == 0
    assert {r[3] for r in first + second} == {single[3]}
    assert [r[4] for r in first + second] == list(range(single[4] + 1, single[4] + 11))


def test_keyed_enqueue_goes_to_its_key_lane_and_unkeyed_jobs_follow_it(db, logins):
    """A keyed job on a plain queue takes the fast path to its key's lane; the
    transaction then holds that lane for (queue, priority), so its unkeyed jobs
    join it, as in the general path."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('keyed-fast', 8)")
    keys = [f"key-{i}".encode() for i in range(40)]
    with tracked(db, logins.producer) as conn:
        for key in keys:
            got = enqueue(conn, "keyed-fast", ordering_key=key)
            assert got[3] == routing.shard_for_ordering_key(key, 8)
    with tracked(db, logins.producer) as conn:
        keyed = enqueue(conn, "keyed-fast", ordering_key=keys[0])
        unkeyed = [enqueue(conn, "keyed-fast") for _ in range(3)]
        assert function_calls(conn, "awa._route_queue") == 0
    assert {u[3] for u in unkeyed} == {keyed[3]}
    assert [u[4] for u in unkeyed] == [keyed[4] + 1, keyed[4] + 2, keyed[4] + 3]
    with db.connect() as admin:
        lanes = admin.execute(
            "select l.shard, array_agg(r.ordering_key order by r.lane_seq)"
            "  from awa.ready as r join awa.lanes as l using (lane_id)"
            "  join awa.queue_meta as m on m.queue_id = r.queue_id"
            " where m.queue = 'keyed-fast' and r.ordering_key is not null group by 1").fetchall()
    expected: dict[int, list[bytes]] = {}
    for key in [*keys, keys[0]]:  # per lane, in enqueue order
        expected.setdefault(routing.shard_for_ordering_key(key, 8), []).append(key)
    assert dict(lanes) == expected


def test_keyed_enqueue_to_a_partitioned_or_new_queue_takes_the_general_path(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('keyed-parted', 2)")
    with tracked(db, logins.producer) as conn:
        parted = enqueue(conn, "keyed-parted", ordering_key=b"k")
        fresh = enqueue(conn, "keyed-new", ordering_key=b"k")
        assert function_calls(conn, "awa._route_queue") == 2
    assert parted[1].startswith("keyed-parted")
    assert (fresh[1], fresh[3]) == ("keyed-new", 0)


def test_the_python_clients_batch_takes_the_fast_path(db, logins):
    """enqueue_many sends every column, None where a job sets nothing."""
    with db.connect(logins.producer) as p:
        enqueue(p, "client-fast")
    with tracked(db, logins.producer) as conn:
        got = client.enqueue_many(conn, [{"kind": f"k{i}"} for i in range(5)],
                                  queue="client-fast")
        assert function_calls(conn, "awa._enqueue_rows") == 0
    assert [g.lane_seq for g in got] == list(range(got[0].lane_seq, got[0].lane_seq + 5))


def test_a_stripes_own_name_is_refused_by_enqueue_as_by_the_batch(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_stripes('striped', 2)")
    with db.connect(logins.producer) as p:
        enqueue(p, "striped")
        for call in ("select awa.enqueue('striped#1', 'k')",
                     "select awa.enqueue('striped#1', 'k', ordering_key => 'x'::bytea)",
                     "select awa.enqueue_batch(array['striped#1'], array['k'])"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved for stripes"):
                p.execute(call)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 1


def copy_and_move(conn, rows, move):
    """COPY the rows, then move them by enqueue_copied() or as commit would."""
    copy_rows(conn, rows)
    if move == "enqueue_copied":
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == len(rows)
    else:  # the deferred trigger, fired now instead of at commit
        conn.execute("set constraints awa.copy_pending_move immediate")


COPY_FAST = {
    "defaults": lambda i: ("copy-fast", None, None, f"kind{i}", Jsonb({"i": i}), None, None),
    "every column, one priority": lambda i: (
        "copy-fast", 3, None, f"kind{i}", None if i % 4 else Jsonb({"i": i}), None, 7),
    "null elements meaning the defaults": lambda i: (
        "copy-fast", None if i % 2 else 2, None, f"kind{i}", None, None, None if i % 3 else 25),
}


@pytest.mark.parametrize("shape", sorted(COPY_FAST))
@pytest.mark.parametrize("move", ["enqueue_copied", "commit"])
def test_copy_to_one_lane_is_one_range_in_copy_order(db, logins, shape, move):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('copy-fast', 4)")
    rows = [COPY_FAST[shape](i) for i in range(500)]
    with tracked(db, logins.producer) as conn:
        copy_and_move(conn, rows, move)
        assert function_calls(conn, "awa._move_staged_sets") == 0
    jobs = stored(db, "copy-fast")
    assert len({j[7] for j in jobs}) == 1  # one lane
    first = jobs[0][8]
    assert [j[8] for j in jobs] == list(range(first, first + 500))
    assert [(j[1], j[2], j[3], j[4], j[5]) for j in jobs] == [
        (r[3], r[4].obj if r[4] else {}, r[1] or 2, r[6] or 25, None) for r in rows]
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


@pytest.mark.parametrize("move", ["enqueue_copied", "commit"])
def test_keyed_copy_to_one_queue_keeps_each_keys_order_in_its_lane(db, logins, move):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('copy-keyed', 4)")
    keys = [f"key-{i % 37}".encode() if i % 3 else None for i in range(2000)]
    rows = [("copy-keyed", None, k, "k", Jsonb({"i": i}), None, None)
            for i, k in enumerate(keys)]
    with tracked(db, logins.producer) as conn:
        copy_and_move(conn, rows, move)
        assert function_calls(conn, "awa._move_staged_sets") == 0
    jobs = stored(db, "copy-keyed")
    by_shard: dict[int, list] = {}
    for j in sorted(jobs, key=lambda j: (j[7], j[8])):
        by_shard.setdefault(j[7], []).append(j)
    for shard, lane in by_shard.items():
        first = lane[0][8]
        assert [j[8] for j in lane] == list(range(first, first + len(lane)))  # one range
        assert [j[2]["i"] for j in lane] == sorted(j[2]["i"] for j in lane)  # COPY order
        assert {routing.shard_for_ordering_key(j[5], 4) for j in lane if j[5]} <= {shard}
    unkeyed_shards = {j[7] for j in jobs if j[5] is None}
    assert len(unkeyed_shards) == 1  # the unkeyed rows share one lane
    assert sorted(j[2]["i"] for j in jobs) == list(range(2000))


COPY_GENERAL = {
    "two queues": lambda i: ("copy-fast" if i % 2 else "copy-other", None, None, "k", None,
                             None, None),
    "a future run_at": lambda i: ("copy-fast", None, None, "k", None,
                                  "2999-01-01T00:00:00Z" if i == 7 else None, None),
    "two priorities": lambda i: ("copy-fast", 1 if i else 2, None, "k", None, None, None),
    "a new queue": lambda i: ("copy-new", None, None, "k", None, None, None),
    "a partitioned queue": lambda i: ("copy-parted", None, None, "k", None, None, None),
}


@pytest.mark.parametrize("shape", sorted(COPY_GENERAL))
def test_other_copies_take_the_set_based_path(db, logins, shape):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('copy-parted', 2)")
    with db.connect(logins.producer) as p:
        for q in ("copy-fast", "copy-other"):
            enqueue(p, q)
    with tracked(db, logins.producer) as conn:
        copy_rows(conn, [COPY_GENERAL[shape](i) for i in range(20)])
        assert conn.execute("select awa.enqueue_copied()").fetchone()[0] == 20
        assert function_calls(conn, "awa._move_staged_sets") == 1


@pytest.mark.parametrize(("row", "words"), [
    (("copy-fast", 5, None, "k", None, None, None), "priority"),
    (("copy-fast", None, None, None, None, None, None), "kind"),
    (("copy-fast", None, None, "k", None, None, 0), "max_attempts"),
    (("", None, None, "k", None, None, None), "queue"),
])
def test_a_bad_row_in_a_one_lane_copy_is_named_and_nothing_moves(db, logins, row, words):
    with db.connect(logins.producer) as p:
        enqueue(p, "copy-fast")
    rows = [("copy-fast", None, None, "k", None, None, None)] * 9 + [row]
    with (pytest.raises(psycopg.Error, match=f"COPY row 10 .*{words}"),
          tracked(db, logins.producer) as conn):
        copy_rows(conn, rows)
        conn.execute("select awa.enqueue_copied()")
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 1
        assert admin.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


@pytest.mark.parametrize(("argument", "words"), [
    ("priority", "priority must not be null (1 to 4; leave it out for the default, 2)"),
    ("max_attempts",
     "max_attempts must not be null (1 to 1000; leave it out for the default, 25)"),
])
def test_a_single_enqueue_with_a_null_setting_is_22004_naming_the_default(db, logins, argument,
                                                                         words):
    """A null is a missing required value (22004), as for every other call;
    it was 22023 'got null'. The batch's null element is its default."""
    with db.connect(logins.producer) as p, pytest.raises(psycopg.Error) as err:
        p.execute(f"select * from awa.enqueue('nulls', 'k', {argument} => null)")
    assert (err.value.sqlstate, err.value.diag.message_primary) == ("22004", words)
