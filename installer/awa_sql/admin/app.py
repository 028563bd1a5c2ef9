"""The ASGI app: FastAPI, a psycopg_pool connection pool, JSON errors."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool
from starlette.exceptions import HTTPException

from awa_sql import sites
from awa_sql.admin import pages, routes
from awa_sql.admin.errors import ApiError, from_database
from awa_sql.connect import network_defaults, read_far_dates
from awa_sql.hosts import HostCheck
from awa_sql.jsonb import decode_apart
from awa_sql.version import __version__

log = logging.getLogger("awa_sql.admin")

# The bearer token of a writable server: anyone who guesses it may change S
# and retry or cancel jobs, so a short one is refused.
MIN_TOKEN_LENGTH = 16


def token_problem(token: str) -> str | None:
    """Why no HTTP client could send ``token`` in its Authorization header,
    or None: a header's value is ASCII (a non-ASCII character never
    compares equal) without control characters, and its leading and
    trailing whitespace is not part of it (a token read from a file keeps
    its newline). The token's characters are not repeated: it is a secret."""
    if token != token.strip(" \t\r\n\v\f"):
        where, char = ("ends", token[-1]) if token[-1:].isspace() else ("starts", token[0])
        return (f"AWA_ADMIN_TOKEN {where} with whitespace ({char!r}): HTTP drops a header "
                "value's leading and trailing whitespace, so no request could present this "
                "token; set it without (a token read from a file keeps the file's newline)")
    for position, char in enumerate(token, 1):
        if not " " <= char <= "~":
            what = (f"a control character ({repr(char)[1:-1]})" if char.isascii()
                    else f"a non-ASCII character (U+{ord(char):04X})")
            return (f"AWA_ADMIN_TOKEN holds {what} at character {position}: an HTTP header "
                    "carries printable ASCII only, so no request could present this token; "
                    "use letters, digits and punctuation (openssl rand -hex 32)")
    return None


@dataclass(frozen=True)
class Settings:
    dsn: str
    writable: bool = False
    token: str | None = None
    pool_size: int = 4
    # The Host names answered (awa_sql.hosts); None answers any, as in the
    # tests' TestClient. `awa admin serve` and `awa demo` always set one.
    hosts: HostCheck | None = None
    # How long the server waits at start for its database (a restart, a
    # database started after it) before it gives up: exit 7.
    start_wait: float = 30.0


