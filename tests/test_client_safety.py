"""The Python client's guards: a Producer shared by threads or given a
connection inside a transaction, a malformed DSN's password, the snapshot
cadence, the types of keys, unique_key's object keys, whose
application_name wins, and the queues a COPY is noted under."""

from __future__ import annotations

import json
import logging
import threading
import time

import psycopg
import pytest

import awa_sql
from awa_sql import routing
from awa_sql.admin.app import Settings, make_pool
from awa_sql.connect import KEEPALIVES, connect, network_defaults
from awa_sql.maintain import Maintainer
from awa_sql.runtimes import RuntimePublisher
from awa_sql.unique import unique_key
from awa_sql.worker import Worker


@pytest.fixture
def producer_login(db) -> str:
    return db.login_role("awa_producer")


def stored(db, queue: str, job_ids: list[int]) -> int:
    with db.connect() as admin:
        return admin.execute(
            "select count(*) from awa.jobs(%s, max_jobs => 100000) where job_id = any(%s)",
            [queue, job_ids]).fetchone()[0]


# -- 1. a Producer shared by threads, or given a connection inside a transaction ------------


def test_threads_sharing_a_producer_commit_every_call(db, producer_login):
    """Before, a second thread's call became a savepoint of the first's
    transaction: calls returned jobs that were never committed, and the
    connection stayed inside a transaction for good."""
    ids: list[int] = []
    refused: list[Exception] = []
    others: list[Exception] = []
    start = threading.Barrier(5)
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=None) as producer:

        def good() -> None:
            start.wait()
            for _ in range(100):
                try:
                    ids.append(producer.enqueue("good", queue="shared").job_id)
                except Exception as err:  # any other: none is expected
                    others.append(err)

        def bad() -> None:  # each call fails in its own transaction
            start.wait()
            for _ in range(100):
                try:
                    producer.enqueue("bad", queue="no#such")  # '#': 22023 from the server
                except psycopg.errors.InvalidParameterValue as err:
                    refused.append(err)
                except Exception as err:  # any other: none is expected
                    others.append(err)

        threads = [threading.Thread(target=good) for _ in range(4)]
        threads.append(threading.Thread(target=bad))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert others == []
        assert len(refused) == 100
        assert producer._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        last = producer.enqueue("after", queue="shared").job_id
    assert len(ids) == 400
    assert stored(db, "shared", [*ids, last]) == 401


def test_a_producer_refuses_a_connection_inside_a_transaction(db, producer_login):
    with db.connect(producer_login, autocommit=False) as conn:
        producer = awa_sql.Producer(conn=conn, snapshot_every=None)
        conn.execute("select 1")  # the caller's transaction is open
        calls = (lambda: producer.enqueue("k", queue="mine"),
                 lambda: producer.enqueue_many([{"kind": "k"}], queue="mine"),
                 lambda: producer.enqueue_many_copy([{"kind": "k"}], queue="mine"))
        for call in calls:
            with pytest.raises(psycopg.ProgrammingError) as refused:
                call()
            assert "not idle (transaction status INTRANS)" in str(refused.value)
            assert "use awa_sql.enqueue(conn, ...)" in str(refused.value)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
        with db.connect() as admin:
            assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0
        # Idle again, the calls run and commit.
        got = producer.enqueue("k", queue="mine")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert stored(db, "mine", [got.job_id]) == 1


def test_a_producer_rolls_back_its_own_connection_found_in_a_transaction(
        db, producer_login, caplog):
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=None) as producer:
        # Its connection used outside its calls: an enqueue left uncommitted.
        stray = producer._conn.execute(
            "select job_id from awa.enqueue('own', 'stray')").fetchone()[0]
        with caplog.at_level(logging.WARNING, logger="awa_sql.client"):
            kept = producer.enqueue("kept", queue="own")
    assert "producer: its connection was left in a transaction (INTRANS); rolling it back" in [
        r.getMessage() for r in caplog.records]
    assert stored(db, "own", [kept.job_id]) == 1
    assert stored(db, "own", [stray]) == 0


# -- 2. a malformed DSN's text is in no error ---------------------------------------------

