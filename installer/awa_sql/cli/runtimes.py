"""``awa runtimes``: the live Python producers and workers (their snapshots,
awa_sql.runtimes.live), as the admin page's Runtimes panel shows them."""

from __future__ import annotations

import argparse
import json

from awa_sql.cli.common import add_connection, bad_input_is_usage, fmt_age, json_default
from awa_sql.cli.storage import table
from awa_sql.connect import connect
from awa_sql.runtimes import live


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "runtimes", help="the live Python producers and workers, and their queues",
        description="The Python producers and workers that published a snapshot in the last "
        "30 seconds (awa.runtime_overview; each publishes one every 10 s and removes it when "
        "it stops cleanly), one line per runtime and queue it enqueued to, claimed a job from or "
        "polled (a worker's claim call, with or without a job): "
        "host, pid, version, jobs in flight, how long ago it was last seen, and per queue how "
        "long ago it last did that and the S then. A worker's claims record it as "
        "HOST:PID:..., the name awa jobs release-worker takes: a worker missing here for "
        "longer than 30 s is stopped or cut off. Producers and workers in other languages "
        "publish nothing. Needs awa_reader or awa_operator. Exit codes: 0 done (none live "
        "too), 2 a bad or unknown queue name, 7 connection or server error.")
    add_connection(r)
    r.add_argument("--queue", help="only the runtimes that enqueued to, claimed from or "
                   "polled this queue (a logical name covers its partitions and stripes), with "
                   "only its lines")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=cmd_runtimes, needs="awa_reader or awa_operator")


@bad_input_is_usage
def cmd_runtimes(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        # A bad name (22xxx) or an unknown queue (42704) raises here: exit 2.
        runtimes = live(conn, args.queue)
    if args.json:
        print(json.dumps({"queue": args.queue, "runtimes": runtimes}, indent=2,
                         sort_keys=True, default=json_default))
        return 0
    if not runtimes:
        where = f" working on {args.queue}" if args.queue else ""
        print(f"no live runtimes{where} (Python producers and workers publish a snapshot "
              "every 10 s; others publish none)")
        return 0
    print(table(
        ["kind", "host", "pid", "version", "in flight", "last seen", "queue", "activity",
         "last", "S"],
        [(r["kind"], r["hostname"], r["pid"], r["version"], r["in_flight"],
          fmt_age(r["last_seen_age_seconds"]), q["queue"], q["activity"],
          fmt_age(q["age_seconds"]), q["shards"])
         for r in runtimes
         for q in r["queues"] or [{"queue": "-", "activity": "-", "age_seconds": None,
                                   "shards": "-"}]]))
    return 0
