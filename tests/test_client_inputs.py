"""What the Python client refuses before it sends anything: job fields it does
not know, a run_at that is not an aware datetime, a max_run_time or
unique_window that is not a timedelta, a job COPY could not send, a unique
key helper's lone surrogate, and Worker settings it could not run with.
The enqueue cases run against real PostgreSQL 17 and 18, where the same input
used to be sent, its typo or its time zone silently lost."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import tracemalloc
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg.pq import TransactionStatus

import awa_sql
from awa_sql import PartitionedQueue, client
from awa_sql.worker import MAX_LEASE, MAX_NAME_BYTES, Worker
from tests.support.jobs import claim

NAIVE = datetime(2999, 1, 1)


def ready_count(db) -> int:
    with db.connect() as admin:
        return admin.execute("select count(*) from awa.ready").fetchone()[0]


@pytest.mark.parametrize("call", ["enqueue_many", "enqueue_many_copy"])
def test_a_job_field_it_does_not_know_is_refused(db, logins, call):
    jobs = [{"kind": "a"}, {"kind": "a", "priorty": 1, "ordering_kye": "x"}]
    with db.connect(logins.producer) as conn, pytest.raises(TypeError) as raised:
        getattr(awa_sql, call)(conn, jobs, queue="typos")
    message = str(raised.value)
    assert "job 2 (1-based)" in message
    assert "['ordering_kye', 'priorty']" in message
    assert "allowed: kind, args, queue, priority, ordering_key" in message
    assert ready_count(db) == 0


def test_enqueue_many_counts_jobs_from_one(db, logins):
    with db.connect(logins.producer) as conn:
        with pytest.raises(ValueError, match=re.escape("job 1 (1-based) has no kind")):
            awa_sql.enqueue_many(conn, [{"args": {}}], queue="q")
        with pytest.raises(ValueError, match=re.escape("job 2 (1-based) has no queue")):
            awa_sql.enqueue_many(conn, [{"kind": "a", "queue": "q"}, {"kind": "b"}])
        with pytest.raises(ValueError, match=re.escape("job 2 (1-based) has no kind")):
            awa_sql.enqueue_many_copy(conn, [{"kind": "a"}, {}], queue="q")
    assert ready_count(db) == 0


@pytest.mark.parametrize("call", [
    lambda conn: awa_sql.enqueue(conn, "a", queue="naive", run_at=NAIVE),
    lambda conn: awa_sql.enqueue_many(conn, [{"kind": "a", "run_at": NAIVE}], queue="naive"),
    lambda conn: awa_sql.enqueue_many(conn, [{"kind": "a"}], queue="naive", run_at=NAIVE),
    lambda conn: awa_sql.enqueue_many_copy(conn, [{"kind": "a", "run_at": NAIVE}],
                                           queue="naive"),
], ids=["enqueue", "enqueue_many", "enqueue_many default", "enqueue_many_copy"])
def test_a_naive_run_at_is_refused(db, logins, call):
    with db.connect(logins.producer) as conn:
        with pytest.raises(ValueError, match=re.escape(
                "run_at must be an aware datetime (with tzinfo), got "
                "datetime.datetime(2999, 1, 1, 0, 0)")):
            call(conn)
        awa_sql.enqueue(conn, "a", queue="naive", run_at=datetime(2999, 1, 1, tzinfo=UTC))
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.scheduled").fetchone()[0] == 1


def _enqueue_in(conn, dsn: str, path: str, job: dict, where: str) -> None:
    """``job`` through ``path``: as enqueue's keywords, as the second job of
    a call of many, or (``where`` "the default ") as the call's default."""
    if path == "enqueue":
        awa_sql.enqueue(conn, "k", queue="times", **job)
    elif path == "enqueue_async":
        async def go():
            async with await psycopg.AsyncConnection.connect(dsn) as a:
                await awa_sql.enqueue_async(a, "k", queue="times", **job)
        asyncio.run(go())
    elif where == "the default ":
        getattr(awa_sql, path)(conn, [{"kind": "k"}], queue="times", **job)
    else:
        getattr(awa_sql, path)(conn, [{"kind": "k"}, {"kind": "k", **job}], queue="times")


