"""Server instructions per enqueue call, counted by valgrind: the noise-free view.

Timings on a shared 2-core VM swing by tens of percent between runs; the
number of instructions a backend executes for one call does not. This bench
runs each cell's statement N times in a single-user backend (``postgres
--single``, no client, no network, fsync off) under callgrind, once with 100
calls and once with 600, and prints (Ir(600) - Ir(100)) / 500: the
instructions one call costs, every per-transaction cost included (each line
is its own transaction), start-up excluded.

Cells (single row, as in bench/enqueue_pgbench.py):
  ceiling        a plain INSERT of one job-shaped row
  floor          the same INSERT inside a SECURITY DEFINER PL/pgSQL function,
                 owned like awa's functions (by the owner role, not a superuser)
  + ...          the ladder: awa.enqueue's fast path rebuilt one piece at a
                 time on the floor: the queue_meta lookup of the sticky lane
                 with the row into awa.ready at the lane's sequence, then the
                 lane's try-lock, then the awa.enqueued result
  enqueue S=N    awa.enqueue, unkeyed, at S = 1 and 16 (S = 16 adds to the
                 ladder's top its checks and the tests that pick its path)
  keyed S=16     awa.enqueue with an ordering key
  busy S=8       awa.enqueue at S = 8 with its sticky lane held by another
                 transaction (a prepared one): the call takes the next lane
Cells of 100 rows, per job:
  batch INSERT   one INSERT of 100 rows into the ceiling's table
  + ...          the batch ladder: that INSERT from the arrays inside a
                 definer, then awa.enqueue_batch's sticky lane (the lookup,
                 the try-lock, one reserved range) with the rows into
                 awa.ready, then the awa.enqueued rows returned
  batch S=16     awa.enqueue_batch at S = 16 (adds its argument checks and
                 the test that picks its fast path)

"adds" is each ladder cell's count less the cell below it. Every count runs
on a fresh copy of one cluster, so no cell pays for rows an earlier one left.

    python bench/enqueue_instructions.py [--before REF] [--beside REF] [--profile CELL]
                                         [--write-docs]

--before REF measures the same cells on a second server migrated with the
tree of git revision REF. Two servers built from two trees differ by a few
thousand instructions for the same statement (the ceiling and the floor
move too: where each catalog row lands changes the caches' probes), so
--beside REF adds cells for REF's awa.enqueue and awa.enqueue_batch
installed beside today's on the same server (public.enqueue_before,
public.enqueue_batch_before; their fast paths must still work with today's
schema), the closest before/after of a change to those functions.
--profile CELL prints the functions whose
inclusive instruction counts one call of CELL adds up to (callgrind_annotate).
Target (ADR 026): a change that adds no option costs awa.enqueue and
awa.enqueue_batch at most 2% more instructions than REF.
Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql import migrate
from awa_sql.demo import embedded
from awa_sql.roles import Roles
from bench import _docs
from bench._server import export_revision, install_before, install_revision, machine
from bench.enqueue_pgbench import ROW, VALUES, setup

LOW, HIGH = 100, 600
BATCH = 100
# awa's enqueue functions rebuilt one piece at a time (the ladders): each rung
# is a SECURITY DEFINER function owned like awa's, and adds one piece to the
# rung before it. Their statements are those of awa.enqueue's and
# awa.enqueue_batch's fast paths (sql/enqueue.sql) without the checks.
_RUNG = ("create function public.{name}(queue_name text{args}) returns {returns}"
         " language plpgsql security definer set search_path = pg_catalog, pg_temp"
         " set plan_cache_mode = force_generic_plan as $$ declare n integer; q_id integer;"
         " shard {shard}; lane integer; seq regclass; base bigint; new_seq bigint;"
         " new_job bigint; begin {body} end $$")
_LOOKUP = ("select m.queue_id, awa._sticky(m.enqueue_shards),"
           " m.lane_ids[2][awa._sticky(m.enqueue_shards)],"
           " m.lane_seqs[2][awa._sticky(m.enqueue_shards)] into q_id, shard, lane, seq"
           " from awa.queue_meta as m"
           " where m.queue = queue_name and m.stripes = 1 and m.partitions = 1;")
_LOCK = "perform pg_try_advisory_xact_lock(awa._lock_class_lane(), lane);"
_INTO_READY = ("insert into awa.ready (lane_id, lane_seq, job_id, queue_id, priority, kind,"
               " args, ordering_key, attempt, max_attempts, enqueued_at, ready_at)")
_ONE = (f"{_INTO_READY} values (lane, nextval(seq), nextval('awa.job_id_seq'), q_id, 2,"
        " 'bench.job', '{}', null, 0, 25, now(), clock_timestamp())")
_RANGE = "n := cardinality(kinds); base := setval(seq, nextval(seq) + n - 1) - n + 1;"
_MANY = (f"{_INTO_READY} select lane, base + u.i - 1, nextval('awa.job_id_seq'), q_id, 2, u.k,"
         " coalesce(u.a, '{}'), null, 0, 25, now(), clock_timestamp()"
         " from unnest(kinds, args) with ordinality as u (k, a, i)")
_ARRAYS = ", kinds text[], args jsonb[]"
# name: (extra arguments, return type, body)
RUNGS = {
    # single row, after the floor
    "rung_lane": ("", "bigint",
                  f"{_LOOKUP} {_ONE}; return currval('awa.job_id_seq');"),
    "rung_lock": ("", "bigint",
                  f"{_LOOKUP} {_LOCK} {_ONE}; return currval('awa.job_id_seq');"),
    "rung_result": ("", "awa.enqueued",
                    f"{_LOOKUP} {_LOCK} {_ONE} returning awa.ready.lane_seq, awa.ready.job_id"
                    " into new_seq, new_job;"
                    " return row(new_job, queue_name, 2::smallint, shard, new_seq{duplicate})"
                    "::awa.enqueued;"),
    # 100 rows, after the batched INSERT
    "rung_batch_floor": (_ARRAYS, "void",
                         f"insert into public.bench_ceiling {ROW}"
                         " select 1, nextval('public.bench_seq'), currval('public.bench_seq'),"
                         " 1, 2, u.k, coalesce(u.a, '{}'), 0, 25, now(), clock_timestamp()"
                         " from unnest(kinds, args) as u (k, a);"),
    "rung_batch_lane": (_ARRAYS, "void", f"{_LOOKUP} {_LOCK} {_RANGE} {_MANY};"),
    "rung_batch_rows": (_ARRAYS, "setof awa.enqueued",
                        f"{_LOOKUP} {_LOCK} {_RANGE} return query {_MANY}"
                        " returning awa.ready.job_id, queue_name, 2::smallint, shard,"
                        " awa.ready.lane_seq{duplicate};"),
}
_FILL = f"array_fill('bench.job'::text, array[{BATCH}])"

CELLS = {
    "ceiling": f"insert into bench_ceiling {ROW} values (1, {VALUES})",
    "floor": "select bench_floor(1)",
    "+ lookup, lane seq": "select public.rung_lane('bench_s16')",
    "+ lane lock": "select public.rung_lock('bench_s16')",
    "+ awa.enqueued result": "select public.rung_result('bench_s16')",
    "enqueue S=1": "select awa.enqueue('bench_s1', 'bench.job')",
    "enqueue S=16": "select awa.enqueue('bench_s16', 'bench.job')",
    "keyed S=16": "select awa.enqueue('bench_s16', 'bench.job', ordering_key => 'customer-42')",
    "busy S=8": "select awa.enqueue('bench_s8', 'bench.job')",
    "batch INSERT / 100": (f"insert into bench_ceiling {ROW} select 1, {VALUES}"
                           f" from generate_series(1, {BATCH})"),
    "in a definer / 100": f"select public.rung_batch_floor('bench_s16', {_FILL}, null)",
    "+ lookup, lock, range / 100": f"select public.rung_batch_lane('bench_s16', {_FILL}, null)",
    "+ rows returned / 100": ("select count(*) from"
                              f" public.rung_batch_rows('bench_s16', {_FILL}, null)"),
    "batch S=16 / 100": ("select count(*) from awa.enqueue_batch("
                         f"array_fill('bench_s16'::text, array[{BATCH}]), {_FILL})"),
}
# Unique keys (ADR 027), in trees that have them: a new key at every call,
# the same key at every call (all but the first are duplicates), a batch of
# new keys.
_NEW_KEY = "int8send(nextval('public.bench_keys'))"
UNIQUE = {
    "unique key S=16": f"select awa.enqueue('bench_s16', 'bench.job', unique_key => {_NEW_KEY})",
    "duplicate S=16": "select awa.enqueue('bench_s16', 'bench.job', unique_key => 'same')",
    "unique batch S=16 / 100": (
        "select count(*) from awa.enqueue_batch("
        f"array_fill('bench_s16'::text, array[{BATCH}]), {_FILL}, unique_keys => array("
        f"select {_NEW_KEY} from generate_series(1, {BATCH})))"),
}
CELLS.update(UNIQUE)
BESIDE = {
    "enqueue S=16": "select public.enqueue_before('bench_s16', 'bench.job')",
    "keyed S=16": ("select public.enqueue_before('bench_s16', 'bench.job',"
                   " ordering_key => 'customer-42')"),
    "busy S=8": "select public.enqueue_before('bench_s8', 'bench.job')",
    "batch S=16 / 100": ("select count(*) from public.enqueue_batch_before("
                         f"array_fill('bench_s16'::text, array[{BATCH}]), {_FILL})"),
}


def add_beside(ref: str) -> str:
    """Cells of REF's functions beside today's; the suffix that names them."""
    suffix = f" ({ref}, beside)"
    for name, statement in BESIDE.items():
        CELLS[name + suffix] = statement
        if name in HOLD_STICKY:
            HOLD_STICKY[name + suffix] = HOLD_STICKY[name]
        if name.endswith(f"/ {BATCH}"):
            PER_JOB[name + suffix] = BATCH
    return suffix


PER_JOB = {name: BATCH for name in CELLS if name.endswith(f"/ {BATCH}")}
# The ladders, bottom rung first; "adds" is each cell less the one before it.
LADDERS = (
    ("floor", "+ lookup, lane seq", "+ lane lock", "+ awa.enqueued result", "enqueue S=16"),
    ("batch INSERT / 100", "in a definer / 100", "+ lookup, lock, range / 100",
     "+ rows returned / 100", "batch S=16 / 100"),
)
STEPS = {upper: lower for ladder in LADDERS for lower, upper in pairwise(ladder)}


def setup_ladders(conn: psycopg.Connection) -> None:
    """The pgbench harness's objects, and the ladders' rungs."""
    setup(conn)
    owner = Roles().owner
    conn.execute("create sequence public.bench_keys")
    # awa.enqueued's columns as this tree has them (duplicate since ADR 027).
    duplicate = ", false" if conn.execute(
        "select exists (select from pg_attribute where attrelid = 'awa.enqueued'::regclass"
        " and attname = 'duplicate')").fetchone()[0] else ""
    for name, (args, returns, body) in RUNGS.items():
        # The shard's type as in awa.enqueue (integer) and awa.enqueue_batch (smallint).
        shard = "smallint" if args else "integer"
        conn.execute(_RUNG.format(name=name, args=args, returns=returns, shard=shard,
                                  body=body.replace("{duplicate}", duplicate)))
        conn.execute(f"alter function public.{name} owner to {owner}")


# A prepared transaction holds this backend's sticky lane of bench_s8
# while the cell runs (it outlives the statement that took it, as another
# producer's open transaction would), and is rolled back after.
HOLD_STICKY = {
    "busy S=8": (
        "begin; select pg_advisory_xact_lock(awa._lock_class_lane(),"
        " m.lane_ids[2][awa._sticky(8)]) from awa.queue_meta as m where m.queue = 'bench_s8';"
        " prepare transaction 'busy';\n",
        "rollback prepared 'busy';\n",
    ),
}


def _give_to_server(path: Path) -> None:
    """The server's OS user (as root: awa-pg) writes here and reads its script."""
    user = embedded.server_os_user()
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def build(workdir: Path, revision: Path | None,
          prepare: Callable[[psycopg.Connection], object]) -> Path:
    """A stopped cluster with awa (today's, or `revision`'s), then `prepare`'s objects."""
    workdir.mkdir(parents=True)
    _give_to_server(workdir)
    server = embedded.LocalServer(embedded.ensure_binaries(18), workdir / "pgdata")
    server.start()
    try:
        dsn = server.dsn()
        if revision is None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        else:
            install_revision(dsn, revision)
        with psycopg.connect(dsn, autocommit=True) as conn:
            prepare(conn)
            conn.execute("checkpoint")
    finally:
        server.stop()
    return workdir / "pgdata"


