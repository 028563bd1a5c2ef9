"""The ``awa`` command line.

One module per command in this package, each with ``register(sub)``: it
adds the command's parser (and its subcommands) and sets ``func`` on each.
``main`` runs the chosen ``func`` and turns errors into the exit codes of
``awa_sql.migrate`` (docs/migrations.md lists them); a closed stdout
(``awa storage show | head``) ends it quietly with 141.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Sequence

import psycopg

from awa_sql import migrate as runner
from awa_sql.cli import admin, demo, jobs, maintain, metrics, migrate, runtimes, storage
from awa_sql.cli.common import err, sqlstate_suffix
from awa_sql.connect import (
    connect,
    network_defaults,
    read_only_error,
    read_only_reason,
    resolve_dsn,
)
from awa_sql.demo.embedded import EmbeddedError
from awa_sql.listen import CannotListen
from awa_sql.version import __version__

COMMANDS = (migrate, storage, jobs, runtimes, maintain, metrics, demo, admin)
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what the shell reports for a program SIGPIPE ends


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that any argument starting with a minus and a
    digit is a value (``--promote-every -1s``, ``--shards -1``), so that it
    reaches the option's own check and its message naming the range; argparse
    takes only plain negative numbers so, and called ``-1s`` an option
    ("expected one argument"). No option of awa's starts with a digit.
    Subparsers are made of the same class."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="awa", description="awa-sql: a PostgreSQL job-queue storage contract."
    )
    parser.add_argument("--version", action="version", version=f"awa-sql {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _run(build_parser().parse_args(argv))
        finally:  # here, not at exit, where a closed pipe would print a traceback
            sys.stdout.flush()
    except BrokenPipeError:
        # Whoever read stdout has gone (`awa storage show | head`): stop
        # quietly, as a program that SIGPIPE ends does. The interpreter
        # flushes stdout again at exit: into /dev/null now.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_STDOUT_CLOSED
    except KeyboardInterrupt:
        # Ctrl-C in a wait (a lock, a server's start, a slow query): no
        # traceback. Ended by the signal itself, as Python ends on one it
        # does not catch, so that a shell script stops too (a loop of awa
        # commands goes on after an exit of 130). What was done stays done;
        # an open transaction ends with its connection.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return runner.EXIT_INTERRUPTED  # where the signal cannot end it


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except runner.MigrationError as error:
        err(str(error))
        return error.exit_code
    except (EmbeddedError, CannotListen) as error:
        err(str(error))
        return runner.EXIT_ERROR
    except ValueError as error:
        err(str(error))
        return runner.EXIT_USAGE
    except psycopg.errors.LockNotAvailable as error:
        err(f"lock timeout: {str(error).strip()}")
        return runner.EXIT_LOCK_TIMEOUT
    except psycopg.OperationalError as error:
        if error.sqlstate:  # the server answered: not a connection problem
            err(f"{type(error).__name__}{sqlstate_suffix(error)}: {str(error).strip()}")
            return runner.EXIT_ERROR
        err(f"cannot connect: {str(error).strip()}")
        return runner.EXIT_ERROR
    except psycopg.errors.ReadOnlySqlTransaction as error:
        err(f"{read_only_error(_read_only_reason(args), 'this command')} [{error.sqlstate}]")
        return runner.EXIT_ERROR
    except psycopg.Error as error:
        err(f"{type(error).__name__}{sqlstate_suffix(error)}: {str(error).strip()}")
        needs = getattr(args, "needs", None)
        if error.sqlstate == "42501" and needs:
            # Say which role the login lacks, as awa maintain does.
            err(f"this command needs a login that holds {needs} (other names where awa was "
                "installed with --role-prefix)")
        return runner.EXIT_ERROR


def _read_only_reason(args: argparse.Namespace) -> str:
    """Why the command's server refused its write (25006), asked on a
    connection of its own: the command's is gone by now."""
    dsn = resolve_dsn(getattr(args, "dsn", None))
    try:
        with connect(dsn, autocommit=True, prepared_statements="off",
                     **network_defaults(dsn)) as conn:
            reason = read_only_reason(conn)
    except psycopg.Error:
        reason = None
    return reason or "the server is read-only (a hot standby, or default_transaction_read_only)"


if __name__ == "__main__":
    raise SystemExit(main())
