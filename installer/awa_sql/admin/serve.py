"""``awa admin serve``: the app under uvicorn, with the database metrics at ``/metrics``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from fastapi import FastAPI
from psycopg_pool import ConnectionPool, PoolTimeout

from awa_sql.admin.app import MIN_TOKEN_LENGTH, Settings, create_app, make_pool, token_problem
from awa_sql.connect import resolve_dsn
from awa_sql.hosts import HostCheck, for_server, url
from awa_sql.listen import listen
from awa_sql.migrate import EXIT_ERROR

ALLOWED_HOSTS_ENV = "AWA_ADMIN_ALLOWED_HOSTS"


def settings_from(dsn: str | None, writable: bool, hosts: HostCheck | None = None,
                  start_wait: float = Settings.start_wait) -> Settings:
    token = os.environ.get("AWA_ADMIN_TOKEN") or None
    if writable and not token:
        raise ValueError("--writable needs a token: set AWA_ADMIN_TOKEN to a long random "
                         f"string (at least {MIN_TOKEN_LENGTH} characters) and send it as "
                         "'Authorization: Bearer <token>'")
    if writable and (problem := token_problem(token)):
        raise ValueError(problem)  # before the database is waited for
    return Settings(dsn=resolve_dsn(dsn), writable=writable, token=token, hosts=hosts,
                    start_wait=start_wait)


def create_served_app(settings: Settings, pool: ConnectionPool | None = None) -> FastAPI:
    """The admin app as ``awa admin serve`` and ``awa demo`` run it: ``/metrics``
    is the database exporter (as ``awa metrics serve``). A route, not a mount:
    a mount answers ``/metrics`` with a redirect to ``/metrics/``. The Host
    check of ``settings.hosts`` covers it too. Given a pool, the app uses it
    and leaves its opening and closing to the caller."""
    from starlette.routing import Route

    from awa_sql.metrics import make_asgi_app

    app = create_app(settings, pool)
    app.router.routes.append(
        Route("/metrics", make_asgi_app(settings.dsn), methods=["GET", "HEAD"]))
    return app


def serve(dsn: str | None, host: str, port: int, writable: bool,
          allowed: Sequence[str] | None = None,
          start_wait: float = Settings.start_wait) -> int:
    import uvicorn

    check, warning = for_server("awa admin serve", ALLOWED_HOSTS_ENV, host, allowed)
    settings = settings_from(dsn, writable, check, start_wait)
    mode = "writable" if writable else "read-only"
    # Bound before the line is printed, so that the line names the port that
    # answers (with --port 0, the one the system picked). Bound here, not by
    # uvicorn, which logs a taken port without naming it and exits.
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    # The database before the line too: a server that cannot reach it says
    # so in one line (the pool's own lines above it say why) and exits 7.
    try:
        pool = make_pool(settings, open_now=True)  # closed again if it times out
    except PoolTimeout:
        sock.close()
        print(f"awa: cannot connect to the database in {start_wait:g} s (--start-wait)",
              file=sys.stderr, flush=True)
        return EXIT_ERROR
    app = create_served_app(settings, pool)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    print(f"awa admin ({mode}) on {url(host, bound)} (metrics at /metrics)", flush=True)
    # After the line above: scripts (and the tests) read the URL from the first line.
    if warning:
        print(warning, file=sys.stderr, flush=True)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        # uvicorn's own exit (3) when the app's start fails. 3 means drift to
        # every awa command.
        if server.started:
            raise
    finally:
        pool.close()
    return 0 if server.started else EXIT_ERROR
