"""``awa demo``: the whole contract running, in one command.

Starts a local PostgreSQL 18 (a real server build from npm, kept under
``.awa/``, listening on 127.0.0.1 only with trust authentication) or uses
``--dsn``; installs awa; creates the queue ``emails`` in shadow mode; runs
producers that contend for its lanes, a worker and, in it, the ``awa
maintain`` loop (the auto-scaler, due jobs and retries); serves the admin
page and ``/metrics``. Ctrl-C (SIGINT) or SIGTERM stops all of it,
the server included.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import stat
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

from awa_sql import migrate
from awa_sql.defaults import ADMIN_PORT, LOCAL_HOST
from awa_sql.demo import embedded
from awa_sql.listen import listen
from awa_sql.roles import Roles

DEMO_DATABASE = "awa_demo"
DEMO_MAJOR = 18
DEFAULT_PORT = 54318
QUEUE = "emails"


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


def start_server(folder: Path, port: int | None = None, log=print) -> tuple[str, object]:
    """Starts (or finds running) the demo server; returns its DSN and a stop function."""
    folder.mkdir(parents=True, exist_ok=True)
    state_file = _state_file(folder)
    saved = json.loads(state_file.read_text()) if state_file.exists() else {}
    port = port or saved.get("port") or DEFAULT_PORT
    log(f"[1/4] PostgreSQL {DEMO_MAJOR}: fetching the server build (first run only)")
    server = _server(folder, port)
    if server.running():
        log(f"      already running in {server.data_dir}")
    else:
        log(f"      starting in {server.data_dir} on {LOCAL_HOST}:{port}")
        server.start()
    state_file.write_text(json.dumps({"port": port, "data_dir": str(server.data_dir)}))
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        exists = conn.execute(
            "select 1 from pg_database where datname = %s", [DEMO_DATABASE]).fetchone()
        if not exists:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(DEMO_DATABASE)))
    return server.dsn(dbname=DEMO_DATABASE), server.stop


def install(dsn: str, log=print) -> None:
    log("[2/4] installing awa (awa migrate --create-roles)")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn, Roles(), create_roles=True, log=lambda line: log(f"      {line}"))


def stop(folder: Path, log=print) -> None:
    """Stops a demo server left running (after a kill -9 of ``awa demo``)."""
    state_file = _state_file(folder)
    if not state_file.exists():
        log(f"no demo server recorded in {folder}")
        return
    saved = json.loads(state_file.read_text())
    server = _server(folder, saved["port"])
    server.stop()
    log(f"stopped PostgreSQL in {server.data_dir}")


def psql_url(dsn: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = info.get("user", "")
    return f"postgresql://{auth}@{info.get('host', '')}:{info.get('port', 5432)}/{info['dbname']}"


def instructions(dsn: str, http: str, token: str, queue: str) -> str:
    url = psql_url(dsn)
    return "\n".join([
        "",
        "awa demo is running. Open:",
        f"  admin page   {http}/queues/{queue}",
        f"  metrics      {http}/metrics",
        f"  admin token  {token}   (paste it on the page to change S)",
        "",
        "Connect with:",
        f"  psql '{url}'",
        "",
        "Try:",
        f"  select * from awa.queue_overview where queue = '{queue}';",
        f"  select decided_at, action, reason from awa.autoscale_decisions"
        f" where queue = '{queue}' order by decided_at desc limit 5;",
        f"  select * from awa.set_enqueue_shards('{queue}', 4);",
        "",
        "Ctrl-C stops everything.",
        "",
    ])


def run(folder: Path, *, port: int | None = None, http_port: int = ADMIN_PORT,
        dsn: str | None = None, seconds: float | None = None, log=print) -> int:
    # The HTTP port first: one that is taken ends the demo before it starts anything.
    sock = listen(LOCAL_HOST, http_port)
    try:
        return _run(sock, folder, port, dsn, seconds, log)
    finally:
        sock.close()


def _run(sock, folder: Path, port: int | None, dsn: str | None, seconds: float | None,
         log) -> int:
    import uvicorn

    from awa_sql.admin.app import Settings
    from awa_sql.admin.serve import create_served_app
    from awa_sql.demo.load import DemoLoad, prepare_queue
    from awa_sql.hosts import host_check, url

    http = url(LOCAL_HOST, sock.getsockname()[1], path="")
    stop_server = None
    if dsn is None:
        dsn, stop_server = start_server(folder, port, log)
    else:
        log("[1/4] using the database given by --dsn")
    try:
        install(dsn, log)
        log(f"[3/4] queue {QUEUE}: shadow mode, max 8; starting producers, and a worker "
            "running the maintenance loop (the auto-scaler, due jobs, retries)")
        prepare_queue(dsn, QUEUE)
        load = DemoLoad(dsn, QUEUE)
        load.start()
        token = secrets.token_urlsafe(24)
        # Loopback names only (docs/security.md, DNS rebinding): a page in
        # this machine's browser must not read the demo's jobs.
        hosts = host_check(LOCAL_HOST, how=f"awa demo answers on this machine only: open {http}/")
        app = create_served_app(Settings(dsn=dsn, writable=True, token=token, hosts=hosts))
        server = uvicorn.Server(uvicorn.Config(
            app, host=LOCAL_HOST, log_level="warning", access_log=False))
        log(f"[4/4] admin page and /metrics on {http}/")
        threading.Thread(target=_announce, daemon=True, args=(server, log, instructions(
            dsn, http, token, QUEUE))).start()
        if seconds is not None:
            threading.Timer(seconds, lambda: setattr(server, "should_exit", True)).start()
        # uvicorn shuts down on SIGINT / SIGTERM, then raises the signal again
        # with the handlers it found: make both end here, through the finally
        # blocks that stop the load and the server.
        previous = signal.signal(signal.SIGTERM, _interrupted)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            log("stopping: producers, worker, maintenance loop")
            load.stop()
    finally:
        if stop_server is not None:
            log("stopping PostgreSQL")
            stop_server()
    for err in load.errors:
        log(f"demo load error: {err}")
    log("stopped")
    return 0


def _interrupted(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _announce(server, log, text: str) -> None:
    """Prints how to reach the demo once the HTTP server listens."""
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        log(text)