def count(pgdata: Path, statement: str, calls: int, out: Path,
          around: tuple[str, str] = ("", "")) -> int:
    """Instructions of a single-user backend that runs `statement` `calls` times.

    `around` is a line run before the calls and one run after them.
    """
    if "\n" in statement:
        raise ValueError("a single-user backend reads one line per command: join the lines")
    script = out.with_suffix(".sql")
    script.write_text(around[0] + f"prepare p as {statement};\n" + "execute p;\n" * calls
                      + around[1])
    _give_to_server(script)
    _give_to_server(out.parent)
    user = embedded.server_os_user()
    ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    with script.open() as stdin:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             str(embedded.ensure_binaries(18) / "postgres"), "--single", "-D", str(pgdata),
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "jit=off",
             "-c", "max_prepared_transactions=2", "postgres"],
            stdin=stdin, capture_output=True, text=True, cwd="/", check=False, **ids)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found or "ERROR:" in proc.stdout + proc.stderr:
        raise RuntimeError(f"{statement}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def fresh_copy(pgdata: Path) -> Path:
    """A copy of the built cluster beside it, for one count: each count starts
    from the same tables (rows left by earlier counts make index inserts dearer)."""
    copy = pgdata.with_name(pgdata.name + "-run")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(pgdata, copy, symlinks=True)
    user = embedded.server_os_user()
    if user is not None:
        for path in (copy, *copy.rglob("*")):
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    return copy


def per_call(pgdata: Path, name: str, outdir: Path) -> float:
    tag = re.sub(r"\W+", "_", name)
    around = HOLD_STICKY.get(name, ("", ""))
    low = count(fresh_copy(pgdata), CELLS[name], LOW, outdir / f"{tag}_{LOW}.out", around)
    high = count(fresh_copy(pgdata), CELLS[name], HIGH, outdir / f"{tag}_{HIGH}.out", around)
    return (high - low) / (HIGH - LOW) / PER_JOB.get(name, 1)


def profile(outdir: Path, name: str, top: int = 40) -> str:
    tag = re.sub(r"\W+", "_", name)
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes",
                          str(outdir / f"{tag}_{HIGH}.out")],
                         capture_output=True, text=True, check=True).stdout
    return "\n".join(out.splitlines()[:top + 25])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", metavar="REF", help="also measure git revision REF")
    ap.add_argument("--beside", metavar="REF",
                    help="also measure REF's enqueue functions beside today's")
    ap.add_argument("--profile", metavar="CELL", choices=list(CELLS))
    ap.add_argument("--only", metavar="CELL", action="append",
                    help="measure only this cell (repeatable; the floor is always measured)")
    _docs.add_argument(ap)
    args = ap.parse_args()
    if args.only and args.write_docs:
        ap.error("--only measures part of the table: not with --write-docs")
    block = _docs.Block(__file__, "Server instructions per enqueue", args.write_docs)
    prepare = setup_ladders
    beside = ""
    if args.beside:
        beside = add_beside(args.beside)

        def prepare(conn: psycopg.Connection) -> None:
            setup_ladders(conn)
            install_before(conn, args.beside, "enqueue.sql", "enqueue")
            install_before(conn, args.beside, "enqueue.sql", "enqueue_batch")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    work = Path(tempfile.mkdtemp(prefix="awa-instr-"))
    _give_to_server(work)
    try:
        columns = {"now": build(work / "now", None, prepare)}
        if args.before:
            columns[f"at {args.before}"] = build(
                work / "before", export_revision(args.before, work / "src"), setup_ladders)
        results: dict[str, dict[str, float]] = {}
        for label, pgdata in columns.items():
            outdir = work / f"out-{len(results)}"
            outdir.mkdir()
            results[label] = {}
            for name in CELLS:
                if label != "now" and (name.endswith(", beside)") or name in UNIQUE):
                    continue
                if args.only and name not in (*args.only, "floor"):
                    continue
                results[label][name] = per_call(pgdata, name, outdir)
                print(f"  {label} {name}: {results[label][name] / 1000:,.1f}k",
                      file=sys.stderr, flush=True)
            if args.profile and label == "now":
                print(profile(outdir, args.profile))
        print(f"# enqueue_instructions: {machine()}; PostgreSQL 18 single-user backend under"
              f" callgrind; instructions per call (batch: per job), {HIGH} - {LOW} calls")
        header = ["cell", *(f"{label} (k instr.)" for label in results), "now / floor",
                  "adds (now)"]
        print("| " + " | ".join(header) + " |")
        print("|---|" + "---:|" * (len(header) - 1))
        now = results["now"]
        for name in CELLS:
            if name not in now:
                continue
            values = [f"{results[label][name] / 1000:,.1f}" if name in results[label] else ""
                      for label in results]
            adds = (f"{(now[name] - now[STEPS[name]]) / 1000:+,.1f}"
                    if name in STEPS and STEPS[name] in now else "")
            print(f"| {name} | " + " | ".join(values)
                  + f" | {now[name] / now['floor']:.2f}x | {adds} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    block.write(targets(results, args.before, args.beside, beside))


BUDGET = 0.02
BUDGET_CELLS = ("enqueue S=1", "enqueue S=16", "keyed S=16", "busy S=8", f"batch S=16 / {BATCH}")


def targets(results: dict[str, dict[str, float]], before: str | None, beside_ref: str | None,
            beside: str) -> list[_docs.Target]:
    """The 2% budget, against --before REF's tree and --beside REF's functions."""
    now = results["now"]
    pairs = []
    if before:
        pairs += [(f"{name} at most {BUDGET:.0%} over {before}", now[name],
                   results[f"at {before}"][name]) for name in BUDGET_CELLS if name in now]
    if beside_ref:
        pairs += [(f"{name} at most {BUDGET:.0%} over {beside_ref}'s function, beside",
                   now[name], now[name + beside]) for name in BUDGET_CELLS if name + beside in now]
    if not pairs:
        return [_docs.Target(f"awa.enqueue, awa.enqueue_batch at most {BUDGET:.0%} over REF", None,
                             "run with --before REF or --beside REF")]
    return [_docs.Target(label, value <= base * (1 + BUDGET), f"{value / base - 1:+.1%}")
            for label, value, base in pairs]


if __name__ == "__main__":
    main()
