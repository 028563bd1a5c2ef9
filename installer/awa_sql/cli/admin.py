"""``awa admin serve``: the admin API and page, and /metrics (awa_sql.admin)."""

from __future__ import annotations

import argparse

from awa_sql.cli.common import add_allowed_hosts, add_connection, parse_interval, parse_port
from awa_sql.defaults import ADMIN_PORT, LOCAL_HOST


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("admin", help="the admin HTTP API and web page",
                       description="awa admin serve: the admin API and page (docs/admin.md), "
                       "and the database metrics at /metrics.")
    a.add_argument("action", choices=["serve"])
    add_connection(a)
    a.add_argument("--host", default=LOCAL_HOST, help="address to bind (default %(default)s)")
    a.add_argument("--port", type=parse_port, default=ADMIN_PORT,
                   help="TCP port (default %(default)s; 0: one the system picks, printed)")
    a.add_argument("--writable", action="store_true",
                   help="allow changes, for requests bearing the token in AWA_ADMIN_TOKEN "
                   "(a long random string; a short one is refused)")
    add_allowed_hosts(a, "AWA_ADMIN_ALLOWED_HOSTS")
    a.add_argument("--start-wait", type=parse_interval, default="30s",
                   help="how long to wait at start for the database before exiting 7 "
                   "(default %(default)s; 50ms..1h)")
    a.set_defaults(func=cmd_admin)


def cmd_admin(args: argparse.Namespace) -> int:
    from awa_sql.admin.serve import serve

    return serve(args.dsn, args.host, args.port, args.writable, args.allowed_hosts,
                 args.start_wait)
