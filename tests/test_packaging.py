"""The wheel alone carries everything `awa migrate` needs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from awa_sql import __version__

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--disable-pip-version-check", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (path,) = out.glob("awa_sql-*.whl")
    return path


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """A virtualenv with only the wheel and its declared dependencies (not even
    pip: this suite's pip installs into it, without compiling, which takes a
    third of the time of a venv with its own pip)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--quiet", "--no-compile", "--disable-pip-version-check", str(wheel)],
        check=True, capture_output=True, text=True,
    )
    return venv


def test_wheel_ships_the_sql(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"awa_sql/sql/{p.name}" for p in (ROOT / "sql").iterdir()}
    expected |= {f"awa_sql/migrations/{p.name}" for p in (ROOT / "migrations").glob("*.sql")}
    assert expected <= names
    assert f"awa_sql-{__version__}.dist-info/entry_points.txt" in names


@pytest.mark.one_version
def test_installed_wheel_migrates_a_database(installed, empty_db, role_prefix):
    env = {**os.environ, "AWA_DATABASE_URL": empty_db.dsn()}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [str(installed / "bin" / "awa"), "migrate", "--create-roles", "--role-prefix",
         role_prefix], env=env, capture_output=True, text=True, check=False, cwd="/",
    )
    assert result.returncode == 0, result.stderr
    with empty_db.connect() as conn:
        assert conn.execute("select awa.contract_version()").fetchone()[0] == __version__


def test_wheel_ships_the_admin_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    static = ROOT / "installer" / "awa_sql" / "admin" / "static"
    assert {f"awa_sql/admin/static/{p.name}" for p in static.iterdir()} <= names


def test_the_cli_starts_without_the_client_worker_or_web_stack():
    """`awa` builds its parser and answers --version without importing what
    only some commands use (about half its start-up time); the package's
    public names still resolve, on first use."""
    probe = ("import sys\n"
             "from awa_sql.cli import build_parser\n"
             "build_parser().parse_args(['jobs', 'list', '--queue', 'q'])\n"
             "heavy = ('awa_sql.client', 'awa_sql.worker', 'fastapi', 'uvicorn',\n"
             "         'psycopg_pool', 'prometheus_client')\n"
             "print(sorted(m for m in heavy if m in sys.modules))\n"
             "import awa_sql\n"
             "for name in awa_sql.__all__: getattr(awa_sql, name)\n"
             "print(awa_sql.Producer.__module__, awa_sql.Retry.__module__,"
             " sorted(set(awa_sql.__all__) ^ {*awa_sql._HOMES, '__version__'}),"
             " awa_sql.shards.__name__,"
             " hasattr(awa_sql, 'nosuch'))\n"
             # Probes of what is no attribute import nothing: __main__ runs the CLI.
             "print(hasattr(awa_sql, '__main__'), hasattr(awa_sql, 'admin'),"
             " 'awa_sql.admin' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert out == ["[]", "awa_sql.client awa_sql.worker [] awa_sql.shards False",
                   "False False False"]
