"""COPY loads with unique keys, as of a git revision and as of this checkout.

Each round loads --rows rows, every one with a unique key of its own, into
a plain queue with COPY in one transaction (moved at commit: the batch
path, 10,000 rows a pass), --loads times on a fresh server per tree, and
prints the seconds from the first row sent to the commit. Each load is
then sent again, every row now a duplicate (a producer retrying a load it
lost the answer to), and the same keys once more as one
awa.enqueue_batch call; last, a load of as many rows with ordering keys
(no unique keys) into a queue of 4 partitions, the batch path's other
use, and one more with a priority and every tenth row for later. The
trees alternate (before, now, before, now, ...) so both see the same
machine. What it watches: a load's cost grows
with its rows, not with their square (a subscript per element of an array
with nulls walks it from the start: keys taken for a whole load of several
passes in one call made a load of 50,000 rows three times slower until the
keys were read by unnest; duplicates collected by growing arrays one
element at a time made a batch of 32,000 duplicates take 16 s).

No target: a record of what taking keys costs a load, before and after a
change to it.

    python bench/copy_unique_keys.py [--rows 50000] [--loads 3] [--rounds 2]
                                     [--before c315c91] [--write-docs]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.demo import embedded
from bench import _docs
from bench._server import BENCH_SETTINGS, export_revision, install_revision, machine

ROOT = Path(__file__).resolve().parent.parent
COPY = "copy awa.copy_staging (queue, kind, unique_key) from stdin"


BATCH = ("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
         " array_fill('bench.job'::text, array[%s]), unique_keys =>"
         " array(select convert_to(%s || i, 'UTF8') from generate_series(0, %s - 1) as i))")
KINDS = ("new keys", "all duplicates", "batch of duplicates", "partitioned, no keys",
         "partitioned, 1 in 10 later")
PARTITIONED = "copy awa.copy_staging (queue, kind, ordering_key) from stdin"
LATER = "copy awa.copy_staging (queue, priority, kind, ordering_key, run_at) from stdin"


def load_later(conn: psycopg.Connection, queue: str, rows: int) -> float:
    """A load into a partitioned queue, priority given, every tenth row for
    a day later: arrays with nulls, which a subscript walks from the start."""
    started = time.perf_counter()
    with conn.cursor().copy(LATER) as cp:
        for i in range(rows):
            cp.write_row([queue, 2, "bench.job", f"o{i}".encode(),
                          "infinity" if i % 10 == 0 else None])
    conn.commit()
    return time.perf_counter() - started


def load(conn: psycopg.Connection, queue: str, prefix: str, rows: int,
         statement: str = COPY) -> float:
    started = time.perf_counter()
    with conn.cursor().copy(statement) as cp:
        for i in range(rows):
            cp.write_row([queue, "bench.job", f"{prefix}{i}".encode()])
    conn.commit()
    return time.perf_counter() - started


def loads(checkout: Path, rows: int, count: int) -> dict[str, list[float]]:
    """Seconds of each of `count` keyed loads of `rows` rows, of the same
    load again and of its keys as one batch, on a fresh server migrated with
    `checkout`'s installer and sql/."""
    workdir = Path(tempfile.mkdtemp(prefix="awa-bench-"))
    server = embedded.LocalServer(embedded.ensure_binaries(18), workdir / "pgdata",
                                  settings=BENCH_SETTINGS)
    server.start()
    try:
        dsn = server.dsn()
        install_revision(dsn, checkout)
        seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        with psycopg.connect(dsn) as conn:
            for n in range(count):
                queue, prefix = f"keyed{n}", f"k{n}-"
                seconds["new keys"].append(load(conn, queue, prefix, rows))
                seconds["all duplicates"].append(load(conn, queue, prefix, rows))
                started = time.perf_counter()
                conn.execute(BATCH, [queue, rows, rows, prefix, rows])
                conn.commit()
                seconds["batch of duplicates"].append(time.perf_counter() - started)
                conn.execute("select awa.set_queue_partitions(%s, 4)", [f"parts{n}"])
                conn.commit()
                seconds["partitioned, no keys"].append(
                    load(conn, f"parts{n}", "o", rows, PARTITIONED))
                conn.execute("select awa.set_queue_partitions(%s, 4)", [f"later{n}"])
                conn.commit()
                seconds["partitioned, 1 in 10 later"].append(load_later(conn, f"later{n}", rows))
                ready = conn.execute(
                    "select count(*) from awa.ready as r join awa.queue_meta as m"
                    " using (queue_id) where m.queue = %s", [queue]).fetchone()[0]
                conn.commit()
                assert ready == rows, (ready, rows)
        return seconds
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default="c315c91")
    _docs.add_argument(ap)
    args = ap.parse_args()
    block = _docs.Block(__file__, "COPY loads with unique keys", args.write_docs)
    with tempfile.TemporaryDirectory(prefix="awa-before-") as tmp:
        trees = {f"at {args.before}": export_revision(args.before, Path(tmp)), "now": ROOT}
        seconds = {label: {kind: [] for kind in KINDS} for label in trees}
        for _ in range(args.rounds):
            for label, checkout in trees.items():
                took = loads(checkout, args.rows, args.loads)
                for kind in KINDS:
                    seconds[label][kind] += took[kind]
                print(f"  {label}: " + "; ".join(
                    f"{kind} {' '.join(f'{s:.2f}' for s in took[kind])} s" for kind in KINDS),
                    file=sys.stderr, flush=True)
    print(f"# copy_unique_keys: {machine()}; PostgreSQL 18; a COPY of {args.rows:,} rows, each"
          f" with its own unique key, into a plain queue, moved at commit; the same COPY"
          f" again (all duplicates); the same keys as one awa.enqueue_batch; a COPY of as"
          f" many rows with ordering keys into 4 partitions, then with every tenth for"
          f" later; seconds, medians"
          f" of {args.loads} loads x {args.rounds} rounds, trees alternating")
    print("| tree | " + " | ".join(f"{kind}, s" for kind in KINDS) + " |")
    print("|---|" + "---:|" * len(KINDS))
    for label, runs in seconds.items():
        print(f"| {label} | " + " | ".join(
            f"{statistics.median(runs[kind]):.2f}" for kind in KINDS) + " |")
    block.write()


if __name__ == "__main__":
    main()
