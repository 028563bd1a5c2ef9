"""``awa jobs ...``: look at jobs, retry and cancel them (awa.job, awa.jobs,
awa.retry_job(s), awa.cancel_job(s); docs/sql-api.md, ADR 025), and sum up
what is failing (awa.failure_summary).

Exit codes (docs/admin.md): 0 done; 2 bad arguments, or a bulk change not
confirmed; 5 a lock timeout (a cancel waited 5 s for a claim in flight);
7 could not connect, permission denied, or the server failed; 8 no such job
(unknown, or removed by retention); 9 the job is in a state the command does
not apply to (nothing changed).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from awa_sql.bulk_bound import BOUND_ARGUMENT, count_in_bound
from awa_sql.cli.common import (
    EXIT_WRONG_STATE,
    add_connection,
    bad_input_is_usage,
    err,
    printable,
)
from awa_sql.cli.storage import table
from awa_sql.connect import connect, read_far_dates
from awa_sql.defaults import JOB_TOOL_LOCK_TIMEOUT, RETRY_REFUSED, RETRY_STATES
from awa_sql.jsonb import decode_apart, shown
from awa_sql.migrate import EXIT_USAGE

EXIT_NO_SUCH_JOB = 8

STATES = ("scheduled", "ready", "running", "completed", "failed", "cancelled")
MAX_JOBS = 100_000
ERROR_WIDTH = 60
# --since: a number and one of these units, passed on as an interval.
SINCE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
SINCE_RE = re.compile(r"(-?[0-9]{1,9}(?:\.[0-9]{1,6})?)([smhdw])")
MAX_JOB_ID = 2**63 - 1  # a bigint


def _id_parser(lowest: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"job id must be a whole number, got {text!r}") from None
        if not lowest <= value <= MAX_JOB_ID:
            raise argparse.ArgumentTypeError(
                f"job id must be between {lowest} and {MAX_JOB_ID}, got {value}")
        return value
    return parse


parse_job_id = _id_parser(1)  # job ids start at 1
parse_after = _id_parser(0)  # --after 0: from the first job


def parse_since(text: str) -> str:
    """``30m``, ``1h``, ``2d``, ``1w``: an age, checked for its form here and
    for its range (0 to 10 years) by awa.failure_summary."""
    value = text.strip()
    if SINCE_RE.fullmatch(value) is None:
        raise argparse.ArgumentTypeError(
            f"age must be a number and a unit (s, m, h, d, w), like 30m, 1h or 2d, "
            f"got {text!r}")
    return value


def _interval(since: str | None) -> str | None:
    """An age as parse_since gives it, as interval text: '30m' -> '30 minutes'."""
    if since is None:
        return None
    match = SINCE_RE.fullmatch(since)
    assert match is not None
    return f"{match[1]} {SINCE_UNITS[match[2]]}"


def register(sub: argparse._SubParsersAction) -> None:
    jobs_parser = sub.add_parser(
        "jobs", help="look at jobs, retry and cancel them, sum up failures",
        description="Show, list, retry and cancel jobs, sum up what is failing, and hand a "
        "dead worker's jobs back. Reading needs awa_reader or awa_operator; retry, cancel "
        "and release-worker need awa_operator. Exit codes: "
        "0 done, 2 bad "
        "arguments or not confirmed, 5 lock timeout, 7 connection or server error, 8 no such "
        "job, 9 the job is not in a state the command applies to.")
    js = jobs_parser.add_subparsers(dest="jobs_command", required=True)

    s = js.add_parser("show", help="one job: state, args, attempts, last error, times")
    add_connection(s)
    s.add_argument("job_id", type=parse_job_id, metavar="ID")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_show, needs="awa_reader or awa_operator")

    ls = js.add_parser(
        "list", help="a page of a queue's jobs, by job id",
        description="A page of a queue's jobs (a logical name covers its partitions and "
        "stripes) in job id order; page on with --after. Every job is listed, ready "
        "ones deep in a backlog included.")
    add_connection(ls)
    ls.add_argument("--queue", required=True)
    ls.add_argument("--state", choices=STATES, help="only jobs in this state")
    ls.add_argument("--kind", help="only jobs of this kind")
    ls.add_argument("--worker", metavar="NAME",
                    help="only the running jobs this worker holds (the name it gave "
                    "awa.claim, as the worker column shows, and awa.release_worker takes); "
                    "implies --state running, and any other --state is an error")
    ls.add_argument("--after", type=parse_after, metavar="ID",
                    help="jobs after this job id (the last of the previous page)")
    ls.add_argument("--limit", type=int, default=100, help="jobs per page, 1..100000 "
                    "(default %(default)s)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_list, needs="awa_reader or awa_operator")

    f = js.add_parser(
        "failures", help="what is failing, where, since when: failed jobs by queue, kind "
        "and error",
        description="The failed jobs kept (retention keeps them 7 days by default; not the "
        "cancelled ones), one line per queue, kind and error (the first line of the last "
        "error, cut to 200 characters): how many, the first and the last failure, and the "
        "last one's job id (awa jobs show ID for its whole error). Most failures first. "
        "Reads every failed job kept of the queues asked for: for an incident, not for a "
        "dashboard that refreshes.")
    add_connection(f)
    f.add_argument("--queue", help="only this queue (a logical name covers its partitions "
                   "and stripes); default every queue")
    f.add_argument("--since", type=parse_since, metavar="AGE",
                   help="only the jobs that failed this long back from now: 30m, 1h, 2d, 1w")
    f.add_argument("--limit", type=int, default=100, help="groups shown, 1..100000 "
                   "(default %(default)s)")
    f.add_argument("--json", action="store_true", help="machine-readable output")
    f.set_defaults(func=cmd_failures, needs="awa_reader or awa_operator")

    rw = js.add_parser(
        "release-worker", help="end now the leases of every job a dead worker runs",
        description="For a worker known dead whose leases are long (a killed process, a "
        "lost host): ends the leases of the jobs it runs now (awa.release_worker), so the "
        "next rescue pass of awa maintain sends them back to retry, the attempt counted, "
        "instead of when the leases end. A worker alive after all keeps a job it "
        "heartbeats before that pass. awa jobs list --queue Q --worker NAME lists what it "
        "holds.")
    add_connection(rw)
    rw.add_argument("worker", metavar="NAME",
                    help="the worker name its claims record (the worker column of awa jobs "
                    "list)")
    rw.add_argument("--json", action="store_true", help="machine-readable output")
    rw.set_defaults(func=cmd_release_worker, needs="awa_operator")

    for name, verb, what in (
        ("retry", "retry", "a failed or cancelled job runs again now, with fresh attempts; "
         "--queue: every failed job of the queue (--state cancelled: every cancelled one)"),
        ("cancel", "cancel", "a scheduled, ready or running job ends cancelled; --queue: "
         "every scheduled and ready job of the queue"),
    ):
        p = js.add_parser(name, help=what, description=f"{verb.capitalize()} one job by id, "
                          f"or in bulk with --queue (asks first). {what[0].upper()}{what[1:]}.")
        add_connection(p)
        p.add_argument("job_id", type=parse_job_id, nargs="?", metavar="ID")
        p.add_argument("--queue", help="every job of this queue it applies to")
        p.add_argument("--kind", help="with --queue: only jobs of this kind")
        if name == "retry":
            p.add_argument("--state", choices=RETRY_STATES,
                           help="with --queue: the jobs of this state, one state a run "
                           "(default failed; cancelled brings back jobs cancelled in bulk)")
        # 1,000: a batch holds what it takes until it commits, and 10,000
        # slowed the queue's claims sixfold meanwhile for a cancel no faster
        # (docs/admin.md has the measurements).
        p.add_argument("--batch", type=int, default=1_000,
                       help="with --queue: the most jobs a transaction takes (fewer past "
                       "16 MB of args), 1..100000 (default %(default)s)")
        p.add_argument("--yes", action="store_true",
                       help="with --queue: do not ask for confirmation")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_retry if name == "retry" else cmd_cancel,
                       needs="awa_operator", state=None)


# -- values as people and scripts read them ------------------------------------------------


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return "\\x" + key.hex()
    return text if text.isprintable() else "\\x" + key.hex()


def as_json(row: dict) -> dict:
    """A job for --json: times in ISO 8601, the ordering key as hex and, when
    it is printable UTF-8, as text."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            value = value.isoformat()
        if key == "args":
            value = shown(value)
        if key == "ordering_key":
            out["ordering_key_hex"] = None if value is None else value.hex()
            text = _key_text(value)
            value = None if text is None or text.startswith("\\x") else text
        out[key] = value
    return out


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")


