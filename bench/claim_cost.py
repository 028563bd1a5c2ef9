"""What one awa.claim reads: shared buffers (EXPLAIN ANALYZE, BUFFERS) and
server time, against dead rows and against the number of lanes.

Dead rows: a queue at S = 1 (claimed lane by lane) and one at S = 4
(merged) hold 150,000 jobs each; claims of 100 + complete run N of them
through with autovacuum off on awa.ready and an old transaction open (so not
even index entries can be marked dead), then a claim of 1 and of 10 is
measured. Lanes: queues at S = 1, 8, 64 with jobs
at one priority and at all four (keyed, so every lane has rows).

    python bench/claim_cost.py [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._pgbench import table
from bench._server import bench_server, machine


def measure(conn: psycopg.Connection, queue: str, n: int) -> tuple[int, float]:
    """Buffers of one claim, and the median server time of 20, in µs."""
    times, buffers = [], 0
    for _ in range(21):
        (plan,) = conn.execute(
            "explain (analyze, buffers, costs off, format json)"
            " select * from awa.claim(%s, %s, 'cost')", [[queue], n]).fetchone()[0]
        node = plan["Plan"]
        assert node["Actual Rows"] == n, plan
        buffers = node["Shared Hit Blocks"] + node["Shared Read Blocks"]
        times.append(plan["Execution Time"] * 1000)
    return buffers, statistics.median(times[1:])


def fill(conn: psycopg.Connection, queue: str, jobs: int, priority: int) -> None:
    conn.execute(
        "select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
        " array_fill('k'::text, array[%s]), priorities => array_fill(%s::smallint, array[%s]),"
        " ordering_keys => array(select convert_to('key' || i, 'UTF8')"
        " from generate_series(1, %s) as i))", [queue, jobs, jobs, priority, jobs, jobs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "Claim cost: dead rows and lanes", args.write_docs)
    with bench_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn, \
            psycopg.connect(dsn) as horizon:
        server = conn.execute("show server_version").fetchone()[0]
        conn.execute("set synchronous_commit = off")
        conn.execute("alter table awa.ready set (autovacuum_enabled = off)")
        for shards in (1, 4):
            conn.execute("select awa.set_enqueue_shards(%s, %s)", [f"dead_{shards}", shards])
            fill(conn, f"dead_{shards}", 150_000, 2)
        conn.execute("vacuum analyze awa.ready")
        horizon.execute("select pg_current_xact_id()")
        dead_rows = []
        for shards in (1, 4):
            queue, done = f"dead_{shards}", 0
            for target in (0, 1_000, 10_000, 100_000):
                while done < target:
                    conn.execute("select awa.complete(job_id, run_lease)"
                                 " from awa.claim(array[%s], 100, 'w')", [queue])
                    done += 100
                one, ten = measure(conn, queue, 1), measure(conn, queue, 10)
                done += 21 * 11
                dead_rows.append([shards, f"{target:,}", one[0], f"{one[1]:.0f}", ten[0],
                                  f"{ten[1]:.0f}"])
        horizon.rollback()
        conn.execute("alter table awa.ready reset (autovacuum_enabled)")
        lanes = []
        for shards in (1, 8, 64):
            for used in (1, 4):
                queue = f"lanes_{shards}_{used}"
                conn.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])
                for priority in range(1, used + 1):
                    fill(conn, queue, 20_000, priority)
                conn.execute("vacuum analyze awa.ready")
                one, ten = measure(conn, queue, 1), measure(conn, queue, 10)
                lanes.append([shards, shards * 4, used, one[0], f"{one[1]:.0f}", ten[0],
                              f"{ten[1]:.0f}"])
    print(f"machine: {machine()}")
    print(f"PostgreSQL {server}; buffers = shared hit + read of one claim; µs = median of 20")
    print("Dead rows (no vacuum, an old transaction open):")
    print(table(["S", "jobs through the queue", "claim 1 buffers", "µs", "claim 10 buffers",
                 "µs"], dead_rows))
    print("Lanes (keyed jobs in every lane of the priorities used):")
    print(table(["S", "lanes", "priorities used", "claim 1 buffers", "µs", "claim 10 buffers",
                 "µs"], lanes))
    block.write()


if __name__ == "__main__":
    main()