AWARE = "run_at must be an aware datetime (with tzinfo) or None, got"
TIMEDELTA = "must be a timedelta or None, got"


@pytest.mark.one_version  # the client's checks, before anything is sent
@pytest.mark.parametrize(("path", "where"), [
    ("enqueue", ""), ("enqueue_async", ""), ("enqueue_many", "job 2 (1-based): "),
    ("enqueue_many", "the default "), ("enqueue_many_copy", "job 2 (1-based): "),
], ids=["enqueue", "enqueue_async", "enqueue_many", "enqueue_many default",
        "enqueue_many_copy"])
@pytest.mark.parametrize(("job", "message"), [
    ({"run_at": "2030-01-01 10:00"}, f"{AWARE} '2030-01-01 10:00' (str)"),
    ({"run_at": date(2030, 1, 1)}, f"{AWARE} datetime.date(2030, 1, 1) (date)"),
    ({"run_at": 1893456000}, f"{AWARE} 1893456000 (int)"),
    ({"max_run_time": 90}, f"max_run_time {TIMEDELTA} 90 (int)"),
    ({"max_run_time": "90 seconds"}, f"max_run_time {TIMEDELTA} '90 seconds' (str)"),
    ({"unique_key": b"k", "unique_window": 3600}, f"unique_window {TIMEDELTA} 3600 (int)"),
    ({"unique_key": b"k", "unique_window": "1 hour"},
     f"unique_window {TIMEDELTA} '1 hour' (str)"),
], ids=["run_at str", "run_at date", "run_at int", "max_run_time int", "max_run_time str",
        "unique_window int", "unique_window str"])
def test_times_of_another_type_are_refused_alike_on_every_path(db, logins, path, where, job,
                                                               message):
    """A str or a date run_at was read in the session's TimeZone; an int
    max_run_time was 90 seconds through COPY and a cast error (42846, the
    transaction aborted) through the others."""
    with db.connect(logins.producer, autocommit=False) as conn:
        conn.execute("select 1")
        with pytest.raises(TypeError, match=f"^{re.escape(where + message)}$"):
            _enqueue_in(conn, db.dsn(logins.producer), path, job, where)
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.execute("select 1")
    assert ready_count(db) == 0


# What enqueue and enqueue_many raise for a job psycopg cannot send:
# enqueue_many_copy raises the same, before its COPY starts.
NUL = "PostgreSQL text fields cannot contain NUL (0x00) bytes"
CANNOT_SEND = [
    ({"args": {"at": datetime(2030, 1, 1, tzinfo=UTC)}},
     TypeError, "Object of type datetime is not JSON serializable"),
    ({"args": {"x": Decimal("1.5")}}, TypeError, "Object of type Decimal is not JSON serializable"),
    ({"args": {"s": {1, 2}}}, TypeError, "Object of type set is not JSON serializable"),
    ({"kind": "a\x00b"}, psycopg.DataError, NUL),
    ({"queue": "q\x00"}, psycopg.DataError, NUL),
    ({"kind": "k\ud800"}, UnicodeEncodeError,
     "'utf-8' codec can't encode character '\\ud800' in position 1: surrogates not allowed"),
    ({"queue": "q\udc00"}, UnicodeEncodeError,
     "'utf-8' codec can't encode character '\\udc00' in position 1: surrogates not allowed"),
]


@pytest.mark.one_version  # the client's encoding, before its COPY starts
@pytest.mark.parametrize(("bad", "error", "message"), CANNOT_SEND,
                         ids=["args datetime", "args Decimal", "args set", "kind NUL",
                              "queue NUL", "kind surrogate", "queue surrogate"])