def _short(text: str | None, width: int = ERROR_WIDTH) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _print_job(job: dict) -> None:
    lines = [
        ("job", job["job_id"]),
        ("state", job["state"]),
        ("queue", job["queue"] if job["queue"] == job["logical_queue"]
         else f"{job['queue']} (of {job['logical_queue']})"),
        ("kind", job["kind"]),
        ("priority", job["priority"]),
        ("ordering key", _key_text(job["ordering_key"]) or "-"),
        ("attempts", f"{job['attempt']} of {job['max_attempts']}"),
        ("enqueued", _when(job["enqueued_at"])),
    ]
    if job["state"] == "scheduled":
        lines.append(("runs at", _when(job["run_at"])))
    elif job["state"] == "ready":
        lines.append(("ready since", _when(job["run_at"])))
    elif job["state"] == "running":
        lines += [("claimed", _when(job["run_at"])), ("worker", job["worker"]),
                  ("lease expires", _when(job["lease_expires_at"]))]
    else:
        lines.append(("finished", _when(job["finished_at"])))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {printable(str(value))}")
    print("args" if job["args"] is not None else "args: (not kept for a completed job)")
    if job["args"] is not None:
        # json escapes C0 controls only: C1 ones (CSI) and bidi overrides too.
        print(printable(json.dumps(shown(job["args"]), indent=2, sort_keys=True,
                                   ensure_ascii=False), keep="\n"))
    if job["last_error"]:
        print("last error")
        print(printable(job["last_error"], keep="\n\t"))