BAD_DSNS = [
    # (DSN, the text of it that must not show)
    ("postgresql://app:s3cret%zz@127.0.0.1:1/db", "s3cret"),
    ("host=127.0.0.1 port=1 user=app password=correct horse", "horse"),
    ("host=127.0.0.1 port=1 user=app password=s3cret b", '"b"'),
    # A text that starts as one of libpq's own quotes ("=", "]") is the DSN's.
    ('postgresql://u:="s3cret%zz@127.0.0.1:1/db', "s3cret"),
    ('postgresql://u:]"s3cret%zz@127.0.0.1:1/db', "s3cret"),
]


@pytest.mark.parametrize(("dsn", "secret"), BAD_DSNS)
def test_a_malformed_dsn_is_refused_without_its_text(dsn, secret):
    makers = {
        "Producer": lambda: awa_sql.Producer(dsn),
        "Worker": lambda: Worker(dsn, queues=["q"], handlers={}, snapshot_every=None),
        "connect": lambda: connect(dsn),
        "network_defaults": lambda: network_defaults(dsn),
        "Maintainer": lambda: Maintainer(dsn),
    }
    for what, make in makers.items():
        with pytest.raises(psycopg.ProgrammingError) as refused:
            make()
        message = str(refused.value)
        assert secret not in message, what
        assert message.endswith("(the DSN's text is left out, as it may hold a password)"), what
        assert '"…"' in message, what
        assert refused.value.__cause__ is None and refused.value.__suppress_context__, what


def test_a_dsn_error_keeps_libpq_s_own_quotes():
    with pytest.raises(psycopg.ProgrammingError) as refused:
        network_defaults("host=127.0.0.1 password=s3cret b")
    assert str(refused.value) == (
        'missing "=" after "…" in connection info string'
        " (the DSN's text is left out, as it may hold a password)")


# -- 3. snapshot_every -----------------------------------------------------------------------


@pytest.mark.parametrize("every", [0, -1, 0.0, float("inf"), float("nan")])
def test_snapshot_every_must_be_a_positive_number_of_seconds(every):
    said = f"snapshot_every must be a positive number of seconds, or None for off, got {every!r}"
    with pytest.raises(ValueError) as refused:
        RuntimePublisher("", "producer", every=every)
    assert str(refused.value) == said
    with pytest.raises(ValueError) as refused:
        Worker("host=127.0.0.1 port=1", queues=["q"], handlers={}, snapshot_every=every)
    assert str(refused.value) == said
    # Refused before it connects: port 1 would raise OperationalError.
    with pytest.raises(ValueError) as refused:
        awa_sql.Producer("host=127.0.0.1 port=1 connect_timeout=2", snapshot_every=every)
    assert str(refused.value) == said


# -- 4. keys are str or bytes ----------------------------------------------------------------


@pytest.mark.parametrize("key", [5, True, -1])
def test_a_key_that_is_not_str_or_bytes_is_refused(db, producer_login, key):
    """``bytes(5)`` is five zero bytes; ``bytes(-1)`` raised "negative count"."""
    kind = type(key).__name__
    with pytest.raises(TypeError, match=f"a key must be str or bytes .*, got {kind}: {key}"):
        routing.shard_for_ordering_key(key, 4)
    with pytest.raises(TypeError, match=f"^ordering_key must be .*, got {kind}: {key}"):
        awa_sql.PartitionedQueue("orders", 4).route_by_key(key)
    with db.connect(producer_login, autocommit=False) as conn:
        with pytest.raises(TypeError, match=f"^ordering_key must be .*, got {kind}: {key}"):
            awa_sql.enqueue(conn, "k", queue="keys", ordering_key=key)
        with pytest.raises(TypeError, match=f"^unique_key must be .*, got {kind}: {key}"):
            awa_sql.enqueue(conn, "k", queue="keys", unique_key=key)
        with pytest.raises(TypeError,
                           match=f"^job 2 \\(1-based\\): unique_key must be .*, got {kind}"):
            awa_sql.enqueue_many(conn, [{"kind": "k"}, {"kind": "k", "unique_key": key}],
                                 queue="keys")
        awa_sql.enqueue(conn, "k", queue="keys", ordering_key="fine")
        # Refused before the COPY starts: the caller's transaction goes on.
        with pytest.raises(TypeError,
                           match=f"^job 2 \\(1-based\\): ordering_key must be .*, got {kind}"):
            awa_sql.enqueue_many_copy(conn, [{"kind": "k"}] * 2, queue="keys",
                                      opts=[None, {"ordering_key": key}])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.commit()
    with db.connect() as admin:
        assert admin.execute("select array_agg(ordering_key) from awa.ready").fetchone()[0] == [
            b"fine"]


