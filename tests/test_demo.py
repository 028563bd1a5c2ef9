"""`awa demo`: the README's first command, end to end."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from awa_sql import __version__
from awa_sql.demo.embedded import free_port
from tests.support.ports import assert_cannot_listen, taken_port
from tests.support.waiting import wait_until


def _server_processes(data_dir: str) -> list[str]:
    """Command lines of running postgres processes serving ``data_dir``
    (read from /proc: no dependency on procps)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if "postgres" in args and data_dir in args:
            found.append(args)
    return found


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - localhost
        assert response.url == url, f"{url} redirected to {response.url}"
        return response.status, response.read().decode()


class Demo:
    """`awa demo` as a subprocess, read line by line until it says it runs."""

    def __init__(self, *args: str, cwd: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "awa_sql", "demo", *args], cwd=cwd, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("awa demo exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no {pattern!r} in:\n" + "".join(self.lines))

    def interrupt(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        rest, _ = self.proc.communicate(timeout=60)
        return "".join(self.lines) + rest


def test_demo_serves_admin_and_metrics_and_sigint_leaves_no_process():
    folder = Path(tempfile.mkdtemp(prefix="awa-demo-test-"))
    folder.chmod(0o755)
    pg_port = free_port()
    # Two ports found free one after the other can be the same one.
    http_port = next(port for port in iter(free_port, None) if port != pg_port)
    demo = Demo("--port", str(pg_port), "--http-port", str(http_port), cwd=folder)
    data_dir = str(folder / ".awa" / "pgdata")
    try:
        psql = demo.wait_for(r"psql '(postgresql://[^']+)'").group(1)
        demo.wait_for(r"Ctrl-C stops everything")
        base = f"http://127.0.0.1:{http_port}"
        status, page = _get(f"{base}/queues/emails")
        assert status == 200 and "emails" in page
        with psycopg.connect(psql) as conn:
            assert conn.execute("show server_version_num").fetchone()[0].startswith("18")
            assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__
            assert conn.execute("select shard_mode from awa.queue_meta where queue = 'emails'"
                                ).fetchone()[0] == "shadow"
        # The load runs: jobs arrive and the auto-scaler logs decisions.
        metrics = ""

        def scraped() -> bool:
            nonlocal metrics
            metrics = _get(f"{base}/metrics")[1]
            completed = re.search(
                r'awa_queue_finished_total\{[^}]*queue="emails"[^}]*state="completed"[^}]*\} (\d+)',
                metrics)
            decided = re.search(
                r'awa_autoscale_decisions_recent\{action="held",queue="emails"\} (\d+)', metrics)
            return bool(completed and decided and float(completed[1]) > 0
                        and float(decided[1]) > 0)
        wait_until(scraped, 30, "jobs completed and auto-scaler decisions in /metrics")
        assert 'awa_queue_enqueue_shards{logical_queue="emails",queue="emails"} 1.0' in metrics
        # The maintenance loop runs in the demo: a job that failed its first
        # attempt was promoted for its retry and completed.
        with psycopg.connect(psql, autocommit=True) as conn:
            wait_until(lambda: conn.execute(
                "select exists (select from awa.finished where state = 'completed'"
                " and attempt > 1)").fetchone()[0], 30, "a retried job to complete")
        assert re.search(r'awa_queue_shard_mode\{[^}]*mode="shadow"[^}]*\} 1\.0', metrics)
        assert _server_processes(data_dir)
    finally:
        output = demo.interrupt()
    assert demo.proc.returncode == 0, output
    assert "stopped" in output and "Traceback" not in output
    assert _server_processes(data_dir) == []
    shutil.rmtree(folder, ignore_errors=True)


def test_demo_against_an_existing_database(empty_db):
    folder = Path(tempfile.mkdtemp(prefix="awa-demo-dsn-"))
    http_port = free_port()
    demo = Demo("--dsn", empty_db.dsn(), "--http-port", str(http_port), cwd=folder)
    try:
        assert "using the database given by --dsn" in demo.wait_for(r"\[1/4\].*")[0]
        demo.wait_for(r"Ctrl-C stops everything")
        wait_until(lambda: "awa_queue_depth" in _get(f"http://127.0.0.1:{http_port}/metrics")[1],
                   30, "awa_queue_depth in /metrics")
        _answers_only_loopback_names(http_port)
    finally:
        output = demo.interrupt()
    assert demo.proc.returncode == 0, output
    assert not (folder / ".awa").exists()  # no server of its own
    shutil.rmtree(folder, ignore_errors=True)
    with empty_db.connect() as conn:
        assert conn.execute("select count(*) from awa.queue_meta where queue = 'emails'"
                            ).fetchone()[0] == 1


def _answers_only_loopback_names(http_port: int) -> None:
    """The demo's page, API and /metrics to a page that rebound its name to
    127.0.0.1 (DNS rebinding): 400 and no data. Its loopback names: 200."""
    import httpx

    base = f"http://127.0.0.1:{http_port}"
    for path in ("/queues/emails", "/api/queues/emails/jobs", "/metrics"):
        refused = httpx.get(f"{base}{path}", headers={"Host": "evil.example"}, timeout=30)
        assert refused.status_code == 400, (path, refused.text)
        assert "emails" not in refused.text and "awa_queue" not in refused.text
        assert "refused Host 'evil.example'" in refused.json()["error"]
        assert f"open {base}/" in refused.json()["error"]
        for host in ("localhost", f"localhost:{http_port}", "[::1]"):
            got = httpx.get(f"{base}{path}", headers={"Host": host}, timeout=30)
            assert got.status_code == 200, (path, host, got.text)


def _demo_exits(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awa_sql", "demo", *args], cwd=cwd, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=120,
                          check=False)


def test_demo_on_a_taken_http_port_says_so_before_it_starts_anything(empty_db):
    folder = Path(tempfile.mkdtemp(prefix="awa-demo-taken-"))
    try:
        with taken_port() as port:
            result = _demo_exits("--dsn", empty_db.dsn(), "--http-port", str(port), cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert_cannot_listen(result, f"127.0.0.1:{port}")
    with empty_db.connect() as conn:  # nothing installed
        assert conn.execute("select pg_catalog.to_regnamespace('awa')").fetchone()[0] is None


@pytest.mark.parametrize(("flag", "port", "low"), [("--port", "70000", 1), ("--port", "0", 1),
                                                   ("--http-port", "-1", 0)])
def test_demo_with_an_impossible_port_exits_2(tmp_path, flag, port, low):
    result = _demo_exits(flag, port, cwd=tmp_path)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    assert f"port must be between {low} and 65535, got {port}" in result.stderr
