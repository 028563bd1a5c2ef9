"""``awa metrics serve``: the database exporter as a standalone HTTP server."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from awa_sql.cli.common import add_allowed_hosts, add_connection, parse_port
from awa_sql.defaults import LOCAL_HOST, METRICS_PORT

ALLOWED_HOSTS_ENV = "AWA_METRICS_ALLOWED_HOSTS"


def register(sub: argparse._SubParsersAction) -> None:
    metrics_parser = sub.add_parser("metrics", help="Prometheus metrics of every queue")
    ms = metrics_parser.add_subparsers(dest="metrics_command", required=True)
    s = ms.add_parser(
        "serve", help="serve /metrics for Prometheus",
        description="Serve the database metrics (queue depth and lag, S and shard mode, "
        "per-lane depth and lag, lane contention, auto-scaler decisions) at /metrics, one "
        "query per scrape, until SIGINT or SIGTERM. A login with awa_reader is enough.")
    add_connection(s)
    s.add_argument("--host", default=LOCAL_HOST,
                   help="address to listen on (default %(default)s)")
    s.add_argument("--port", type=parse_port, default=METRICS_PORT,
                   help="TCP port; 0 picks a free one (default %(default)s)")
    add_allowed_hosts(s, ALLOWED_HOSTS_ENV)
    s.set_defaults(func=cmd_metrics_serve)


def cmd_metrics_serve(args: argparse.Namespace) -> int:
    from awa_sql.hosts import for_server
    from awa_sql.metrics.apps import serve

    check, warning = for_server("awa metrics serve", ALLOWED_HOSTS_ENV, args.host,
                                args.allowed_hosts)

    def ready(url: str) -> None:
        print(f"awa: serving metrics at {url}; Ctrl-C stops", flush=True)
        if warning:
            print(warning, file=sys.stderr, flush=True)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve(args.dsn, args.host, args.port, stop, ready=ready, hosts=check)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("awa: metrics server stopped", flush=True)
    return 0
