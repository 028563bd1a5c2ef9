"""``awa demo``: a local PostgreSQL 18 with awa installed, in one command.

The server lives under ``.awa/`` (data, log and a small state file), listens
on 127.0.0.1 only with trust authentication, and keeps running after the
command returns; ``awa demo --stop`` stops it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import psycopg
from psycopg import sql

from awa_sql import embedded, migrate
from awa_sql.roles import Roles

DEMO_DATABASE = "awa_demo"
DEMO_MAJOR = 18
DEFAULT_PORT = 54318


def _reachable(path: Path, uid: int) -> bool:
    """Can ``uid`` traverse every folder above ``path``?"""
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid == uid:
            continue
        if not st.st_mode & stat.S_IXOTH:
            return False
    return True


def data_root(folder: Path) -> Path:
    """The server's folder: ``folder`` itself unless the server's OS user
    cannot reach it (root running from a private folder)."""
    user = embedded.server_os_user()
    if user is None or _reachable(folder.resolve(), user.pw_uid):
        return folder.resolve()
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:10]
    return Path("/var/lib/awa-sql") / f"demo-{key}"


def _server(folder: Path, port: int) -> embedded.LocalServer:
    bindir = embedded.ensure_binaries(DEMO_MAJOR)
    return embedded.LocalServer(bindir, data_root(folder) / "pgdata", port=port)


def _state_file(folder: Path) -> Path:
    return folder / "demo.json"


def start(folder: Path, port: int | None = None, log=print) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    state_file = _state_file(folder)
    saved = json.loads(state_file.read_text()) if state_file.exists() else {}
    port = port or saved.get("port") or DEFAULT_PORT
    server = _server(folder, port)
    if server.running():
        log(f"PostgreSQL {DEMO_MAJOR} already running in {server.data_dir}")
    else:
        log(f"starting PostgreSQL {DEMO_MAJOR} in {server.data_dir} on 127.0.0.1:{port}")
        server.start()
    state_file.write_text(json.dumps({"port": port, "data_dir": str(server.data_dir)}))
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        exists = conn.execute(
            "select 1 from pg_database where datname = %s", [DEMO_DATABASE]).fetchone()
        if not exists:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(DEMO_DATABASE)))
    dsn = server.dsn(dbname=DEMO_DATABASE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn, Roles(), create_roles=True, log=log)
    return dsn


def stop(folder: Path, log=print) -> None:
    state_file = _state_file(folder)
    if not state_file.exists():
        log(f"no demo server recorded in {folder}")
        return
    saved = json.loads(state_file.read_text())
    server = _server(folder, saved["port"])
    server.stop()
    log(f"stopped PostgreSQL in {server.data_dir}")


def instructions(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    url = f"postgresql://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
    return "\n".join([
        "",
        "awa is installed. Connect with:",
        f"  psql '{url}'",
        "",
        "Try:",
        "  select * from awa.enqueue('emails', 'send_welcome', '{\"user\": 42}');",
        "  select * from awa.set_enqueue_shards('emails', 4);",
        "  select * from awa.lane_overview where queue = 'emails';",
        "  select * from awa.claim(array['emails'], 10, 'me');",
        "",
        f"Use it from the CLI:  export AWA_DATABASE_URL='{url}'",
        "                     awa status; awa storage show --queue emails",
        "Stop the server:     awa demo --stop",
        "",
    ]) + os.linesep
