"""Backend CPU per committed enqueue transaction, as of a git revision and today.

One server, two databases: one migrated with the revision's package and
sql/, one with today's. One client per database and statement runs N
transactions (synchronous_commit off, so the commit wait is not in it), the
two sides alternated over R rounds; the CPU each backend used comes from
/proc/<pid>/stat (10 ms ticks: N is large enough for a few hundred). CPU
time is what a busy machine disturbs least, where wall-clock benches swing
by 2x. Prints medians, the rounds and after / before.

    python bench/backend_cpu.py --before REF [--rounds 7] [--transactions 3000] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, export_revision, install_revision, machine

SHARDS = 16
KEYS = "array(select convert_to((g % 7)::text, 'UTF8') from generate_series(1, 100) as g)"
BATCH = ("select count(*) from awa.enqueue_batch(array_fill('cpu'::text, array[100]),"
         " array_fill('bench.job'::text, array[100]){})")
# name, statement, transactions per round relative to --transactions
CELLS = [
    ("awa.enqueue, unkeyed", "select awa.enqueue('cpu', 'bench.job')", 1),
    ("awa.enqueue, keyed", "select awa.enqueue('cpu', 'bench.job', ordering_key => '\\x0102')",
     1),
    ("awa.enqueue_batch, 100 rows, one lane", BATCH.format(""), 0.2),
    ("awa.enqueue_batch, 100 rows over 7 keys", BATCH.format(f", ordering_keys => {KEYS}"),
     0.2),
]


def backend_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_transaction_us(conn: psycopg.Connection, pid: int, statement: str, n: int) -> float:
    start = backend_seconds(pid)
    for _ in range(n):
        conn.execute(statement, prepare=True)
        conn.commit()
    return (backend_seconds(pid) - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, metavar="REF")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--transactions", type=int, default=3000)
    _docs.add_argument(parser)
    opts = parser.parse_args()
    block = _docs.Block(__file__, "Backend CPU per enqueue transaction, before and after",
                         opts.write_docs)
    with bench_server() as after_dsn, tempfile.TemporaryDirectory() as tmp:
        with psycopg.connect(after_dsn, autocommit=True) as admin:
            admin.execute("create database before_db")
            version = admin.execute("show server_version").fetchone()[0]
        before_dsn = psycopg.conninfo.make_conninfo(after_dsn, dbname="before_db")
        install_revision(before_dsn, export_revision(opts.before, Path(tmp) / "before"))
        sides = {}
        for side, dsn in (("before", before_dsn), ("after", after_dsn)):
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("select awa.set_enqueue_shards('cpu', %s)", [SHARDS])
            conns = []
            for _name, statement, _share in CELLS:
                conn = psycopg.connect(dsn)
                conn.execute("set synchronous_commit = off")
                pid = conn.execute("select pg_backend_pid()").fetchone()[0]
                for _ in range(20):  # plans cached, lanes and pages warm
                    conn.execute(statement, prepare=True)
                conn.commit()
                conns.append((conn, pid))
            sides[side] = conns
        runs: dict[tuple[str, int], list[float]] = {}
        for _ in range(opts.rounds):
            for i, (_name, statement, share) in enumerate(CELLS):
                for side, conns in sides.items():
                    conn, pid = conns[i]
                    n = max(50, int(opts.transactions * share))
                    runs.setdefault((side, i), []).append(
                        per_transaction_us(conn, pid, statement, n))
        print(f"# backend_cpu: {machine()}; PostgreSQL {version}; before = {opts.before}; "
              f"S = {SHARDS}; {opts.rounds} rounds, medians; µs of backend CPU per transaction")
        for i, (name, _statement, _share) in enumerate(CELLS):
            before = statistics.median(runs[("before", i)])
            after = statistics.median(runs[("after", i)])
            print(f"{name:<42} before {before:8.0f}  after {after:8.0f}  "
                  f"after/before {after / before:.2f}  "
                  f"rounds {[round(x) for x in runs[('before', i)]]} / "
                  f"{[round(x) for x in runs[('after', i)]]}")
        for conns in sides.values():
            for conn, _pid in conns:
                conn.close()
    block.write()


if __name__ == "__main__":
    main()
