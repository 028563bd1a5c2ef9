"""``awa demo``: the contract running locally (awa_sql.demo)."""

from __future__ import annotations

import argparse
from pathlib import Path

from awa_sql.cli.common import parse_fixed_port, parse_port
from awa_sql.defaults import ADMIN_PORT, LOCAL_HOST
from awa_sql.demo import DEFAULT_PORT


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="the contract running: PostgreSQL 18, load, admin, metrics",
                       description="Start a local PostgreSQL 18 under --dir (or use --dsn), "
                       "install awa, run producers and a worker that runs the awa maintain loop "
                       "(the auto-scaler in shadow mode, due jobs, retries) on a demo queue, "
                       "and serve the admin page and /metrics. Ctrl-C stops everything.")
    d.add_argument("--dir", default=".awa", help="folder for the server (default %(default)s)")
    d.add_argument("--port", type=parse_fixed_port,
                   help=f"PostgreSQL port on {LOCAL_HOST} (default {DEFAULT_PORT})")
    d.add_argument("--http-port", type=parse_port, default=ADMIN_PORT,
                   help=f"admin page and /metrics port on {LOCAL_HOST} (default %(default)s; "
                   "0: one the system picks, printed)")
    d.add_argument("--dsn", help="run against this existing database instead")
    d.add_argument("--seconds", type=float, help="stop by itself after this many seconds")
    d.add_argument("--stop", action="store_true",
                   help="stop a demo server left running by a killed `awa demo`")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from awa_sql import demo

    folder = Path(args.dir)
    if args.stop:
        demo.stop(folder)
        return 0
    return demo.run(folder, port=args.port, http_port=args.http_port, dsn=args.dsn,
                    seconds=args.seconds, log=lambda line: print(line, flush=True))
