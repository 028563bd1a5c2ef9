"""Enqueue throughput of a partitioned logical queue.

16 producer processes enqueue single-row transactions to one logical queue
registered with P = 1, 2, 4, 8 partitions (awa.set_queue_partitions; the
database routes each job), at S = 1, unkeyed; then one keyed cell with
P = 4 partitions x S = 4 shards. Prints jobs/s per cell.

    python bench/partitions.py [--seconds 5] [--producers 16] [--write-docs]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import bench_server, machine


def _worker(dsn, queue, keyed, deadline_at, start, results, index):
    with psycopg.connect(dsn, autocommit=True) as conn:
        start.wait()
        done = 0
        while time.monotonic() < deadline_at.value:
            key = f"customer-{index}-{done % 64}".encode() if keyed else None
            conn.execute("select awa.enqueue(%s::text, 'bench.job'::text,"
                         " ordering_key => %s::bytea)", [queue, key], prepare=True)
            done += 1
        results[index] = done


def run_cell(dsn, queue, keyed, producers, seconds):
    ctx = mp.get_context("fork")
    start = ctx.Barrier(producers + 1)
    deadline_at = ctx.Value("d", 0.0)
    results = ctx.Array("q", producers)
    procs = [ctx.Process(target=_worker,
                         args=(dsn, queue, keyed, deadline_at, start, results, i))
             for i in range(producers)]
    for p in procs:
        p.start()
    deadline_at.value = time.monotonic() + seconds + 0.2
    start.wait()
    began = time.monotonic()
    for p in procs:
        p.join()
    return sum(results) / (time.monotonic() - began)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--producers", type=int, default=16)
    _docs.add_argument(parser)
    args = parser.parse_args()
    block = _docs.Block(__file__, "Partitioned queues", args.write_docs)
    with bench_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("show server_version").fetchone()[0]
        print(f"# partitions: {machine()}; PostgreSQL {version}; {args.producers} producers; "
              f"synchronous_commit=on; {args.seconds:g} s per cell")
        cells = [(p, 1, False) for p in (1, 2, 4, 8)] + [(4, 4, True)]
        for partitions, shards, keyed in cells:
            queue = f"part-{partitions}-{shards}-{'k' if keyed else 'u'}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("select awa.set_queue_partitions(%s, %s)", [queue, partitions])
                conn.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])
                conn.execute("checkpoint")
            rate = run_cell(dsn, queue, keyed, args.producers, args.seconds)
            print(f"P = {partitions}, S = {shards}, {'keyed' if keyed else 'unkeyed':>8}:"
                  f" {rate:>8,.0f} jobs/s", flush=True)
    block.write()


if __name__ == "__main__":
    main()
