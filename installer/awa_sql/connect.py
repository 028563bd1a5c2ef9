"""Where a command finds its database, and how its connections behave behind a pooler.

psycopg 3 turns a query into a named server-side prepared statement after
five executions on one connection. Behind PgBouncer in transaction mode
before 1.21 (or with ``max_prepared_statements = 0``) the next execution may
land on another server connection: "prepared statement _pg3_0 does not
exist". So awa's own connections decide per connection (see
docs/deployment.md):

- ``AWA_PREPARED_STATEMENTS=auto`` (the default): no prepared statements when
  a pooler sits in between, psycopg's default otherwise;
- ``on``: psycopg's default; ``off``: never prepare.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

PREPARED_ENV = "AWA_PREPARED_STATEMENTS"
PREPARED_MODES = ("auto", "on", "off")

PreparedSetting = str | bool | None


def resolve_dsn(dsn: str | None = None) -> str:
    """``--dsn``, else ``AWA_DATABASE_URL``, else ``DATABASE_URL``, else libpq's
    own environment (PGHOST, PGDATABASE, ...), which an empty string selects."""
    return dsn or os.environ.get("AWA_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""


# libpq's own quotes in its messages on a malformed DSN, kept as whole
# phrases; any other quote is the DSN's text, which goes from the first such
# quote to the last (the text may itself hold a quote, or look like one of
# these: `="s3cret%zz` is quoted as "="s3cret%zz").
_LIBPQ_PHRASES = ('missing "=" after', 'matching "]"', 'expected ":" or "/"')


def _without_dsn_text(message: str) -> str:
    kept = {}
    for i, phrase in enumerate(_LIBPQ_PHRASES):
        if phrase in message:
            kept[f"\0{i}\0"] = phrase
            message = message.replace(phrase, f"\0{i}\0")
    first, last = message.find('"'), message.rfind('"')
    if first != -1:
        message = message[:first] + '"…"' + (message[last + 1:] if last > first else "")
    for mark, phrase in kept.items():
        message = message.replace(mark, phrase)
    return message


def parse_dsn(dsn: str) -> dict[str, Any]:
    """``dsn``'s parameters (``psycopg.conninfo.conninfo_to_dict``). A
    malformed one raises ``psycopg.ProgrammingError`` without its text:
    libpq quotes the part it could not read (``invalid percent-encoded
    token: "s3cret%zz"``), which may be the password, and a worker would log
    it at every back-off."""
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as err:
        said = _without_dsn_text(str(err).strip())
        raise psycopg.ProgrammingError(
            f"{said} (the DSN's text is left out, as it may hold a password)") from None


def prepared_mode(setting: PreparedSetting = None) -> str:
    """``True``/``False``/``"auto"``/``"on"``/``"off"``; None reads AWA_PREPARED_STATEMENTS."""
    if setting is True:
        return "on"
    if setting is False:
        return "off"
    source = "prepared_statements"
    if setting is None:
        setting, source = os.environ.get(PREPARED_ENV) or "auto", PREPARED_ENV
    mode = str(setting).strip().lower()
    if mode not in PREPARED_MODES:
        raise ValueError(
            f"{source} must be one of {', '.join(PREPARED_MODES)} (or True/False), "
            f"got {setting!r}")
    return mode


def behind_pooler(conn: psycopg.Connection) -> bool:
    """True when something between client and server multiplexes connections.

    A pooler (PgBouncer in any mode, and the others) cannot hand a client the
    cancel key of one server connection, so the backend pid libpq got at login
    is not the pid of the server process that answers.
    """
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    pid = conn.execute("select pg_catalog.pg_backend_pid()").fetchone()[0]
    if idle and not conn.autocommit:
        conn.rollback()  # leave no transaction open that the caller did not start
    return conn.info.backend_pid != pid


def configure(conn: psycopg.Connection, prepared_statements: PreparedSetting = None
              ) -> psycopg.Connection:
    """Apply the prepared-statement setting to a connection opened elsewhere."""
    mode = prepared_mode(prepared_statements)
    if mode == "off" or (mode == "auto" and behind_pooler(conn)):
        conn.prepare_threshold = None
    return conn


# For a process that connects again by itself (awa maintain, the worker): a
# host that drops packets would otherwise hang a reconnect for minutes.
RECONNECT_TIMEOUT = 10  # seconds, unless the DSN or PGCONNECT_TIMEOUT says otherwise

# A connection to a host that vanished without a word (a failover that moved
# the address, a crashed host, a NAT or firewall that forgot the flow) waits
# for a reply the kernel's keepalive default (two hours on Linux) and its
# retransmissions (about 15 minutes) before it fails: so long, a worker
# claims nothing and a publisher is stale. With these, such a connection
# fails within about a minute and the process connects again. They touch
# only TCP connections; each one the DSN sets is left to the DSN, and a DSN
# that names a service (or PGSERVICE) gets none: the service file's entry
# may set them, and these would override it.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,  # seconds idle before the first probe
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,  # ms a sent byte may stay unacknowledged
}


def network_defaults(dsn: str, connect_seconds: int | None = None) -> dict[str, int]:
    """The connection parameters of a process that connects again by itself:
    ``connect_timeout`` (``connect_seconds``, default RECONNECT_TIMEOUT) unless
    ``dsn`` or PGCONNECT_TIMEOUT sets one, and KEEPALIVES but those ``dsn`` sets;
    none when ``dsn`` names a service or PGSERVICE is set."""
    given = parse_dsn(dsn)
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}
    params = {key: value for key, value in KEEPALIVES.items() if key not in given}
    if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
        params["connect_timeout"] = (RECONNECT_TIMEOUT if connect_seconds is None
                                     else connect_seconds)
    return params


def connect(dsn: str | None = None, *, prepared_statements: PreparedSetting = None,
            application_name: str = "awa-sql", **kwargs) -> psycopg.Connection:
    """A connection of awa's. ``application_name`` is awa's name for it, sent
    as libpq's ``fallback_application_name``: one the user set (in the DSN, a
    service file, PGAPPNAME) is the one the server shows."""
    kwargs.setdefault("fallback_application_name", application_name)
    mode = prepared_mode(prepared_statements)  # a bad setting fails before connecting
    dsn = resolve_dsn(dsn)
    parse_dsn(dsn)  # a malformed DSN fails without its text
    conn = psycopg.connect(dsn, **kwargs)
    try:
        return configure(conn, mode)
    except BaseException:
        conn.close()
        raise


# A server that takes no writes answers every write with SQLSTATE 25006: a
# hot standby (what a dashboard's DSN names, and after a failover sometimes
# a worker's), or a login whose default_transaction_read_only is on.
READ_ONLY_SQL = ("select pg_catalog.pg_is_in_recovery(),"
                 " pg_catalog.current_setting('transaction_read_only')::boolean")
TO_THE_PRIMARY = ("point the DSN at the primary (given several hosts, "
                  "target_session_attrs=read-write picks it)")


def read_only_reason(conn: psycopg.Connection) -> str | None:
    """None when ``conn``'s server takes writes; else why not, naming it."""
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    standby, read_only = conn.execute(READ_ONLY_SQL).fetchone()
    if idle and not conn.autocommit:
        conn.rollback()  # leave no transaction open that the caller did not start
    where = f"{conn.info.host}:{conn.info.port}"
    if standby:
        return f"the server at {where} is a hot standby (in recovery)"
    if read_only:
        return f"the server at {where} is read-only for this login (default_transaction_read_only)"
    return None