# -- commands -----------------------------------------------------------------------------


def _connect(dsn: str | None, autocommit: bool = False) -> psycopg.Connection:
    """A connection that reads far dates, and args the JSON decoder refuses as
    a marker (awa_sql.jsonb.shown) instead of failing the command. Its
    transactions are read committed whatever the login's default: the job
    tools read what a maintenance rewrite left, and a bulk call's batches
    take what workers left, only there (a repeatable read default failed a
    bulk cancel half way with 40001)."""
    conn = connect(dsn, autocommit=autocommit)
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    return decode_apart(read_far_dates(conn))


def _fetch_job(conn: psycopg.Connection, job_id: int) -> dict | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("select * from awa.job(%s::bigint)", [job_id]).fetchone()


@bad_input_is_usage
def cmd_show(args: argparse.Namespace) -> int:
    with _connect(args.dsn) as conn:
        job = _fetch_job(conn, args.job_id)
    if job is None:
        err(f"no job {args.job_id} (unknown, or removed by retention)")
        return EXIT_NO_SUCH_JOB
    if args.json:
        print(json.dumps(as_json(job), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        _print_job(job)
    return 0


def _in_range(flag: str, value: int) -> bool:
    if 1 <= value <= MAX_JOBS:
        return True
    err(f"{flag} must be between 1 and {MAX_JOBS}, got {value}")
    return False


@bad_input_is_usage
def cmd_list(args: argparse.Namespace) -> int:
    if not _in_range("--limit", args.limit):
        return EXIT_USAGE
    if args.worker is not None and args.state not in (None, "running"):
        err(f"--worker {args.worker!r} lists running jobs only (a worker holds no others): "
            f"drop --state {args.state}, or give --state running")
        return EXIT_USAGE
    with _connect(args.dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "select * from awa.jobs(%s::text, %s::text, %s::text, %s::bigint, %s::integer,"
            " %s::text)",
            [args.queue, args.state, args.kind, args.after, args.limit, args.worker]).fetchall()
    more = len(rows) == args.limit
    if args.json:
        print(json.dumps({"jobs": [as_json(r) for r in rows],
                          "next_after": rows[-1]["job_id"] if more else None},
                         indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    if not rows:
        if args.worker is not None:
            print(f"no running jobs held by worker {args.worker!r} in {args.queue}"
                  f"{' after job ' + str(args.after) if args.after else ''}")
        else:
            print("no jobs")
        return 0
    several = len({r["queue"] for r in rows}) > 1
    # Running jobs: who runs them and until when (awa.release_worker's input).
    running = any(r["worker"] is not None for r in rows)
    print(table(
        ["job", "state", *(["queue"] if several else []), "kind", "attempts", "enqueued",
         "at", *(["worker", "lease until"] if running else []), "last error"],
        [(r["job_id"], r["state"], *([r["queue"]] if several else []), r["kind"],
          f"{r['attempt']}/{r['max_attempts']}", _when(r["enqueued_at"]),
          _when(r["finished_at"] or r["run_at"]),
          *([r["worker"] or "", _when(r["lease_expires_at"])] if running else []),
          _short(r["last_error"]))
         for r in rows]))
    if more:
        print(f"\nmore: --after {rows[-1]['job_id']}")
    return 0


@bad_input_is_usage
def cmd_failures(args: argparse.Namespace) -> int:
    if not _in_range("--limit", args.limit):
        return EXIT_USAGE
    with _connect(args.dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
        # One group more than shown: whether there are more.
        rows = cur.execute(
            "select * from awa.failure_summary(%s::text, %s::interval, %s::integer)",
            [args.queue, _interval(args.since), min(args.limit + 1, MAX_JOBS)]).fetchall()
    more = len(rows) > args.limit
    rows = rows[: args.limit]
    if args.json:
        print(json.dumps({"failures": [as_json(r) for r in rows], "more": more},
                         indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    where = f" of {args.queue}" if args.queue else ""
    # A job that fails every attempt is retried for hours (25 attempts,
    # backoff up to an hour) before it is failed for good: those attempts
    # are in awa.scheduled, which the summary does not read. Said on stderr,
    # so that the table stays what a script reads.
    queue = shlex.quote(args.queue) if args.queue else "QUEUE"
    print(f"jobs still retrying are not counted here: awa jobs list --queue {queue}"
          " --state scheduled shows them, with their last error", file=sys.stderr)
    if not rows:
        print(f"no failed jobs kept{where}"
              + (f" that failed in the last {args.since}" if args.since else ""))
        return 0
    print(table(
        ["queue", "kind", "failed", "first", "last", "last job", "error"],
        [(r["logical_queue"], r["kind"], r["failed"], _when(r["first_failed_at"]),
          _when(r["last_failed_at"]), r["sample_job_id"], r["error"] or "(no error)")
         for r in rows]))
    if more:
        print(f"\nmore: the {args.limit} groups of most failures are shown; --limit for more")
    return 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _one(args: argparse.Namespace, function: str, verb: str, applies_to: str) -> int:
    with _connect(args.dsn) as conn:
        conn.execute(f"set local lock_timeout = '{JOB_TOOL_LOCK_TIMEOUT}'")
        changed = conn.execute(f"select awa.{function}(%s::bigint)",
                               [args.job_id]).fetchone()[0]
        job = _fetch_job(conn, args.job_id)
        conn.commit()
    if changed:
        if args.json:
            print(json.dumps({"job_id": args.job_id, "changed": True,
                              "state": job["state"] if job else None}))
        else:
            print(f"{verb} job {args.job_id}: now {job['state'] if job else 'gone'}")
        return 0
    if job is None:
        err(f"no job {args.job_id} (unknown, or removed by retention)")
        return EXIT_NO_SUCH_JOB
    if args.json:
        print(json.dumps({"job_id": args.job_id, "changed": False, "state": job["state"]}))
    if function == "retry_job" and job["state"] in ("failed", "cancelled"):
        err(f"job {args.job_id} is {job['state']} but was not retried: {RETRY_REFUSED}; "
            "nothing changed")
    else:
        err(f"job {args.job_id} is {job['state']}: only {applies_to} jobs can be {verb}; "
            "nothing changed")
    return EXIT_WRONG_STATE


def _jobs(n: int) -> str:
    return "job" if n == 1 else "jobs"


def _bulk(args: argparse.Namespace, function: str, states: tuple[str, ...], ask: str,
          verb: str) -> int:
    if not _in_range("--batch", args.batch):
        return EXIT_USAGE
    bound = BOUND_ARGUMENT[function.removesuffix("_jobs")]
    with _connect(args.dsn, autocommit=True) as conn:
        # How many there are now, counted up to the most one call may take,
        # every state in the snapshot of the bound (a job taken beyond the
        # count is said below).
        before, counts = count_in_bound(conn, args.queue, states, args.kind, MAX_JOBS)
        total = sum(counts.values())
        what = " and ".join(f"{n} {s}" for s, n in counts.items() if n)
        kind = f" of kind {args.kind!r}" if args.kind else ""
        if total == 0:
            if args.json:
                _print_bulk_json(args, verb, 0, False)
            else:
                print(f"no {' or '.join(states)} jobs{kind} in {args.queue}")
            return 0
        capped = any(n >= MAX_JOBS for n in counts.values())
        at_least = "at least " if capped else ""
        question = f"{ask} {at_least}{what} {_jobs(total)}{kind} of {args.queue}?"
        if not args.yes and not _confirm(question):
            err(f"not {verb} ({question}): pass --yes when not attached to a terminal, "
                "or answer y")
            return EXIT_USAGE
        # Until a call finds none left before the bound; a count that met
        # the cap stops at it (more may be left, said below).
        done = 0
        while not capped or done < total:
            try:
                with conn.transaction():
                    conn.execute(f"set local lock_timeout = '{JOB_TOOL_LOCK_TIMEOUT}'")
                    # The state a retry takes (awa.retry_jobs's fourth argument);
                    # a cancel takes ready and scheduled jobs, no state.
                    with_state = ", %s::text" if args.state is not None else ""
                    n = conn.execute(
                        f"select awa.{function}(%s::text, %s::text, %s::integer{with_state},"
                        f" {bound} => %s::timestamptz)",
                        [args.queue, args.kind,
                         min(args.batch, total - done) if capped else args.batch,
                         *([args.state] if args.state is not None else []),
                         before]).fetchone()[0]
            except psycopg.Error as error:
                if done:
                    _say_partial(args, verb, kind, done, error)
                raise  # its exit code (5 for a lock timeout), as for a first batch
            if n == 0:
                break
            done += n
    if args.json:
        _print_bulk_json(args, verb, done, capped)
    else:
        print(f"{verb} {done} {_jobs(done)}{kind} of {args.queue}")
    if done < total:
        _say_left(args, states, total - done, total, verb)
    elif done > total:
        _say_more(states, done - total, total, verb)
    if capped:
        err(f"counted at most {MAX_JOBS} {' or '.join(states)} jobs a state: more may be "
            "left; run the command again")
    return 0


def _print_bulk_json(args: argparse.Namespace, verb: str, done: int, more: bool,
                     error: psycopg.Error | None = None) -> None:
    # A retry names the state it took (failed, or --state's); a cancel takes none.
    state = {"state": args.state} if args.state is not None else {}
    failed = {} if error is None else {"error": {
        "sqlstate": error.sqlstate,
        "message": error.diag.message_primary or str(error).strip()}}
    print(json.dumps({"queue": args.queue, "kind": args.kind, **state, verb: done,
                      "more": more, **failed}))


def _say_partial(args: argparse.Namespace, verb: str, kind: str, done: int,
                 error: psycopg.Error) -> None:
    """A batch failed after others were committed (each batch is its own
    transaction): what they changed stays changed, and is said before the
    error, on stdout as on success (``error`` added to --json's object)."""
    if args.json:
        _print_bulk_json(args, verb, done, True, error)
    else:
        print(f"{verb} {done} {_jobs(done)}{kind} of {args.queue}")
    # No SQLSTATE: the connection was lost, perhaps during the failed
    # batch's COMMIT, which may then have been applied.
    rest = ("the rest of the queue's were not" if error.sqlstate else
            "the batch that failed may or may not have been applied, the rest were not")
    err(f"a batch failed after earlier batches were committed: the {done} {_jobs(done)} "
        f"they {verb} stay{'s' if done == 1 else ''} {verb}, {rest}; run the command "
        "again for them once the error below is resolved")


def _say_left(args: argparse.Namespace, states: tuple[str, ...], left: int, total: int,
              verb: str) -> None:
    """Jobs counted that the calls did not change: the function passes over
    them (a failed job whose unique key another job holds), or they changed
    meanwhile (another operator, a worker)."""
    why = (f"{RETRY_REFUSED}, or it changed meanwhile" if verb == "retried"
           else "it changed meanwhile (claimed, finished or cancelled by another caller)")
    err(f"{left} of the {total} {' or '.join(states)} {_jobs(total)} counted "
        f"{'was' if left == 1 else 'were'} not {verb}: {'' if left == 1 else 'for each, '}{why}; "
        f"awa jobs list --queue {shlex.quote(args.queue)} --state {states[0]} lists "
        f"{'it' if left == 1 else 'them'}")


def _say_more(states: tuple[str, ...], more: int, total: int, verb: str) -> None:
    """Jobs taken beyond those counted: their transaction was open as the
    count ran (it began before, committed after), or, for a retry, a job
    retried and failed again by such a transaction, or, for a cancel, a job
    back to wait since with its first enqueue time (a failed attempt, a
    retry)."""
    why = ("its failure or cancel was being committed as the count ran, or a transaction"
           " open then claimed it after a retry and failed it again" if verb == "retried"
           else "it was being enqueued as the count ran, or came back to wait since (a "
           "failed attempt, a retry)")
    err(f"{more} {_jobs(more)} {verb} beyond the {total} {' or '.join(states)} "
        f"{_jobs(total)} counted: {'' if more == 1 else 'for each, '}{why}")


def _check_target(args: argparse.Namespace) -> bool:
    if (args.job_id is None) == (args.queue is None):
        err("give a job id, or --queue Q for every job of a queue")
        return False
    if args.job_id is not None and args.kind is not None:
        err("--kind goes with --queue")
        return False
    if args.job_id is not None and args.state is not None:
        err("--state goes with --queue (a job retried by id may be failed or cancelled)")
        return False
    return True


@bad_input_is_usage
def cmd_retry(args: argparse.Namespace) -> int:
    if not _check_target(args):
        return EXIT_USAGE
    if args.job_id is not None:
        return _one(args, "retry_job", "retried", "failed or cancelled")
    args.state = args.state or "failed"
    return _bulk(args, "retry_jobs", (args.state,), "Retry", "retried")


@bad_input_is_usage
def cmd_cancel(args: argparse.Namespace) -> int:
    if not _check_target(args):
        return EXIT_USAGE
    if args.job_id is not None:
        return _one(args, "cancel_job", "cancelled", "scheduled, ready or running")
    return _bulk(args, "cancel_jobs", ("ready", "scheduled"), "Cancel", "cancelled")


@bad_input_is_usage
def cmd_release_worker(args: argparse.Namespace) -> int:
    with connect(args.dsn, autocommit=True) as conn:
        released = conn.execute("select awa.release_worker(%s)", [args.worker]).fetchone()[0]
    if args.json:
        print(json.dumps({"worker": args.worker, "released": released}))
    elif released:
        print(f"ended the leases of {released} running {_jobs(released)} of worker "
              f"{args.worker}: the next rescue pass of awa maintain sends "
              f"{'it' if released == 1 else 'them'} back to retry, the attempt counted")
    else:
        print(f"worker {args.worker} runs no job: nothing changed")
    return 0
