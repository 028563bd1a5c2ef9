"""What several commands share: the connection and role-name options, the
parsers of intervals and ports, errors."""

from __future__ import annotations

import argparse
import functools
import sys
import unicodedata
from collections.abc import Callable
from datetime import datetime

import psycopg

from awa_sql import hosts
from awa_sql.defaults import EVERY_MAX, EVERY_MIN
from awa_sql.migrate import EXIT_USAGE
from awa_sql.roles import CAPABILITIES, Roles

# A command refused by the state of what it names (a retry of a ready job, a
# drop of a queue that is not empty): nothing changed. awa jobs and awa storage.
EXIT_WRONG_STATE = 9


# Characters a terminal acts on or a reader cannot see: controls (C0, DEL,
# C1), format characters (bidi overrides, zero-width ones), the line and
# paragraph separators, lone surrogates.
_UNSHOWN = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
# Format characters that join what is around them into what a reader sees
# (emoji sequences, Persian and Indic words, subdivision flags) and move no
# cursor: left as they are.
_JOINERS = frozenset(("\u200c", "\u200d", *map(chr, range(0xE0020, 0xE0080))))


def printable(text: str, keep: str = "") -> str:
    r"""Text for a terminal: each control or format character (an escape
    sequence, a newline, a right-to-left override) written as its Python
    escape (``\x1b``, ``\n``, ``\u202e``), so that a name a producer or a
    worker chose can neither drive the terminal nor forge a line of a table.
    ``keep``: characters left as they are (the newlines of an error's text).
    Output for scripts (--json) stays exact."""
    if text.isprintable():
        return text
    # repr escapes each character of _UNSHOWN: none is printable to Python.
    return "".join(c if c in keep or c in _JOINERS or unicodedata.category(c) not in _UNSHOWN
                   else repr(c)[1:-1]
                   for c in text)


def add_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="libpq connection string or URL; default AWA_DATABASE_URL, then DATABASE_URL, "
        "then the PG* environment",
    )


def add_roles(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("role names")
    g.add_argument("--role-prefix", default="awa_",
                   help="prefix of the six role names (default awa_: awa_owner, awa_producer, ...)")
    for cap in CAPABILITIES:
        g.add_argument(f"--{cap}-role", metavar="NAME", help=f"name of the {cap} role")


def roles_from(args: argparse.Namespace) -> Roles:
    return Roles.with_prefix(
        args.role_prefix, **{cap: getattr(args, f"{cap}_role") for cap in CAPABILITIES}
    )


def err(message: str) -> None:
    print(f"awa: {message}", file=sys.stderr)


def sqlstate_suffix(error: psycopg.Error) -> str:
    """`` [22023]``, or nothing for an error raised before the server answered
    (psycopg's own, such as a timestamp past year 9999): it has no SQLSTATE."""
    return f" [{error.sqlstate}]" if error.sqlstate else ""


def fmt_age(seconds: float | None) -> str:
    """An age for a table, to the tenth of a second under a minute, else in its
    two largest units: 12.3s, 5m3s, 2h0m, 3d4h; "-" for none."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                              ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit}{whole % size // smaller_size}{smaller}"
    raise AssertionError(seconds)


def json_default(value: object) -> str:
    """``json.dumps``'s ``default`` for the rows commands print: times in ISO 8601."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def bad_input_is_usage(command: Callable[[argparse.Namespace], int]
                       ) -> Callable[[argparse.Namespace], int]:
    """A value the database refuses (SQLSTATE class 22: a bad name, a value
    out of range) or an unknown queue (42704) is a bad argument: exit 2 with
    the database's message alone (no PL/pgSQL context)."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except psycopg.Error as error:
            if error.sqlstate and (error.sqlstate.startswith("22") or error.sqlstate == "42704"):
                err(f"{error.diag.message_primary or str(error).strip()}"
                    f"{sqlstate_suffix(error)}")
                return EXIT_USAGE
            raise
    return run


def add_allowed_hosts(p: argparse.ArgumentParser, variable: str,
                      host_flag: str = "--host") -> None:
    """``--allowed-host``, repeatable: the Host names a server answers to
    besides its loopback names and bound address (``host_flag``; awa_sql.hosts)."""
    p.add_argument(
        "--allowed-host", action="append", type=parse_allowed_host, metavar="NAME",
        dest="allowed_hosts",
        help="a Host name (or address) this server answers to besides localhost, 127.0.0.1, "
        f"[::1] and the {host_flag} address; repeatable; *.example.com for its subdomains, * for "
        f"any name. Default: the comma-separated {variable}. Other names get 400 (the check "
        "against DNS rebinding); bound to 0.0.0.0 or :: with none given, any name is answered")


def parse_allowed_host(text: str) -> str:
    try:
        return hosts.parse_allowed_host(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_interval(text: str) -> float:
    """Seconds from 5s, 500ms, 2m, 1h or a plain number of seconds, 50ms..1h."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    value = text.strip()
    factor = 1.0
    for suffix in ("ms", "s", "m", "h"):
        if value.endswith(suffix):
            value, factor = value[: -len(suffix)], units[suffix]
            break
    try:
        seconds = float(value) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"interval must look like 5s, 500ms, 1m or 1h, got {text!r}") from None
    if not EVERY_MIN <= seconds <= EVERY_MAX:
        raise argparse.ArgumentTypeError(
            f"interval must be between 50ms and 1h, got {text!r}")
    return seconds


def parse_port(text: str, lowest: int = 0) -> int:
    """A TCP port, 0..65535 (0: the system picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a number, got {text!r}") from None
    if not lowest <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between {lowest} and 65535, got {port}")
    return port


def parse_fixed_port(text: str) -> int:
    """A TCP port others are told in advance, 1..65535."""
    return parse_port(text, lowest=1)
