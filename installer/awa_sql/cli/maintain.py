"""``awa maintain``: every maintenance task of awa_sql.maintain.TASKS
(promote, rescue, the auto-scaler tick, prune, ...) in one long-running
process (awa_sql.maintain), with its own /metrics."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from awa_sql.cli.common import (
    add_allowed_hosts,
    add_connection,
    err,
    fmt_age,
    json_default,
    parse_interval,
    parse_port,
)
from awa_sql.cli.storage import table
from awa_sql.connect import connect
from awa_sql.defaults import LOCAL_HOST, MAINTAIN_METRICS_PORT
from awa_sql.maintain import STATEMENT_TIMEOUT, TASKS, last_runs, missing_grant
from awa_sql.migrate import EXIT_ERROR, EXIT_USAGE

ALLOWED_HOSTS_ENV = "AWA_MAINTAIN_ALLOWED_HOSTS"
JOIN_TIMEOUT = 0.8  # seconds; stop() has cancelled any statement, so the loop ends sooner

HELP = {
    "promote": "move due scheduled jobs and retries into their lanes (awa.promote_due)",
    "rescue": "send jobs whose lease expired back to retry (awa.rescue_expired)",
    "move_staged": "enqueue COPY rows committed without awa.enqueue_copied() "
                   "(awa.move_staged)",
    "autoscale": "the enqueue-shard auto-scaler's tick (awa.autoscale_tick), as "
                 "`awa storage autoscale run` calls it",
    "prune": "remove finished jobs past their retention, slot by slot with TRUNCATE "
             "(awa.prune_finished, skipped while it is not installed)",
    "carry": "move finished jobs a queue keeps longer than a ring round out of the slot "
             "pruned next, in batches (awa.carry_finished, skipped while it is not "
             "installed)",
    "running_slots": "empty the slot of awa.running that claims no longer write, with "
                     "TRUNCATE (awa.rotate_running, skipped while it is not installed)",
    "lane_hints": "rewrite awa.lane_hints as each lane's highest hint, with TRUNCATE, once "
                  "a held snapshot has let it grow (awa.compact_lane_hints, skipped while it "
                  "is not installed)",
    "ready_rewrite": "rewrite awa.ready with its live rows only, with TRUNCATE, once a held "
                     "snapshot has left it many dead rows (awa.compact_ready, skipped while it "
                     "is not installed)",
    "scheduled_rewrite": "rewrite awa.scheduled with its live rows only, with TRUNCATE, once "
                         "a held snapshot has left it many dead rows of jobs promoted "
                         "(awa.compact_scheduled, skipped while it is not installed)",
    "unique_keys": "remove the unique keys of completed jobs whose window has passed "
                   "(awa.prune_unique_keys, skipped while it is not installed)",
    "ready_late": "remove the awa.ready_late rows of jobs gone from their lanes "
                  "(awa.prune_ready_late, skipped while it is not installed)",
    "retire_lanes": "take the drained lanes above S out of the claim walk once no snapshot "
                    "older than the change of S is left (awa.retire_lanes, skipped while it is "
                    "not installed)",
    "drops": "remove the queues awa.drop_queue dropped once no session can still enqueue to "
             "them by the old name, or put back one a job came to late (awa.finish_drops, "
             "skipped while it is not installed)",
    "shard_changes": "remove changes of S older than 90 days, each queue's latest kept "
                     "(awa.prune_shard_changes, skipped while it is not installed)",
}


def parse_every(text: str) -> float | None:
    """An interval as parse_interval reads it, or ``off``."""
    if text.strip().lower() == "off":
        return None
    try:
        return parse_interval(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}, or off") from None


def description() -> str:
    """``awa maintain --help``'s description, its list of tasks from TASKS."""
    tasks = ", ".join(f"{t.name} ({t.function.split('(')[0]})" for t in TASKS)
    return (
        f"Run the {len(TASKS)} maintenance tasks, each at its own cadence (its flag below), "
        f"until SIGINT or SIGTERM: {tasks}. Safe to run on every host at once: each pass is "
        "one transaction that takes its task's pass lock, awa.try_pass_lock(task), a row "
        "lock held until the transaction ends, and skips the pass while another process "
        "holds it, so no two processes run the same pass at once. Each process keeps its "
        "own cadence, so N processes make about N passes per cadence; the calls are safe to "
        "repeat (each acts on what is due when it runs). Works through PgBouncer in "
        "transaction mode; reconnects after a database restart. Needs a login holding "
        "awa_maintenance: another exits 7 at start, naming the role to grant.")


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "maintain", help="run the maintenance calls in one long-running process",
        description=description())
    add_connection(m)
    for task in TASKS:
        m.add_argument(task.flag, type=parse_every, default=task.every, metavar="INTERVAL",
                       help=f"{HELP[task.name]}; 50ms..1h or off (default {task.every:g}s)")
    m.add_argument("--statement-timeout", type=parse_interval, default=STATEMENT_TIMEOUT,
                   metavar="INTERVAL",
                   help=f"statement_timeout of each call (default {STATEMENT_TIMEOUT:g}s)")
    m.add_argument("--metrics-host", default=LOCAL_HOST,
                   help="address of the /metrics listener (default %(default)s)")
    m.add_argument("--metrics-port", type=parse_port, default=MAINTAIN_METRICS_PORT,
                   help="TCP port of /metrics; 0 picks a free one (default %(default)s)")
    add_allowed_hosts(m, ALLOWED_HOSTS_ENV, host_flag="--metrics-host")
    m.add_argument("--show", action="store_true",
                   help="run nothing: print when each task last ran and committed, whoever ran "
                   "it (awa maintain, a Worker, pg_cron: awa.maintenance_runs), and exit. "
                   "Needs awa_reader or awa_operator, not awa_maintenance")
    m.add_argument("--json", action="store_true", help="with --show: machine-readable output")
    m.set_defaults(func=cmd_maintain)