def one_line(err: BaseException) -> str:
    """An error's text on one line, for a log line or a terminal (its class
    name when it has no text)."""
    return " ".join(str(err).split()) or type(err).__name__


def read_only_error(reason: str, who: str) -> str:
    """What an operator is told when ``who`` (something that writes) meets a
    server that takes no writes."""
    return f"{reason}: {who} writes, and only the primary takes writes; {TO_THE_PRIMARY}"


class _FarTimestamptzLoader(TimestamptzLoader):
    """A timestamptz Python cannot hold (infinity, a year past 9999 or BC)
    as datetime.max or datetime.min in UTC, where psycopg raises DataError."""

    def load(self, data) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            early = text.startswith(b"-") or text.endswith(b" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


class _FarTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    def load(self, data) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            early = bytes(data)[0] & 0x80  # microseconds since 2000, negative
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


def read_far_dates(conn: psycopg.Connection) -> psycopg.Connection:
    """Makes ``conn`` read a time outside Python's years as datetime.max or
    datetime.min (UTC): for the job tools, so that one job due at infinity
    (taken before enqueues refused such times, ADR 043) does not fail the
    listing of its whole queue."""
    conn.adapters.register_loader("timestamptz", _FarTimestamptzLoader)
    conn.adapters.register_loader("timestamptz", _FarTimestamptzBinaryLoader)
    return conn
