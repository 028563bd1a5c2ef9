"""`awa demo`: the README's first command, end to end."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from awa_sql import __version__
from awa_sql.embedded import free_port


def _awa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awa_sql", *args], capture_output=True,
                          text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)


def test_demo_starts_postgresql_18_installs_awa_and_stops():
    folder = Path(tempfile.mkdtemp(prefix="awa-demo-test-"))
    folder.chmod(0o755)
    port = free_port()
    try:
        first = _awa("demo", "--dir", str(folder / ".awa"), "--port", str(port))
        assert first.returncode == 0, first.stderr
        url = f"postgresql://postgres@127.0.0.1:{port}/awa_demo"
        assert f"psql '{url}'" in first.stdout
        assert "select * from awa.set_enqueue_shards('emails', 4);" in first.stdout
        with psycopg.connect(url) as conn:
            assert conn.execute("show server_version_num").fetchone()[0].startswith("18")
            assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__
        again = _awa("demo", "--dir", str(folder / ".awa"))
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout
        assert "up to date" not in again.stderr
    finally:
        stopped = _awa("demo", "--dir", str(folder / ".awa"), "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped PostgreSQL" in stopped.stdout