@pytest.mark.parametrize("path", ["enqueue", "enqueue_many", "enqueue_many_copy"])
def test_a_job_that_cannot_be_sent_leaves_the_callers_transaction_usable(
        db, logins, path, bad, error, message):
    """enqueue_many_copy met such a job in write_row, its COPY started: the
    caller's transaction was left failed, and a commit after catching the
    error rolled back the caller's own writes."""
    with db.connect() as admin:
        admin.execute("create table caller_writes (n int)")
        admin.execute(f'grant insert, select on caller_writes to "{logins.producer}"')
    with db.connect(logins.producer, autocommit=False) as conn:
        conn.execute("insert into caller_writes values (1)")
        awa_sql.enqueue(conn, "before", queue="mine")
        job = {"kind": "k", "queue": "mine", "args": {"n": 1}, **bad}
        with pytest.raises(error) as raised:
            if path == "enqueue":
                awa_sql.enqueue(conn, job.pop("kind"), job.pop("args"), **job)
            else:
                getattr(awa_sql, path)(conn, [{"kind": "k", "queue": "mine"}, job])
        assert type(raised.value) is error and str(raised.value) == message
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.execute("insert into caller_writes values (2)")
        conn.commit()
    with db.connect() as admin:
        assert admin.execute("select array_agg(n order by n) from caller_writes"
                             ).fetchone()[0] == [1, 2]
        assert admin.execute("select kind from awa.ready").fetchall() == [("before",)]


@pytest.mark.parametrize(("kind", "args", "where"), [
    ("k\ud800", None, "kind holds a lone surrogate ('\\ud800' at index 1)"),
    ("k", {"to": "a\udc00"}, "args['to'] holds a lone surrogate ('\\udc00' at index 1)"),
    ("k", {"\ud800x": 1},
     "the key '\\ud800x' of args holds a lone surrogate ('\\ud800' at index 0)"),
    ("k", {"l": [1, {"z": "\udfff"}]},
     "args['l'][1]['z'] holds a lone surrogate ('\\udfff' at index 0)"),
], ids=["kind", "value", "key", "nested"])
def test_unique_key_refuses_a_lone_surrogate_naming_where(kind, args, where):
    """It raised UnicodeEncodeError from inside the hashing (and said nothing
    of the kind's); Node hashed U+FFFD in its place."""
    with pytest.raises(ValueError, match=f"^{re.escape(where)}: it is not text, which UTF-8"
                       " cannot encode nor PostgreSQL store$"):
        awa_sql.unique_key(kind, args)


def test_unique_key_of_none_args_is_that_of_empty_args():
    assert awa_sql.unique_key("k", None) == awa_sql.unique_key("k") == awa_sql.unique_key("k", {})
    assert awa_sql.unique_key("k", {"pair": "\U0001f600"}) != awa_sql.unique_key("k")


def worker(**settings) -> Worker:
    settings = {"queues": ["q"], "handlers": {}, **settings}
    return Worker("dbname=unused", **settings)


