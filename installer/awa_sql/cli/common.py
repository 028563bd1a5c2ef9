"""What several commands share: the connection and role-name options, errors."""

from __future__ import annotations

import argparse
import sys

from awa_sql.roles import CAPABILITIES, Roles


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