def cmd_show(args: argparse.Namespace) -> int:
    """``awa maintain --show``: the last run of each task, from the database."""
    args.needs = "awa_reader or awa_operator"
    with connect(args.dsn) as conn:
        runs = last_runs(conn)
    if runs is None:
        err("this database records no maintenance runs (awa.maintenance_runs, migration "
            "0034): run awa migrate")
        return EXIT_ERROR
    if args.json:
        print(json.dumps({"tasks": runs}, indent=2, sort_keys=True, default=json_default))
        return 0
    print(table(
        ["task", "function", "last run", "ago", "default every"],
        [(r["name"], (r["function"] or "-").split("(")[0],
          "-" if r["last_at"] is None else r["last_at"].isoformat(sep=" ", timespec="seconds"),
          fmt_age(r["age_seconds"]),
          "-" if r["default_every_seconds"] is None else f"{r['default_every_seconds']:g}s")
         for r in runs]))
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    if args.show:
        return cmd_show(args)
    if args.json:
        err("--json goes with --show")
        return EXIT_USAGE
    from prometheus_client import make_wsgi_app

    from awa_sql.hosts import for_server, url
    from awa_sql.maintain import Maintainer
    from awa_sql.metrics import client_metrics
    from awa_sql.metrics.apps import start_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s awa maintain: %(message)s")
    maintainer = Maintainer(
        args.dsn, every={t.name: getattr(args, t.name + "_every") for t in TASKS},
        statement_timeout=args.statement_timeout)
    if (missing := missing_grant(maintainer.dsn)) is not None:
        err(missing)
        return EXIT_ERROR
    check, warning = for_server("awa maintain", ALLOWED_HOSTS_ENV, args.metrics_host,
                                args.allowed_hosts, prefix="")
    server, _thread = start_server(args.metrics_host, args.metrics_port,
                                   make_wsgi_app(client_metrics.current().registry), check)
    log = logging.getLogger("awa_sql.maintain")
    log.info("%s; metrics at %s; Ctrl-C stops", maintainer.describe(),
             url(args.metrics_host, server.server_port, "/metrics"))
    if warning:
        log.warning("%s", warning)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    loop = maintainer.start()
    try:
        while loop.is_alive() and not stop.wait(0.1):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        maintainer.stop()
        loop.join(JOIN_TIMEOUT)
    # The /metrics server's thread is a daemon: it ends with the process.
    # (Its shutdown() alone may take half a second, a poll interval.)
    if not stop.is_set():
        err("the maintenance loop ended on an error (see above)")
        return EXIT_ERROR
    log.info("stopped")
    return 0