class RefuseOtherHosts:
    """ASGI middleware: a request whose Host header is not one ``check``
    allows is answered 400, in the API's error shape, before any route (the
    page, the API, /metrics) or the database sees it."""

    def __init__(self, app, check: HostCheck) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":  # no websocket route: the router closes any
            # The first Host header, as uvicorn and Starlette read it.
            header = next((value.decode("latin-1") for name, value in scope["headers"]
                           if name == b"host"), None)
            if not self.check.allows(header):
                refused = ApiError(400, self.check.refusal(header))
                response = JSONResponse(refused.body(), status_code=refused.status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RefuseCrossSite:
    """ASGI middleware: a request for the API or /metrics that another page in
    the browser made (``Sec-Fetch-Site`` other than same-origin or none, else
    an ``Origin`` not the server's own; awa_sql.sites) is answered 403, in the
    API's error shape, before any route or the database sees it: an <img> on
    any page could otherwise make the database run a drop plan or a page of
    1000 jobs on every load."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and sites.guarded(scope["path"]):
            headers = {}
            for name, value in scope["headers"]:  # the first of each, as Host is read
                if name in (b"sec-fetch-site", b"origin", b"host"):
                    headers.setdefault(name, value.decode("latin-1"))
            why = sites.refusal(headers.get(b"sec-fetch-site"), headers.get(b"origin"),
                                headers.get(b"host"))
            if why is not None:
                refused = ApiError(403, why)
                response = JSONResponse(refused.body(), status_code=refused.status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# The largest request body read. A write's body is a few bytes
# ({"shards": 4}); FastAPI reads and parses a body before any dependency,
# the write guard included, so without a limit anyone who reaches the server
# has it hold hundreds of megabytes.
MAX_BODY_BYTES = 65_536


TOO_LARGE = (f"the request body is over {MAX_BODY_BYTES} bytes; no write here takes "
             "more than a few")


class BodyTooLarge(HTTPException):
    """Raised while a body is read: an HTTPException, which FastAPI's body
    reading passes on (any other error there becomes its own 400)."""

    def __init__(self) -> None:
        super().__init__(413, TOO_LARGE)


class HeadAsGet:
    """ASGI middleware: HEAD is answered as GET is, status and headers
    alike, without the body. Uptime checks and proxies probe with HEAD, and
    a FastAPI route answers only the methods it names."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message):
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class LimitBody:
    """ASGI middleware: a request body over MAX_BODY_BYTES is answered 413, by
    its Content-Length before any of it is read, else once the bytes received
    pass the limit (a chunked body); the app never sees more."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((value for name, value in scope["headers"]
                         if name == b"content-length"), b"")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    raise BodyTooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    @staticmethod
    async def _refuse(scope, receive, send) -> None:
        await _too_large()(scope, receive, send)


def _too_large() -> JSONResponse:
    # Connection: close: the rest of the body is never read.
    return JSONResponse(ApiError(413, TOO_LARGE).body(), status_code=413,
                        headers={"Connection": "close"})


def _configure(read_only: bool):
    def configure(conn: psycopg.Connection) -> None:
        # No session state (a transaction pooler may serve every transaction
        # from another server connection): read-only is BEGIN READ ONLY on
        # each transaction, so a read-only server cannot write even through a
        # bug in a route.
        if read_only:  # never BEGIN READ WRITE: that fails on a standby
            conn.read_only = True
        # BEGIN ISOLATION LEVEL READ COMMITTED whatever the login's default:
        # the job tools read what a maintenance rewrite left, and a bulk
        # call takes what workers left, only there.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        # Never prepared: each statement is planned for its values. A page
        # refreshed every few seconds would otherwise run its statements
        # prepared, and PostgreSQL's plan for any queue reads a rarely
        # changed queue's latest shard change (or decision) from the newest
        # row of the primary key down, through every other queue's since.
        conn.prepare_threshold = None
        read_far_dates(conn)
        decode_apart(conn)  # a job's args the JSON decoder refuses: a marker, not a 500
    return configure


def _field_names(errors: list[dict]) -> list[str]:
    names = []
    for e in errors:
        if e.get("type") == "json_invalid":  # its loc holds a byte offset, not a field
            names.append("body")
            continue
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
        names.append(".".join(loc) or "body")
    return names


def _got(error: dict) -> str:
    """``, got -1``: the value a path or query parameter was refused for (a
    body's field names itself through ``fields``, and may be large)."""
    loc = error.get("loc") or ()
    value = error.get("input")
    if not loc or loc[0] not in ("path", "query") or not isinstance(value, str):
        return ""
    return f", got {value}" if re.fullmatch(r"-?\d{1,40}", value) else f", got {value[:80]!r}"


def make_pool(settings: Settings, open_now: bool = False) -> ConnectionPool:
    pool = ConnectionPool(
        settings.dsn, min_size=1, max_size=settings.pool_size, open=False,
        # Each request's work is one transaction, committed when the pool
        # takes the connection back (rolled back on an error).
        kwargs={"autocommit": False, "fallback_application_name": "awa-admin",
                **network_defaults(settings.dsn)},
        configure=_configure(not settings.writable),
        # A connection the server closed while it sat in the pool (a restart,
        # a proxy's idle timeout) is replaced before a request gets it: an
        # empty query's round trip, instead of a 500 for that request.
        check=ConnectionPool.check_connection,
    )
    if open_now:
        pool.open(wait=True, timeout=settings.start_wait)
    return pool


def create_app(settings: Settings, pool: ConnectionPool | None = None) -> FastAPI:
    """The app; it opens and closes its own pool unless given one (tests share one)."""
    if settings.writable and not settings.token:
        raise ValueError("a writable admin server needs a token: set AWA_ADMIN_TOKEN")
    if settings.writable and len(settings.token) < MIN_TOKEN_LENGTH:
        length = len(settings.token)
        raise ValueError(
            f"AWA_ADMIN_TOKEN is {length} character{'' if length == 1 else 's'} long; a writable "
            f"admin server needs at least {MIN_TOKEN_LENGTH}: set it to a long random string "
            "(openssl rand -hex 32)")
    if settings.writable and (problem := token_problem(settings.token)):
        raise ValueError(problem)
    owns_pool = pool is None
    if pool is None:
        pool = make_pool(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> Iterator[None]:
        if owns_pool:
            pool.open(wait=True, timeout=settings.start_wait)
        try:
            yield
        finally:
            if owns_pool:
                pool.close()

    # No /docs or /redoc: they load their scripts from a CDN.
    app = FastAPI(title="awa-sql admin", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  description="Queues, enqueue shards and the auto-scaler of one awa database.")
    app.state.settings = settings
    app.state.pool = pool

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(BodyTooLarge)
    async def too_large(_request: Request, _err: BodyTooLarge) -> JSONResponse:
        return _too_large()

    @app.exception_handler(HTTPException)
    async def routing_error(request: Request, err: HTTPException) -> JSONResponse:
        # Routing's own errors (no route, a method the route lacks), in the
        # shape of every other error rather than FastAPI's {"detail": ...}.
        where = f"{request.method} {request.url.path}"
        message = {404: f"no such route: {where}",
                   405: f"method {request.method} not allowed on {request.url.path}"
                   }.get(err.status_code, str(err.detail))
        return JSONResponse({"error": message}, status_code=err.status_code,
                            headers=err.headers)

    @app.exception_handler(psycopg.Error)
    async def database_error(request: Request, err: psycopg.Error) -> JSONResponse:
        # HEAD is GET by now (HeadAsGet): a read.
        mapped = from_database(err, write=request.method != "GET")
        if mapped is None:
            # The whole error (DETAIL, CONTEXT: the statements of the awa
            # function it failed in) goes to the log; the answer, to whoever
            # asked, has the SQLSTATE and the message only.
            log.error("database error: %s", err)
            message = err.diag.message_primary or (str(err).strip().splitlines() or [""])[0]
            mapped = ApiError(500, f"database error {err.sqlstate}: {message}"
                              if err.sqlstate else f"database error: {message}", err.sqlstate)
        return JSONResponse(mapped.body(), status_code=mapped.status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        names = _field_names(errors)
        message = "; ".join(f"{n}: {e.get('msg', 'invalid')}{_got(e)}"
                            for n, e in zip(names, errors, strict=True))
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
                   "type": e.get("type", "")} for e in errors]
        return JSONResponse({"error": message, "fields": names, "detail": detail},
                            status_code=422)

    app.include_router(routes.router)
    pages.install(app)
    app.add_middleware(HeadAsGet)
    app.add_middleware(LimitBody)
    app.add_middleware(RefuseCrossSite)  # after the Host check, before the body is read
    if settings.hosts is not None and not settings.hosts.any_host:
        app.add_middleware(RefuseOtherHosts, check=settings.hosts)
    return app
