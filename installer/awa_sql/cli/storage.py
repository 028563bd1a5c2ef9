"""``awa storage ...``: the shard operations (awa_sql.shards) from a terminal or a script."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

import psycopg

from awa_sql import queues, shards
from awa_sql.cli.common import (
    EXIT_WRONG_STATE,
    add_connection,
    bad_input_is_usage,
    err,
    parse_interval,
    printable,
    sqlstate_suffix,
)
from awa_sql.connect import connect, network_defaults, one_line, resolve_dsn
from awa_sql.defaults import SCHEDULED_CAP
from awa_sql.maintain import Backoff
from awa_sql.migrate import EXIT_USAGE
from awa_sql.routing import MAX_SHARDS

EXIT_NOT_CONFIRMED = EXIT_USAGE
AUTOSCALE_APPLICATION = "awa-sql autoscale"  # the loop's application_name
INT4 = (-(2**31), 2**31 - 1)


def parse_max_queues(text: str) -> int:
    """A whole number a PostgreSQL integer holds: awa.set_max_queues checks
    its range itself, and names it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"the queue limit must be a whole number, got {text!r}") from None
    if not INT4[0] <= value <= INT4[1]:
        raise argparse.ArgumentTypeError(
            f"the queue limit must be a PostgreSQL integer ({INT4[0]}..{INT4[1]}), "
            f"got {text!r}")
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, numbers right-aligned; control and format
    characters of a cell escaped (common.printable)."""
    cells = [[("" if v is None else printable(str(v))) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) and rows
               for i in range(len(headers))]

    def line(values):
        padded = (
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def register(sub: argparse._SubParsersAction) -> None:
    storage_parser = sub.add_parser("storage", help="show and change queue storage")
    ss = storage_parser.add_subparsers(dest="storage_command", required=True)

    p = ss.add_parser(
        "set-enqueue-shards", help="change a queue's enqueue shards (S)",
        description=f"Set S, the enqueue shards of a queue and all its stripes (1..{MAX_SHARDS}). "
        "Raising provisions the new lanes in the same transaction; lowering lets the lanes "
        "above the new S drain. With --auto or --shadow, a queue that does not exist yet is "
        "created with S = 1 (--manual --shards N: with S = N) in the same transaction as its "
        "mode; a mode's --dry-run makes the change and rolls it back, so it fails where the "
        "change would.")
    add_connection(p)
    p.add_argument("--queue", required=True,
                   help="queue name: a logical queue (all its partitions and stripes), or one "
                   "partition (orders__p1)")
    p.add_argument("--shards", type=int, help=f"new S, 1..{MAX_SHARDS}")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--auto", dest="mode", action="store_const", const="auto",
                      help="let the auto-scaler change S within 1..--max")
    mode.add_argument("--shadow", dest="mode", action="store_const", const="shadow",
                      help="the auto-scaler logs what it would do, S stays as it is")
    mode.add_argument("--manual", dest="mode", action="store_const", const="manual",
                      help="S changes only by hand (the default mode); with --shards sets S")
    p.add_argument("--max", dest="max_shards", type=int,
                   help="with --auto or --shadow: the highest S the auto-scaler may set, "
                   f"1..{MAX_SHARDS}")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.set_defaults(func=cmd_set_enqueue_shards, needs="awa_operator")

    s = ss.add_parser("show", help="queues, their S and per-lane depth and lag")
    add_connection(s)
    s.add_argument("--queue", help="one logical queue (all its stripes)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_show, needs="awa_reader or awa_operator")

    for name, paused, what in (
        ("pause", True, "claims take nothing from the queue; producers may still enqueue"),
        ("resume", False, "claims take the queue's jobs again"),
    ):
        p = ss.add_parser(
            name, help=f"{name} a queue: {what}",
            description=f"{name.capitalize()} a queue with all its partitions and stripes "
            f"(awa.{name}_queue): {what}. Says whether it changed anything; a queue "
            f"{'already paused' if paused else 'not paused'} is left as it is (exit 0). Needs "
            "awa_operator. Exit codes: 0 done, 2 a bad or unknown queue name, 7 connection "
            "or server error (42501: the login lacks awa_operator).")
        add_connection(p)
        p.add_argument("queue", nargs="?", metavar="QUEUE",
                       help="queue name: a logical queue (all its partitions and stripes), or "
                       "one partition (orders__p1)")
        p.add_argument("--queue", dest="queue_option", metavar="QUEUE",
                       help="the same, as the other storage commands take it")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_set_paused, paused=paused, needs="awa_operator")

    d = ss.add_parser(
        "drop", help="drop an empty queue",
        description="Drop an empty queue (awa.drop_queue, ADR 044): its name is free at once "
        "(an enqueue to it creates a new queue), and awa maintain's drops pass "
        "(awa.finish_drops) removes it, with its lanes and sequences, once no session can "
        "still enqueue to it by the old name; a job that came late puts it back instead. "
        "Refused, changing nothing, for a queue that holds ready, scheduled or running jobs, "
        "unique keys or kept terminal jobs (--discard-finished deletes those), and for "
        "partitions, stripes and queues that have them (not supported yet). Asks for "
        "confirmation. Needs awa_operator. Exit codes: 0 dropped; 2 a bad or unknown queue "
        "name, or not confirmed; 7 connection or server error (42501: the login lacks "
        "awa_operator); 9 the queue is not empty, or not one that can be dropped (nothing "
        "changed).")
    add_connection(d)
    d.add_argument("queue", metavar="QUEUE", help="the queue's name")
    d.add_argument("--discard-finished", action="store_true",
                   help="delete the queue's kept terminal jobs (completed, failed, cancelled) "
                   "and the unique keys their windows hold, with the drop")
    d.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_drop, needs="awa_operator")

    q = ss.add_parser(
        "queue-limit", help="show or set the queue limit",
        description="Show the queue limit, the most physical queues (partitions and stripes "
        "count) that may exist, and how many do (awa.queue_limit); with MAX_QUEUES, set it "
        "(awa.set_max_queues, ADR 039). At the limit, an enqueue to a name no queue has "
        "fails with 53400 while enqueues to existing queues go on; a limit below the count "
        "removes nothing. Showing needs awa_reader or awa_operator, setting awa_operator. "
        "Exit codes: 0 done; 2 a value out of the database's range (it names the range) or "
        "not a whole number; 7 connection or server error (42501: the login lacks the "
        "role).")
    add_connection(q)
    q.add_argument("max_queues", nargs="?", type=parse_max_queues, metavar="MAX_QUEUES",
                   help="the new limit (the database takes 1..1000000)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_queue_limit, needs="awa_reader or awa_operator")

    a = ss.add_parser("autoscale", help="run the enqueue-shard auto-scaler")
    aa = a.add_subparsers(dest="autoscale_command", required=True)
    r = aa.add_parser(
        "run", help="tick the auto-scaler in a loop",
        description="Call awa.autoscale_tick() every --interval until SIGINT or SIGTERM (exit "
        "0). Many processes may run this at once: a tick that finds another in progress does "
        "nothing, so no two decide at once; each process ticks at its own --interval. A "
        "connection that fails or is lost (a restart, a failover, pg_terminate_backend) or a "
        "server that takes no writes is connected again with awa maintain's back-off (0.5 s "
        "doubling up to 30 s); a tick that fails otherwise is said once on stderr and tried "
        "again at the next --interval. An error every tick would repeat exits 7: SQLSTATE "
        "class 42 (42501: the login lacks awa_maintenance; 42883: awa is not installed or "
        "too old) or 3F000 (no schema awa). --once ticks once: a failed tick exits as any "
        "command does (7). "
        "Needs awa_maintenance.")
    add_connection(r)
    r.add_argument("--interval", default="5s", type=parse_interval,
                   help="time between ticks: 5s, 500ms, 1m (default %(default)s)")
    r.add_argument("--once", action="store_true", help="one tick, then exit")
    r.add_argument("--verbose", action="store_true", help="print holds too")
    r.set_defaults(func=cmd_autoscale_run, needs="awa_maintenance")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _shards_in_range(flag: str, value: int) -> bool:
    if 1 <= value <= MAX_SHARDS:
        return True
    print(f"awa: {flag} must be between 1 and {MAX_SHARDS}, got {value}", file=sys.stderr)
    return False


NEW_QUEUE = " (new queue)"


def _changes_table(changes: Sequence[shards.ShardChange], new_queue: bool,
                   headers: Sequence[str]) -> str:
    """One row per physical queue; a queue that did not exist before the
    change is marked, since its S "1" is only what it is created with."""
    return table(headers, [(c.physical_queue + (NEW_QUEUE if new_queue else ""), c.old_shards,
                            c.new_shards, c.lanes_created) for c in changes])


@bad_input_is_usage
def cmd_set_enqueue_shards(args: argparse.Namespace) -> int:
    if args.mode is not None:
        return cmd_set_shard_mode(args)
    if args.shards is None:
        print("awa: give --shards N, or a mode: --auto/--shadow --max N, --manual",
              file=sys.stderr)
        return EXIT_USAGE
    if args.max_shards is not None:
        print("awa: --max goes with --auto or --shadow", file=sys.stderr)
        return EXIT_USAGE
    if not _shards_in_range("--shards", args.shards):
        return EXIT_USAGE
    with connect(args.dsn) as conn:
        new_queue = _show_shards_plan(conn, args.queue, args.shards)
        if args.dry_run:
            print("dry run: nothing changed")
            return 0
        creates = ", creating the queue" if new_queue else ""
        question = f"Set S = {args.shards} for {args.queue}{creates}?"
        if not args.yes and not _confirm(question):
            print(f"awa: not changed ({question}): pass --yes to change S when not attached "
                  "to a terminal, or answer y", file=sys.stderr)
            return EXIT_NOT_CONFIRMED
        changes = shards.set_enqueue_shards(conn, args.queue, args.shards)
        conn.commit()
    print()
    print(_changes_table(changes, new_queue,
                         ["physical queue", "old S", "new S", "lanes created"]))
    return 0


def _show_shards_plan(conn, queue: str, n: int) -> bool:
    """Prints what S = n would change (each physical queue's lanes, and what
    it means for ordering), changing nothing; true when it creates the queue.
    A bad name (empty, too long, a stripe's) raises here: exit 2."""
    new_queue = not shards._known_queue(conn, queue)
    plan = shards.plan_enqueue_shards(conn, queue, n)
    conn.rollback()
    print(_changes_table(plan, new_queue,
                         ["physical queue", "current S", "new S", "lanes to create"]))
    old = max(c.old_shards for c in plan)
    print()
    if new_queue:
        print(f"There is no queue {queue!r} yet: this creates it with S = {n}.")
    print(shards.ordering_consequence(queue, old, n))
    return new_queue


@bad_input_is_usage
def cmd_set_shard_mode(args: argparse.Namespace) -> int:
    for flag, value in (("--max", args.max_shards), ("--shards", args.shards)):
        if value is not None and not _shards_in_range(flag, value):
            return EXIT_USAGE
    if args.mode != "manual" and args.shards is not None:
        print(f"awa: --{args.mode} takes --max, not --shards: the auto-scaler sets S",
              file=sys.stderr)
        return EXIT_USAGE
    if args.mode != "manual" and args.max_shards is None:
        print(f"awa: --{args.mode} needs --max N (1..{MAX_SHARDS})", file=sys.stderr)
        return EXIT_USAGE
    with connect(args.dsn) as conn:
        # --manual --shards N changes S too: shown and asked as --shards N is.
        if args.shards is not None:
            new_queue = _show_shards_plan(conn, args.queue, args.shards)
        else:
            new_queue = not shards._known_queue(conn, args.queue)
            conn.rollback()
            if new_queue and args.mode == "manual":
                print(f"awa: there is no queue {args.queue!r}: a new queue is manual already "
                      "(--manual --shards N creates it with S = N)", file=sys.stderr)
                return EXIT_USAGE
            if new_queue:
                print(f"There is no queue {args.queue!r} yet: this creates it with S = 1.")
        print(shards.mode_consequence(args.queue, args.mode, args.max_shards))
        if args.dry_run:
            # The change itself, rolled back: what the database refuses (a
            # partition's name, the queue limit, a standby) fails here as it
            # would without --dry-run.
            _set_shard_mode(conn, args, new_queue)
            conn.rollback()
            print("dry run: nothing changed")
            return 0
        also = f" and S = {args.shards}" if args.shards is not None else ""
        creates = ", creating the queue" if new_queue else ""
        if not args.yes and not _confirm(f"Set {args.queue} to {args.mode}{also}{creates}?"):
            print("awa: not changed: pass --yes when not attached to a terminal, or answer y",
                  file=sys.stderr)
            return EXIT_NOT_CONFIRMED
        changed = _set_shard_mode(conn, args, new_queue)
        if changed is None:
            conn.rollback()
            print(f"awa: queue {args.queue!r} was created by another session since the plan "
                  "above, with another S: nothing changed; run the command again",
                  file=sys.stderr)
            return EXIT_WRONG_STATE
        (queue, mode, max_shards), changes = changed
        conn.commit()
    print(f"{printable(queue)}: mode {mode}, max "
          f"{max_shards if max_shards is not None else '-'}")
    if changes:
        print(_changes_table(changes, new_queue,
                             ["physical queue", "old S", "new S", "lanes created"]))
    return 0


def _set_shard_mode(conn, args: argparse.Namespace, new_queue: bool
                    ) -> tuple[tuple[str, str, int | None], list[shards.ShardChange]] | None:
    """--auto/--shadow/--manual in the caller's transaction: S first, when
    --shards gives it or the queue does not exist yet (S = 1), since
    awa.set_enqueue_shards creates a missing queue and awa.set_shard_mode does
    not (and so the provisioning lock comes before the queue's row, the
    order of every change of S); then the mode. None, having changed S, when
    the queue thought new was created meanwhile with another S: the caller
    rolls back."""
    changes = []
    if args.shards is not None or new_queue:
        changes = shards.set_enqueue_shards(conn, args.queue, args.shards or 1)
        if args.shards is None and any(c.old_shards != c.new_shards for c in changes):
            return None
    return shards.set_shard_mode(conn, args.queue, args.mode, args.max_shards), changes


@bad_input_is_usage
def cmd_set_paused(args: argparse.Namespace) -> int:
    command = "pause" if args.paused else "resume"
    if args.queue is not None and args.queue_option is not None \
            and args.queue != args.queue_option:
        print(f"awa: give the queue once: {args.queue!r} or --queue {args.queue_option!r}",
              file=sys.stderr)
        return EXIT_USAGE
    queue = args.queue if args.queue is not None else args.queue_option
    if queue is None:
        print(f"awa: give the queue to {command}: awa storage {command} QUEUE",
              file=sys.stderr)
        return EXIT_USAGE
    with connect(args.dsn) as conn:
        # An unknown queue (42704) or a bad name (22xxx) raises here: exit 2.
        changed = conn.execute(f"select awa.{command}_queue(%s::text)", [queue]).fetchone()[0]
        conn.commit()
    if args.json:
        print(json.dumps({"queue": queue, "paused": args.paused, "changed": changed},
                         sort_keys=True))
    elif changed:
        print(f"{command}d {printable(queue)}")
    else:
        print(f"{printable(queue)} was {'already paused' if args.paused else 'not paused'}: "
              "nothing changed")
    return 0


@bad_input_is_usage
def cmd_drop(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        # An unknown queue (42704) or a bad name (22xxx) raises here: exit 2.
        question = queues.plan_drop(conn, args.queue, args.discard_finished)["question"]
        conn.rollback()
        if not args.yes and not _confirm(question):
            print(f"awa: not dropped ({question}): pass --yes when not attached to a terminal, "
                  "or answer y", file=sys.stderr)
            return EXIT_NOT_CONFIRMED
        try:
            queues.drop(conn, args.queue, args.discard_finished)
        except psycopg.Error as error:
            if error.sqlstate not in ("55006", "0A000"):
                raise
            conn.rollback()
            hint = f"\n{error.diag.message_hint}" if error.diag.message_hint else ""
            if error.sqlstate == "55006":
                # The server's hint is spelled for SQL (discard_finished =>
                # true); say it in this command's flags.
                hint = (f"\nLet its jobs finish, or cancel its ready and scheduled ones "
                        f"(awa jobs cancel --queue {shlex.quote(args.queue)}); "
                        "--discard-finished deletes its kept terminal jobs with the drop.")
            print(f"awa: {error.diag.message_primary} (SQLSTATE {error.sqlstate}){hint}",
                  file=sys.stderr)
            return EXIT_WRONG_STATE
        conn.commit()
    if args.json:
        print(json.dumps({"queue": args.queue, "dropped": True}, sort_keys=True))
    else:
        print(f"dropped {args.queue}: awa maintain removes it (awa.finish_drops) once no "
              "session can still enqueue to it by that name")
    return 0


def _queues_text(n: int) -> str:
    return f"{n} queue exists" if n == 1 else f"{n} queues exist"


@bad_input_is_usage
def cmd_queue_limit(args: argparse.Namespace) -> int:
    if args.max_queues is not None:
        args.needs = "awa_operator"
    with connect(args.dsn) as conn:
        if args.max_queues is None:
            limit = queues.queue_limit(conn)
        else:
            # A value out of range (22023, naming it) raises here: exit 2.
            limit = queues.set_queue_limit(conn, args.max_queues)
            conn.commit()
    if args.json:
        print(json.dumps(limit, sort_keys=True))
    elif args.max_queues is None:
        print(f"queue limit {limit['max_queues']}: {_queues_text(limit['queues'])}")
    else:
        print(f"queue limit {limit['max_queues']} (was {limit['previous']}): "
              f"{_queues_text(limit['queues'])}")
    return 0


def _print_decision(d: shards.Decision) -> None:
    print(f"{d.decided_at:%H:%M:%S} {printable(d.summary())}", flush=True)


def cmd_autoscale_run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def _stop(_signum, _frame):
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = f"awa: auto-scaler ticking every {args.interval:g}s; Ctrl-C stops"
    try:
        if args.once:  # one tick: its error is the exit code, as any command's
            with connect(args.dsn, autocommit=True,
                         application_name=AUTOSCALE_APPLICATION) as conn:
                print(started, flush=True)
                _tick(conn, args.verbose)
        else:
            print(started, flush=True)
            _tick_until(stop, args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("awa: auto-scaler stopped", flush=True)
    return 0


def _tick(conn: psycopg.Connection, verbose: bool) -> None:
    for d in shards.autoscale_tick(conn):
        if verbose or d.action != "held":
            _print_decision(d)


def _fails_every_tick(error: psycopg.Error) -> bool:
    """An error no retry mends: class 42 (42501: the login lacks
    awa_maintenance; 42883: awa.autoscale_tick is not installed) or 3F000 (no
    schema awa). Anything else (a lost connection, a restart, 57P01 from
    pg_terminate_backend, a standby after a failover, a timeout, a deadlock)
    may pass."""
    return bool(error.sqlstate) and (error.sqlstate.startswith("42")
                                     or error.sqlstate == "3F000")


def _tick_until(stop: threading.Event, args: argparse.Namespace) -> None:
    """Ticks every --interval until ``stop``, as awa maintain runs its passes:
    a connection that fails or is lost is opened again with its back-off,
    and a tick that fails is said once, on stderr, and tried again at the
    next interval; an error of _fails_every_tick raises (exit 7)."""
    dsn = resolve_dsn(args.dsn)
    backoff = Backoff(stop)
    troubled = False  # the last connection failed or was lost
    failing = None  # the error the last tick said, until one works again
    while not stop.is_set():
        try:
            conn = connect(dsn, autocommit=True, application_name=AUTOSCALE_APPLICATION,
                           **network_defaults(dsn))
        except psycopg.OperationalError as error:
            if stop.is_set():
                break
            err(f"cannot connect: {one_line(error)}; retrying in {backoff.delay:.1f} s")
            troubled = True
            backoff.wait()
            continue
        if troubled:
            err("connected again")
            troubled = False
        with conn:
            while not stop.is_set():
                try:
                    _tick(conn, args.verbose)
                except psycopg.Error as error:
                    if _fails_every_tick(error):
                        raise
                    said = f"{type(error).__name__}{sqlstate_suffix(error)}: {one_line(error)}"
                    # A standby (25006) stays one on this connection: a
                    # failover is found by connecting again.
                    if conn.closed or isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
                        if not stop.is_set():
                            err(f"the tick failed: {said}; connecting again in "
                                f"{backoff.delay:.1f} s")
                            troubled = True
                            backoff.wait()
                        break
                    if said != failing:
                        err(f"the tick failed: {said}; trying again every {args.interval:g}s")
                    failing = said
                else:
                    backoff.reset()
                    if failing is not None:
                        err("the tick works again")
                        failing = None
                stop.wait(args.interval)


def _fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _state(lane: shards.LaneStatus, shards: int) -> str:
    if lane.shard < shards:
        return "active"
    if lane.draining:
        return "draining"
    return "drained (>= S, empty, still walked)" if lane.walked else "retired (out of the walk)"


def _print_autoscale(q: shards.QueueStatus) -> None:
    if q.shard_mode == "manual" and q.last_decision is None:
        return
    print(f"\n{printable(q.queue)}: mode {q.shard_mode}, max "
          f"{q.max_shards if q.max_shards is not None else '-'}")
    sig = q.signal
    if sig:
        print(f"  signal (last minute): {sig['samples']} samples, wait share "
              f"{sig['wait_share']:.2f}, {sig['mean_waiters_per_held_lane']:.2f} waiters per "
              f"held lane, {sig['enqueue_rate'] or 0:.0f} enqueues/s")
    else:
        print("  signal: no samples in the last minute (is `awa maintain`, or `awa storage "
              "autoscale run`, running?)")
    d = q.last_decision
    if d:
        print(f"  last decision {d['decided_at']}: {d['action']} S {d['current_shards']} -> "
              f"{d['proposed_shards']}: {printable(d['reason'])}")


@bad_input_is_usage
def cmd_show(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        queues = shards.show(conn, args.queue)
    if args.queue is not None and not queues:
        print(f"awa: no queue {args.queue!r}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({"queues": [q.as_dict() for q in queues]}, indent=2, sort_keys=True))
        return 0
    if not queues:
        print("no queues")
        return 0
    print(table(
        ["queue", "S", "mode", "paused", "stripes", "ready", "running", "scheduled", "failed ever",
         "oldest ready"],
        [(q.queue, q.enqueue_shards, q.shard_mode, "yes" if q.paused else "no", q.stripes,
          q.ready, q.running,
          f"{q.scheduled}+" if q.scheduled >= SCHEDULED_CAP else q.scheduled,
          q.failed, _fmt_age(q.oldest_ready_age_seconds))
         for q in queues]))
    for q in queues:
        _print_autoscale(q)
    for q in queues:
        print(f"\nlanes of {printable(q.queue)} (S = {q.enqueue_shards})")
        print(table(
            ["priority", "shard", "ready", "lag", "next seq", "claim position", "state"],
            [(ln.priority, ln.shard, ln.ready, _fmt_age(ln.lag_seconds), ln.next_seq,
              ln.claim_position, _state(ln, q.enqueue_shards))
             for ln in q.lanes]))
    return 0
