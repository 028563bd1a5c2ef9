"""The database exporter as a WSGI app, an ASGI app and a small HTTP server.

Each answers GET (and HEAD) at whatever path it is mounted on with one
scrape of the awa views.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import make_wsgi_app as _prometheus_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from awa_sql import sites
from awa_sql.connect import connect as _connect
from awa_sql.connect import network_defaults, resolve_dsn
from awa_sql.hosts import HostCheck, url
from awa_sql.listen import CannotListen
from awa_sql.metrics.database import DatabaseCollector

# Seconds a scrape waits to connect, unless the DSN or PGCONNECT_TIMEOUT says
# otherwise: libpq's default is to wait for ever, and a host that accepts
# and never answers (a hung server, a pooler or proxy whose backend is gone)
# would hold the scrape, and every one queued behind it, with no awa_up at
# all. Under Prometheus's default scrape timeout (10 s), so the scrape
# answers awa_up 0 in time.
CONNECT_TIMEOUT = 5


def _opener(dsn: str | None) -> Callable[[], psycopg.Connection]:
    def open_connection() -> psycopg.Connection:
        return _connect(dsn, autocommit=True, application_name="awa-sql metrics",
                        **network_defaults(resolve_dsn(dsn), CONNECT_TIMEOUT))
    return open_connection


def database_registry(dsn: str | None = None,
                      connect: Callable[[], psycopg.Connection] | None = None
                      ) -> CollectorRegistry:
    """A registry holding only the database collector (``dsn`` as ``awa --dsn``:
    default AWA_DATABASE_URL, DATABASE_URL, then the PG* environment)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(connect or _opener(dsn)))
    return registry


def make_wsgi_app(dsn: str | None = None,
                  connect: Callable[[], psycopg.Connection] | None = None):
    """A WSGI app serving the database metrics."""
    registry = database_registry(dsn, connect)

    def app(environ, start_response):
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b"use GET\n"]
        body = generate_latest(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                  ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


class _AsgiExporter:
    """The ASGI app of ``make_asgi_app``. An instance, not a function, so a
    Starlette ``Route`` hands it the raw ASGI call as a mount would."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            status, headers, body = 405, [(b"allow", b"GET, HEAD")], b"use GET\n"
        else:
            body = await asyncio.to_thread(generate_latest, self.registry)
            status, headers = 200, [(b"content-type", CONTENT_TYPE_LATEST.encode())]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


def make_asgi_app(dsn: str | None = None,
                  connect: Callable[[], psycopg.Connection] | None = None) -> _AsgiExporter:
    """An ASGI app serving the database metrics; the scrape runs in a worker
    thread, so it never blocks the event loop."""
    return _AsgiExporter(database_registry(dsn, connect))


def refuse_other_hosts(app, check: HostCheck):
    """A WSGI app that answers 400, in plain text, a request whose Host
    header ``check`` does not allow, and passes the others to ``app``."""
    if check.any_host:
        return app

    def checked(environ, start_response):
        header = environ.get("HTTP_HOST")
        if check.allows(header):
            return app(environ, start_response)
        body = f"{check.refusal(header)}\n".encode()
        start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8"),
                                           ("Content-Length", str(len(body)))])
        return [body]

    return checked


def refuse_cross_site(app):
    """A WSGI app that answers 403, in plain text, a request another page in
    the browser made (awa_sql.sites: an <img> on any page would otherwise
    make the database run a scrape on every load), and passes the others,
    Prometheus's scrapes among them, to ``app``."""

    def checked(environ, start_response):
        why = sites.refusal(environ.get("HTTP_SEC_FETCH_SITE"), environ.get("HTTP_ORIGIN"),
                            environ.get("HTTP_HOST"))
        if why is None:
            return app(environ, start_response)
        body = f"{why}\n".encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    return checked


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *_args) -> None:
        """No line per request."""


def start_server(host: str, port: int, app, hosts: HostCheck | None = None
                 ) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """prometheus_client's ``start_http_server``, serving the WSGI ``app`` to
    the Host names ``hosts`` allows (default any): a thread per request, the
    address family of ``host``, ``CannotListen`` when the address cannot be
    bound. ``awa metrics serve`` and ``awa maintain`` serve through it."""
    if hosts is not None:
        app = refuse_other_hosts(app, hosts)
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

        class Server(ThreadingWSGIServer):
            address_family = family

        server = make_server(address[0], port, app, Server, handler_class=_QuietHandler)
    except OSError as error:
        raise CannotListen(host, port, error) from None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def serve(dsn: str | None, host: str, port: int,
          stop: threading.Event, ready: Callable[[str], None] = lambda _url: None,
          hosts: HostCheck | None = None) -> None:
    """Serve ``/metrics`` on host:port until ``stop`` is set, to the Host
    names ``hosts`` allows (default any) and no other page in a browser
    (``refuse_cross_site``); ``CannotListen`` when the address cannot be
    bound."""
    app = refuse_cross_site(_prometheus_wsgi_app(database_registry(dsn)))
    server, thread = start_server(host, port, app, hosts)
    try:
        ready(url(host, server.server_port, "/metrics"))
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
