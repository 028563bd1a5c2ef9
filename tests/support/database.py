"""One test database and the ways a test reaches it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass

import psycopg
from psycopg import sql

from tests.support.cluster import LOGIN_PASSWORD, Cluster


@dataclass
class Database:
    cluster: Cluster
    name: str

    def dsn(self, user: str | None = None) -> str:
        return self.cluster.dsn(self.name, user)

    def connect(self, user: str | None = None, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(self.dsn(user), autocommit=autocommit)

    def awa(self, *args: str, user: str | None = None, check: bool = False,
            timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real CLI against this database."""
        full_env = {**os.environ, "AWA_DATABASE_URL": self.dsn(user), **(env or {})}
        full_env.pop("DATABASE_URL", None)
        result = subprocess.run(
            [sys.executable, "-m", "awa_sql", *args], env=full_env, capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"awa {' '.join(args)} exited {result.returncode}\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def login_role(self, *grants: str, prefix: str = "awa_t_", extra: str = "") -> str:
        """A new login role holding the given roles."""
        with self.cluster.admin() as conn:
            return _create_login(conn, grants, prefix, extra)

    def login_roles(self, *roles: str, by: str | None = None) -> list[str]:
        """A new login for each of ``roles``, holding that role: ``login_role``
        for each, over one connection; made and granted by login ``by`` (one
        with CREATEROLE, as an installer has) rather than the superuser."""
        with (psycopg.connect(self.cluster.dsn(user=by), autocommit=True) if by
              else self.cluster.admin()) as conn:
            return [_create_login(conn, [role]) for role in roles]


def _create_login(conn: psycopg.Connection, grants, prefix: str = "awa_t_",
                  extra: str = "") -> str:
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("create role {} login password {} " + extra).format(
        sql.Identifier(name), sql.Literal(LOGIN_PASSWORD)))
    for g in grants:
        conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(g), sql.Identifier(name)))
    return name