# -- 5. unique_key's object keys ---------------------------------------------------------------


def test_unique_key_refuses_object_keys_that_are_not_str():
    """Python sorted {10: 1, 9: 2} as numbers: its key differed from the one
    of the same args read back from JSON, {"10": 1, "9": 2}."""
    for args, where in [({"items": {10: 1, 9: 2}}, "args['items'] has the key 10 (int)"),
                        ({1: "a"}, "args has the key 1 (int)"),
                        ({"a": [{"b": {True: 1}}]}, "args['a'][0]['b'] has the key True (bool)")]:
        with pytest.raises(TypeError) as refused:
            unique_key("k", args)
        assert str(refused.value) == (
            f"{where}: object keys must be strings, as JSON's are (write it as one)")
    args = {"items": {"10": 1, "9": 2}}
    assert unique_key("k", args) == unique_key("k", json.loads(json.dumps(args)))


# -- 6. the user's application_name, a service's settings ------------------------------------


def application_name(db, conn: psycopg.Connection) -> str:
    with db.connect() as admin:
        return admin.execute("select application_name from pg_stat_activity where pid = %s",
                             [conn.info.backend_pid]).fetchone()[0]


def test_the_dsn_s_application_name_wins_over_awa_s(db, producer_login, monkeypatch):
    dsn = db.dsn(producer_login)
    with awa_sql.Producer(dsn + " application_name=billing", snapshot_every=None) as producer:
        assert application_name(db, producer._conn) == "billing"
    with awa_sql.Producer(dsn, snapshot_every=None) as producer:
        assert application_name(db, producer._conn) == "awa-sql"
    with connect(dsn, application_name="awa-sql worker claimer") as conn:
        assert application_name(db, conn) == "awa-sql worker claimer"
    monkeypatch.setenv("PGAPPNAME", "from-env")
    with connect(dsn, application_name="awa-sql worker claimer") as conn:
        assert application_name(db, conn) == "from-env"
    monkeypatch.delenv("PGAPPNAME")
    for suffix, name in ((" application_name=billing", "billing"), ("", "awa-admin")):
        pool = make_pool(Settings(db.dsn() + suffix), open_now=True)
        try:
            with pool.connection() as conn:
                assert conn.execute("show application_name").fetchone()[0] == name
        finally:
            pool.close()


def test_a_service_keeps_its_own_network_settings(db, producer_login, tmp_path, monkeypatch):
    info = psycopg.conninfo.conninfo_to_dict(db.dsn(producer_login))
    services = tmp_path / "pg_service.conf"
    services.write_text("[awa]\n" + "".join(f"{k}={v}\n" for k, v in info.items())
                        + "connect_timeout=3\nkeepalives_idle=5\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    for name in ("AWA_DATABASE_URL", "DATABASE_URL", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    assert network_defaults("service=awa") == {}
    assert network_defaults("host=127.0.0.1")["keepalives_idle"] == KEEPALIVES["keepalives_idle"]
    with awa_sql.Producer("service=awa", snapshot_every=None) as producer:
        settings = producer._conn.info.get_parameters()
        assert (settings["connect_timeout"], settings["keepalives_idle"]) == ("3", "5")
    monkeypatch.setenv("PGSERVICE", "awa")
    assert network_defaults("") == {}
    with awa_sql.Producer("", snapshot_every=None) as producer:
        assert producer._conn.info.get_parameters()["keepalives_idle"] == "5"


# -- 7. the queues a Producer's COPY is noted under ------------------------------------------


def test_a_producer_notes_the_queues_its_copy_rows_went_to(db, producer_login):
    jobs = [{"kind": "c", "queue": "job-q"}, {"kind": "c"}, {"kind": "c", "queue": "own-q"}]
    opts = [{"queue": "opt-a"}, {"queue": "opt-b"}, None]
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=3600) as producer:
        assert producer.enqueue_many_copy(jobs, queue="default-q", opts=opts) == 3
        # What the next snapshot sends, read from the publisher's memory.
        noted = {(q, a) for (q, a), _at in producer.runtime._activities(time.monotonic())}
    assert noted == {("opt-a", "enqueue"), ("opt-b", "enqueue"), ("own-q", "enqueue")}
    with db.connect() as admin:
        went = admin.execute("select m.queue from awa.ready r join awa.queue_meta m"
                             " using (queue_id)").fetchall()
    assert sorted(q for (q,) in went) == ["opt-a", "opt-b", "own-q"]
