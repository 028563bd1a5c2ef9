"""Server instructions per claimed job, counted by valgrind, against procrastinate.

The method of bench/enqueue_instructions.py (a single-user backend under
callgrind, 600 calls minus 100, so start-up cancels out) applied to the
worker side. Each call takes one job of a preloaded queue and, in the same
statement, finishes it:

  claim 1 + complete     awa.claim(queue, 1) then awa.complete
  claim 1                awa.claim alone
  claim 1 S=8, S=16      awa.claim alone on a queue at that S, its jobs keyed
                         over every lane of priority 2 (the default), so a
                         claim passes the empty lanes of priority 1 first
  claim 1 S=64 to 1      awa.claim alone on a queue raised to S = 64, then
                         lowered to 1 before its jobs came: every lane walked
  ... retired            the same once awa.retire_lanes() has taken the empty
                         lanes above S out of the walk (ADR 041)
  fetch + finish         procrastinate_fetch_job_v2 then procrastinate_finish_job_v1
  fetch                  procrastinate_fetch_job_v2 alone

Every count runs on its own copy of the preloaded cluster, since each call
consumes a job. procrastinate's schema comes from its wheel on PyPI, fetched
by the bench. Needs valgrind (apt-get install valgrind).

Target: a claim of one at S = 16 costs at most 1.30x a claim of one at S = 1.

    python bench/claim_instructions.py [--write-docs | --only CELL ...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql.demo import embedded
from bench import _docs
from bench._pgbench import install_procrastinate
from bench._server import machine
from bench.claim_pgbench import QUEUE, preload_awa, preload_procrastinate
from bench.enqueue_instructions import HIGH, LOW, _give_to_server, count
from bench.enqueue_instructions import build as build_cluster

PRELOAD = HIGH + 100
SHARDS = (8, 16)
MAX_S16_RATIO = 1.30
LOWERED = f"{QUEUE}-lowered"
RETIRED = f"{QUEUE}-retired"


def _wide_queue(s: int) -> str:
    return f"{QUEUE}-s{s}"


def preload_wide(conn: psycopg.Connection, shards: int, jobs: int) -> None:
    """`jobs` jobs keyed over every lane of a queue at S = `shards`."""
    queue = _wide_queue(shards)
    conn.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])
    conn.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                 " array_fill('bench.job'::text, array[%s]), ordering_keys =>"
                 " array(select convert_to('key-' || i, 'UTF8') from generate_series(1, %s) i))",
                 [queue, jobs, jobs, jobs])


def preload_lowered(conn: psycopg.Connection, jobs: int) -> None:
    """`jobs` jobs in each of two queues that were at S = 64 and are at S = 1;
    the lanes above S of the second retired."""
    for queue in (LOWERED, RETIRED):
        conn.execute("select awa.set_enqueue_shards(%s, 64)", [queue])
        conn.execute("select awa.set_enqueue_shards(%s, 1)", [queue])
        conn.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                     " array_fill('bench.job'::text, array[%s]))", [queue, jobs, jobs])
    # Both queues' lanes retired, then the first's walked again, as a
    # change of S does.
    conn.execute("select awa.retire_lanes()")
    conn.execute("select awa._count_lane_shards(m.queue_id) from awa.queue_meta m"
                 " where m.queue = %s", [LOWERED])
    walks = dict(conn.execute("select queue, lane_shards from awa.queue_meta"
                              " where queue in (%s, %s)", [LOWERED, RETIRED]).fetchall())
    assert walks == {LOWERED: 64, RETIRED: 1}, walks


def build(workdir: Path) -> tuple[Path, int]:
    """A stopped cluster with both queues preloaded; procrastinate's worker id."""
    worker = []

    def preload(conn: psycopg.Connection) -> None:
        conn.execute("select awa.set_enqueue_shards(%s, 1)", [QUEUE])
        install_procrastinate(conn)
        worker.append(conn.execute(
            "select worker_id from procrastinate_register_worker_v1()").fetchone()[0])
        preload_awa(conn, PRELOAD)
        preload_procrastinate(conn, PRELOAD)
        for shards in SHARDS:
            preload_wide(conn, shards, PRELOAD)
        preload_lowered(conn, PRELOAD)
        conn.execute("vacuum analyze awa.ready")

    return build_cluster(workdir, None, preload), worker[0]


