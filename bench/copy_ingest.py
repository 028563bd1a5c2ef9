"""COPY ingestion throughput against a raw COPY of the same rows.

Loads N rows (default 1,000,000) in one transaction, keyed and unkeyed, two
ways: the SQL path (COPY awa.copy_staging ... FROM STDIN of text lines, then
awa.enqueue_copied()) and the Python client's ``enqueue_many_copy`` (job
dicts in, the same COPY and call underneath); compares both with a raw COPY
of the same text lines into a table shaped like awa.ready, measured in the
same run. Prints rows/s and the fractions.

Target (the partitioned-queues issue): enqueue_many_copy at least 75% of the
raw COPY's rows/s.

    python bench/copy_ingest.py [--rows 1000000] [--shards 4] [--write-docs]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.client import enqueue_many_copy
from bench import _docs
from bench._server import bench_server, machine

STAGING = ("copy awa.copy_staging (queue, priority, ordering_key, kind, args, run_at,"
           " max_attempts) from stdin")
RAW = ("copy copy_ceiling (lane_id, lane_seq, job_id, queue_id, priority, kind, args,"
       " ordering_key, attempt, max_attempts, enqueued_at) from stdin")


def staged_lines(rows: int, keyed: bool):
    for n in range(rows):
        key = f"\\\\x{(n % 5000):08x}" if keyed else "\\N"
        yield f"ingest\t\\N\t{key}\tbench.job\t{{\"n\": {n}}}\t\\N\t\\N\n"


def raw_lines(rows: int, keyed: bool):
    for n in range(rows):
        key = f"\\\\x{(n % 5000):08x}" if keyed else "\\N"
        yield (f"{n % 16}\t{n}\t{n}\t1\t2\tbench.job\t{{\"n\": {n}}}\t{key}\t0\t25\t"
               "2026-01-01 00:00:00+00\n")


def timed_copy(dsn: str, statement: str, lines, after: str | None = None) -> float:
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        with conn.cursor().copy(statement) as cp:
            buf = []
            for line in lines:
                buf.append(line)
                if len(buf) == 5000:
                    cp.write("".join(buf))
                    buf.clear()
            cp.write("".join(buf))
        if after:
            conn.execute(after)
        conn.commit()
        return time.perf_counter() - start


def timed_client(dsn: str, rows: int, keyed: bool) -> float:
    jobs = [{"kind": "bench.job", "args": {"n": n},
             "ordering_key": (n % 5000).to_bytes(4, "big") if keyed else None}
            for n in range(rows)]
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        enqueue_many_copy(conn, jobs, queue="ingest")
        conn.commit()
        return time.perf_counter() - start


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("truncate awa.ready, copy_ceiling")
        conn.execute("vacuum awa.copy_staging")
        conn.execute("checkpoint")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    _docs.add_argument(parser)
    args = parser.parse_args()
    block = _docs.Block(__file__, "COPY ingestion", args.write_docs)
    targets = []
    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("create table copy_ceiling (like awa.ready including all)")
            conn.execute("select awa.set_enqueue_shards('ingest', %s)", [args.shards])
            version = conn.execute("show server_version").fetchone()[0]
        print(f"# copy_ingest: {machine()}; PostgreSQL {version}; {args.rows:,} rows per run; "
              f"S = {args.shards}")
        for keyed in (False, True):
            label = "keyed" if keyed else "unkeyed"
            reset(dsn)
            raw = timed_copy(dsn, RAW, raw_lines(args.rows, keyed))
            reset(dsn)
            ours = timed_copy(dsn, STAGING, staged_lines(args.rows, keyed),
                              "select awa.enqueue_copied()")
            reset(dsn)
            client = timed_client(dsn, args.rows, keyed)
            print(f"{label:>8}: raw COPY {args.rows / raw:>10,.0f} rows/s | "
                  f"COPY + awa.enqueue_copied() {args.rows / ours:>10,.0f} rows/s "
                  f"({raw / ours:.0%} of raw) | enqueue_many_copy "
                  f"{args.rows / client:>10,.0f} rows/s ({raw / client:.0%} of raw)", flush=True)
            targets.append(_docs.Target(f"{label}: enqueue_many_copy at least 75% of a raw COPY",
                                        raw / client >= 0.75, f"{raw / client:.0%}"))
    block.write(targets)


if __name__ == "__main__":
    main()
