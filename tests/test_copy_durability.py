"""COPY staging is unlogged (ADR 010); an immediate shutdown (a crash, as
far as the server knows) must still lose no job of a committed COPY and
leave nothing of an uncommitted one. On a server of its own, fsync on."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awa_sql import migrate
from awa_sql.demo import embedded
from awa_sql.roles import Roles
from tests.support.cluster import ensure_binaries
from tests.support.jobs import COPY_SQL


def _copy(conn: psycopg.Connection, queue: str, n: int) -> None:
    with conn.cursor().copy(COPY_SQL) as cp:
        for i in range(n):
            cp.write_row((queue, None, f"k{i % 7}".encode(), "job", Jsonb({"i": i}), None, None))


@pytest.mark.parametrize("major", [
    pytest.param(17, marks=pytest.mark.pg17, id="pg17"),
    pytest.param(18, marks=pytest.mark.pg18, id="pg18"),
])
def test_committed_copies_survive_an_immediate_restart_and_in_flight_ones_vanish(major):
    workdir = Path(tempfile.mkdtemp(prefix=f"awa-durability-pg{major}-"))
    workdir.chmod(0o755)
    server = embedded.LocalServer(ensure_binaries(major), workdir / "data",
                                  settings={"fsync": "on", "synchronous_commit": "on"})
    server.start()
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        with psycopg.connect(server.dsn()) as conn:  # committed, enqueued at commit
            _copy(conn, "at_commit", 2000)
            conn.commit()
        with psycopg.connect(server.dsn()) as conn:  # committed, enqueued by the call
            _copy(conn, "by_call", 1000)
            conn.execute("select awa.enqueue_copied()")
            conn.commit()
        in_flight = psycopg.connect(server.dsn())
        _copy(in_flight, "in_flight", 500)  # staged, never committed
        server.stop(mode="immediate")
        in_flight.close()
        server.start()
        with psycopg.connect(server.dsn()) as conn:
            counts = dict(conn.execute(
                "select m.queue, count(r.job_id) from awa.queue_meta m"
                " left join awa.ready r using (queue_id) group by m.queue").fetchall())
            assert counts.get("at_commit") == 2000
            assert counts.get("by_call") == 1000
            assert counts.get("in_flight", 0) == 0
            assert conn.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0
            assert conn.execute("select count(*) from awa.copy_pending").fetchone()[0] == 0
            # Per-key order inside each lane survived too.
            out_of_order = conn.execute(
                "select count(*) from (select (args->>'i')::int as i, lag((args->>'i')::int)"
                " over (partition by lane_id, ordering_key order by lane_seq) as prev"
                " from awa.ready) as x where prev > i").fetchone()[0]
            assert out_of_order == 0
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(workdir, ignore_errors=True)