def cells(worker: int) -> dict[str, str]:
    claim = f"awa.claim('{{{QUEUE}}}', 1, 'bench')"
    fetch = f"procrastinate_fetch_job_v2('{{default}}', {worker})"
    return {
        "claim 1 + complete": f"select count(awa.complete(c.job_id, c.run_lease)) from {claim} c",
        "claim 1": f"select count(*) from {claim} c",
        **{f"claim 1 S={n}": f"select count(*) from awa.claim('{{{_wide_queue(n)}}}', 1, 'bench') c"
           for n in SHARDS},
        "claim 1 S=64 to 1": f"select count(*) from awa.claim('{{{LOWERED}}}', 1, 'bench') c",
        "claim 1 S=64 to 1 retired":
            f"select count(*) from awa.claim('{{{RETIRED}}}', 1, 'bench') c",
        "fetch + finish": ("select count(procrastinate_finish_job_v1(j.id, 'succeeded', false))"
                           f" from {fetch} j"),
        "fetch": f"select count(*) from {fetch} j",
    }


def per_call(pgdata: Path, statement: str, work: Path) -> float:
    counts = []
    for calls in (LOW, HIGH):
        copy = work / f"copy-{calls}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(pgdata, copy, symlinks=True)
        user = embedded.server_os_user()
        if user is not None:
            for path in [copy, *copy.rglob("*")]:
                shutil.chown(path, user.pw_uid, user.pw_gid)
        counts.append(count(copy, statement, calls, work / f"out-{calls}.out"))
    return (counts[1] - counts[0]) / (HIGH - LOW)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    _docs.add_argument(ap)
    ap.add_argument("--only", metavar="CELL", action="append",
                    help="measure only this cell (repeatable; 'claim 1' is always measured)")
    args = ap.parse_args()
    if args.only and args.write_docs:
        ap.error("--only measures part of the table: not with --write-docs")
    block = _docs.Block(__file__, "Server instructions per claim", args.write_docs)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    work = Path(tempfile.mkdtemp(prefix="awa-claim-instr-"))
    _give_to_server(work)
    try:
        pgdata, worker = build(work / "cluster")
        results = {}
        for name, statement in cells(worker).items():
            if args.only and name not in (*args.only, "claim 1"):
                continue
            results[name] = per_call(pgdata, statement, work)
            print(f"  {name}: {results[name] / 1000:,.1f}k", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# claim_instructions: {machine()}; PostgreSQL 18 single-user backend under"
          f" callgrind; instructions per call, {HIGH} - {LOW} calls, S = 1 unless named")
    print("| cell | k instructions |")
    print("|---|---:|")
    for name, value in results.items():
        print(f"| {name} | {value / 1000:,.1f} |")
    if args.only:
        return
    print(f"\nawa-sql / procrastinate per job: "
          f"{results['claim 1 + complete'] / results['fetch + finish']:.2f}")
    for n in SHARDS:
        print(f"claim 1 at S = {n} / at S = 1: {results[f'claim 1 S={n}'] / results['claim 1']:.2f}"
              f" (target at S = 16: {MAX_S16_RATIO:.2f} at most)")
    for name in ("claim 1 S=64 to 1", "claim 1 S=64 to 1 retired"):
        print(f"{name} / claim 1: {results[name] / results['claim 1']:.2f}")
    s16 = results["claim 1 S=16"] / results["claim 1"]
    block.write([_docs.Target(f"claim 1 at S = 16 at most {MAX_S16_RATIO:.2f}x claim 1 at S = 1",
                              s16 <= MAX_S16_RATIO, f"{s16:.2f}x")])


if __name__ == "__main__":
    main()