@pytest.mark.parametrize(("settings", "message"), [
    ({"lease": timedelta(0)}, "lease must be a positive timedelta of at most 30 days,"
     " got 0:00:00"),
    ({"lease": timedelta(seconds=-5)}, "lease must be a positive timedelta of at most 30 days,"
     " got -1 day, 23:59:55"),
    ({"lease": 30}, "lease must be a positive timedelta of at most 30 days, got 30"),
    ({"lease": MAX_LEASE + timedelta(microseconds=1)}, "lease must be a positive timedelta"
     " of at most 30 days, got 30 days, 0:00:00.000001"),
    ({"name": "é" * 128}, "name must be at most 255 bytes in UTF-8, got 256 bytes: 'ééé"),
    ({"name": 7}, "name must be a str (or None: generated), got 7"),
    ({"name": "w\x00"}, "name must be text PostgreSQL can store (no NUL, no lone surrogate),"
     " got 'w\\x00'"),
    ({"name": "w\ud800"}, "name must be text PostgreSQL can store (no NUL, no lone surrogate),"
     " got 'w\\ud800'"),
    ({"lease": timedelta(seconds=30), "heartbeat_every": timedelta(seconds=30)},
     "heartbeat_every must be more than 0 and less than the lease (0:00:30), got 0:00:30"),
    ({"heartbeat_every": timedelta(seconds=-1)},
     "heartbeat_every must be more than 0 and less than the lease (0:05:00), got -1 day"),
    ({"poll_interval": 0}, "poll_interval must be more than 0 seconds, got 0"),
    ({"poll_interval": -1.5}, "poll_interval must be more than 0 seconds, got -1.5"),
    ({"batch": 0}, "batch must be an integer of 1 or more, got 0"),
    ({"batch": 2.5}, "batch must be an integer of 1 or more, got 2.5"),
    ({"shutdown_timeout": -1}, "shutdown_timeout must be 0 or more seconds (or None: wait for"
     " every handler), got -1"),
    ({"shutdown_timeout": float("inf")}, "shutdown_timeout must be 0 or more seconds (or None:"
     " wait for every handler), got inf"),
    ({"shutdown_timeout": True}, "shutdown_timeout must be 0 or more seconds (or None: wait"
     " for every handler), got True"),
    ({"shutdown_timeout": timedelta(seconds=5)}, "shutdown_timeout must be 0 or more seconds"
     " (or None: wait for every handler), got 0:00:05"),
    ({"maintain": {"promote": 0.001}},
     "maintain: the cadence of promote must be between 0.05 and 3600 seconds, or None (off), "
     "got 0.001"),
    ({"maintain": {"prune": 7200}},
     "maintain: the cadence of prune must be between 0.05 and 3600 seconds, or None (off), "
     "got 7200"),
    ({"queues": [{"queue": "q", "max_workers": 0}]},
     "queue q: max_workers must be an integer of 1 or more (or None: 1), got 0"),
    ({"queues": [{"queue": "q", "max_workers": -2}]},
     "queue q: max_workers must be an integer of 1 or more (or None: 1), got -2"),
    ({"queues": [{"queue": "q", "max_workers": "4"}]},
     "queue q: max_workers must be an integer of 1 or more (or None: 1), got '4'"),
    ({"queues": [{"queue": "q", "max_worker": 4}]},
     "queue q: unknown key 'max_worker' (value 4); the Worker takes queue, max_workers and family"),
    ({"queues": [{"max_workers": 4}]},
     "queue config 1 (1-based) has no queue name: {'max_workers': 4}"),
    ({"queues": PartitionedQueue("p", 2).queue_configs(min_workers_per_partition=1)},
     "queue p: min_workers 1 is not supported: the Worker runs max_workers slots per queue "
     "and takes queue, max_workers and family"),
    ({"queues": PartitionedQueue("p", 2).queue_configs(rate_limit_per_partition=5.0)},
     "queue p: rate_limit 5.0 is not supported: the Worker runs max_workers slots per queue "
     "and takes queue, max_workers and family"),
])
def test_worker_settings_it_cannot_run_with_are_refused(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        worker(**settings)


def test_worker_settings_at_their_bounds_are_taken():
    configs = PartitionedQueue("p", 2).queue_configs(max_workers_per_partition=3)
    w = worker(queues=configs, lease=timedelta(seconds=1), poll_interval=0.001, batch=1,
               maintain={"promote": 0.05, "prune": 3600, "rescue": None}, shutdown_timeout=0)
    assert [c["max_workers"] for c in w.configs] == [3, 3]
    assert w.heartbeat_every == timedelta(seconds=1) / 3
    assert worker(queues=[{"queue": "q"}, {"queue": "r", "max_workers": None}]).configs
    assert worker(shutdown_timeout=None).shutdown_timeout is None


def name_of(size: int) -> str:
    """A name of ``size`` bytes in UTF-8, of three-byte characters but for the end."""
    return "€" * (size // 3) + "a" * (size % 3)


def test_the_workers_lease_and_name_bounds_are_those_awa_claim_takes(db, logins):
    """The Worker refuses at construction what awa.claim would refuse at every
    claim: the bounds in awa_sql.worker are the server's, at both edges."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array['wb', 'wb', 'wb'], array['k', 'k', 'k'])")
    longest, too_long = name_of(MAX_NAME_BYTES), name_of(MAX_NAME_BYTES + 1)
    assert (len(longest), len(too_long)) == (85, 86)  # characters: bytes, not characters, count
    with db.connect(logins.worker) as w:
        assert len(claim(w, ["wb"], 1, lease=MAX_LEASE)) == 1
        assert len(claim(w, ["wb"], 1, worker=longest)) == 1
        assert len(claim(w, ["wb"], 1, worker="")) == 1  # no lower bound to mirror
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 30 days"):
            claim(w, ["wb"], 1, lease=MAX_LEASE + timedelta(microseconds=1))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 255 bytes"):
            claim(w, ["wb"], 1, worker=too_long)
    assert worker(lease=MAX_LEASE).lease == MAX_LEASE
    assert worker(name=longest).name == longest
    with pytest.raises(ValueError, match="lease must be a positive timedelta of at most 30"):
        worker(lease=MAX_LEASE + timedelta(microseconds=1))
    with pytest.raises(ValueError, match="name must be at most 255 bytes in UTF-8, got 256"):
        worker(name=too_long)
    # '' is taken, as awa.claim takes it, and stands for a generated name.
    assert worker(name="").name.startswith(f"{socket.gethostname()}:{os.getpid()}:")


def test_a_workers_default_name_is_new_at_every_start():
    """awa.release_worker releases every job claimed under a name: a worker
    started again on the same host with the same pid (a container's pid 1),
    or a second Worker in one process, must not share the first one's."""
    first, second = worker().name, worker().name
    assert first != second
    host, pid, token = first.rsplit(":", 2)
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert re.fullmatch("[0-9a-f]{6}", token)
    assert worker(name="fixed").name == "fixed"


def test_one_queue_name_given_as_a_string_is_one_queue():
    from awa_sql.partitions import iter_configs
    assert iter_configs("emails") == [{"queue": "emails"}]
    assert iter_configs(["emails", "sms"]) == [{"queue": "emails"}, {"queue": "sms"}]


def test_one_config_dict_is_one_queue_and_a_list_may_mix_kinds():
    """A lone dict was iterated as names: queues "queue" and "max_workers",
    polled forever with no error."""
    from awa_sql.partitions import PartitionedQueue, iter_configs
    assert iter_configs({"queue": "emails", "max_workers": 2}) == [
        {"queue": "emails", "max_workers": 2}]
    pq = PartitionedQueue("orders", 2)
    assert iter_configs([pq, "emails"]) == [*pq.queue_configs(), {"queue": "emails"}]


@pytest.mark.parametrize(("queues", "message"), [
    (b"emails", "queues must be a queue name, a config dict, a PartitionedQueue or a list"
                " of them, got b'emails'"),
    (5, "queues must be a queue name, a config dict, a PartitionedQueue or a list of them,"
        " got 5"),
    (["emails", 5], "queues item 2 (1-based) must be a queue name, a config dict or a"
                    " PartitionedQueue, got 5"),
    ([b"emails"], "queues item 1 (1-based) must be a queue name, a config dict or a"
                  " PartitionedQueue, got b'emails'"),
])
def test_queues_of_another_type_are_refused_by_name(queues, message):
    with pytest.raises(ValueError) as raised:
        worker(queues=queues)
    assert str(raised.value) == message


BAD_OPTIONS = [
    ({"max_run_time": timedelta(seconds=-1)},
     # psycopg sends timedelta(seconds=-1) as -1 days 86399 seconds.
     "max_run_time must be between 1 second and 30 days, got -1 days +23:59:59"),
    ({"unique_key": b""}, "unique_key must be 1 to 1024 bytes, got 0"),
    ({"unique_window": timedelta(hours=1)}, "unique_window 01:00:00 needs a unique_key"),
    ({"max_run_time": timedelta(minutes=1), "run_at": datetime(9999, 12, 31, 12, tzinfo=UTC)},
     "run_at must be before 9999-12-31 00:00:00+00, got 9999-12-31 12:00:00 UTC"),
]


def _single_enqueue_error(raised, message) -> None:
    """A single enqueue's error, as awa.enqueue words it: no batch element,
    its SQLSTATE and diagnostics kept."""
    error = raised.value
    assert error.diag.message_primary == message
    assert str(error).splitlines()[0] == message  # what a traceback shows first
    assert (error.sqlstate, error.diag.sqlstate) == ("22023", "22023")
    assert error.diag.context  # the PL/pgSQL context is kept


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_a_single_enqueue_with_options_names_no_batch_element(db, logins, options, message):
    """A job with a max run time or a unique key goes as a batch of one
    (awa.enqueue takes no max run time, ADR 026): its error said "batch
    element 1 (1-based): ..." of a batch the caller never made."""
    with awa_sql.Producer(db.dsn(logins.producer), snapshot_every=None) as producer, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        producer.enqueue("k", queue="one", **options)
    _single_enqueue_error(raised, message)
    with db.connect(logins.producer) as conn, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        awa_sql.enqueue(conn, "k", queue="one", **options)
    _single_enqueue_error(raised, message)

    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn(logins.producer)) as conn:
            await awa_sql.enqueue_async(conn, "k", queue="one", **options)

    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        asyncio.run(go())
    _single_enqueue_error(raised, message)
    # A batch, of one job too, still names the element.
    with db.connect(logins.producer) as conn, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        awa_sql.enqueue_many(conn, [{"kind": "k", **options}], queue="one")
    assert raised.value.diag.message_primary == f"batch element 1 (1-based): {message}"
    assert ready_count(db) == 0


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "unique keys"])
def test_enqueue_many_copy_takes_every_job_of_a_generator(db, logins, keyed):
    """Its jobs were read twice (the widest row, then the rows): a generator
    was used up by the first read, and its jobs dropped without an error
    (0 enqueued, or the first job of a keyed load missing)."""
    def jobs():
        for n in range(10):
            yield {"kind": "gen", "queue": "gen", "args": {"n": n},
                   **({"unique_key": b"k%d" % n} if keyed else {})}

    with db.connect(logins.producer) as conn:
        assert awa_sql.enqueue_many_copy(conn, jobs()) == 10
    with db.connect() as admin:
        assert admin.execute("select array_agg((args->>'n')::int order by job_id)"
                             " from awa.ready").fetchone()[0] == list(range(10))
        assert admin.execute("select count(*) from awa.unique_keys").fetchone()[0] == (
            10 if keyed else 0)


def test_enqueue_many_copy_keeps_its_data_in_a_file_past_the_memory_bound(
        db, logins, monkeypatch):
    """It formats every row before its COPY starts, and kept the whole load's
    data in memory to send it (13 MB more for 8 MB of args): past
    KEPT_IN_MEMORY the data waits in a temporary file."""
    monkeypatch.setattr(client, "KEPT_IN_MEMORY", 256 * 1024)
    jobs = [{"kind": "big", "queue": "big", "args": {"n": n, "pad": "x" * 1000}}
            for n in range(8000)]
    with db.connect(logins.producer) as conn:
        tracemalloc.start()
        try:
            assert awa_sql.enqueue_many_copy(conn, jobs) == 8000
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"{peak} bytes held for 8 MB of COPY data"
    with db.connect() as admin:
        assert admin.execute("select count(*), sum(length(args->>'pad')) from awa.ready"
                             ).fetchone() == (8000, 8_000_000)
