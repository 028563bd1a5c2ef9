"""Fixtures: a real PostgreSQL 17 and 18 per test session, a fresh database per test.

Under pytest-xdist (``make test`` runs ``-n 4 --dist loadgroup``) each version's
tests form two groups, by file, balanced by the seconds each file took in a
recorded run (tests/support/split.py), and each group runs in one worker, which
starts the server of its version; tests of no version go to any.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings

from awa_sql import migrate
from awa_sql.roles import Roles
from tests.support import pgbouncer as bouncer
from tests.support import scratch, split
from tests.support.cluster import Cluster, start_cluster
from tests.support.database import Database
from tests.support.jobs import Logins

ROOT = Path(__file__).resolve().parent.parent

# Property tests draw the same examples in every run (a failure in CI fails
# the same way on a laptop) unless HYPOTHESIS_PROFILE=explore, which draws
# new ones and keeps failing examples in .hypothesis/ to replay them. Set
# here, before any test module builds its settings on the default.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
_SERVERS_SEEN: dict[int, str] = {}
VERSIONS = [
    pytest.param(17, marks=pytest.mark.pg17, id="pg17"),
    pytest.param(18, marks=pytest.mark.pg18, id="pg18"),
]


@pytest.fixture(scope="session", params=VERSIONS)
def cluster(request) -> Iterator[Cluster]:
    # Not pytest's tmp_path: it is private to root, and the server may run as
    # an unprivileged OS user.
    workdir = scratch.mkdtemp(f"awa-sql-pg{request.param}-")
    c = start_cluster(request.param, workdir)
    with c.admin() as conn:
        _SERVERS_SEEN[c.major] = conn.execute("show server_version").fetchone()[0]
    if hasattr(request.config, "workeroutput"):  # an xdist worker: for the controller
        request.config.workeroutput["awa_servers"] = dict(_SERVERS_SEEN)
    yield c
    if c.stop:
        c.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(cluster: Cluster) -> Iterator[bouncer.PgBouncer]:
    """Debian's PgBouncer in transaction mode in front of ``cluster`` (4 server
    connections per database, up to 200 clients)."""
    if cluster.server is None:
        pytest.skip("PgBouncer fronts the suite's own servers; this one came from a DSN "
                    "or a container")
    workdir = scratch.mkdtemp(f"awa-sql-pgbouncer{cluster.major}-")
    try:
        b = bouncer.start(cluster.server.port, workdir, cluster.server.superuser)
    except bouncer.PgBouncerError as err:
        pytest.fail(str(err), pytrace=False)
    yield b
    b.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(cluster: Cluster) -> str:
    """A database migrated once with the default roles, cloned by ``db``."""
    name = cluster.create_database()
    with psycopg.connect(cluster.dsn(name), autocommit=True) as conn:
        migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
    return name


@pytest.fixture
def db(cluster: Cluster, template_db: str) -> Iterator[Database]:
    name = cluster.create_database(template=template_db)
    yield Database(cluster, name)
    cluster.drop_database(name)


@pytest.fixture
def empty_db(cluster: Cluster) -> Iterator[Database]:
    name = cluster.create_database()
    yield Database(cluster, name)
    cluster.drop_database(name)


@pytest.fixture
def logins(db: Database) -> Logins:
    """A new login for each runtime role of ``db``."""
    caps = list(Logins.__dataclass_fields__)
    return Logins(**dict(zip(caps, db.login_roles(*(f"awa_{cap}" for cap in caps)), strict=True)))


@pytest.fixture
def role_prefix() -> str:
    """A fresh prefix, for tests that need roles of their own in the shared cluster."""
    return f"r{uuid.uuid4().hex[:8]}_"


# A versioned test's id starts with its version: test_x[pg17], test_y[pg18-S4].
_VERSION_ID = re.compile(r"\[(" + "|".join(re.escape(v.id) for v in VERSIONS) + r")[\]-]")


def pytest_collection_modifyitems(config, items):
    """A test marked ``one_version`` tests what is not the server's (a page in
    the browser, the CLI's output, how a server process binds and which hosts
    it answers, the wheel): it runs against the newest version only, and the
    others' runs are deselected (counted as such in the summary). What those
    tests read from the database is tested on every version where it is
    defined (docs/adr/051-tests-of-no-server-run-once.md)."""
    newest = VERSIONS[-1].id
    other = {item.nodeid for item in items if item.get_closest_marker("one_version")
             and (m := _VERSION_ID.search(item.nodeid)) and m[1] != newest}
    if other:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in other])
        items[:] = [i for i in items if i.nodeid not in other]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with one group per worker and PostgreSQL version
    (two of each version for ``-n 4``), each a part of the version's test
    files balanced by their recorded seconds (tests/support/split.py), so that
    a file's tests of a version, and their session fixtures (``cluster``,
    ``template_db``, ``pgbouncer``), stay in one worker; tests of no version
    go to any. More workers than cores pay: much of a test's time is spent
    waiting, for its server or for other sessions.

    Not ``xdist_group`` marks added at collection: pytest-xdist 3.8 applies them
    by rewriting each item's node id, which pytest 9.2 ignores, so the marks
    silently group nothing (pytest-xdist issue 1386). The scheduler reads the
    version from the node id instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByVersion(LoadGroupScheduling):
        parts: dict[tuple[str, str], int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.parts is None:  # self.collection is complete by now
                self.parts = split.assign(
                    filter(None, map(_version_and_file, self.collection)),
                    max(1, self.numnodes // len(VERSIONS)), split.load())
            if key := _version_and_file(nodeid):
                return f"{key[0]}/{self.parts[key]}"
            return super()._split_scope(nodeid)

    return ByVersion(config, log)


def _version_and_file(nodeid: str) -> tuple[str, str] | None:
    if m := _VERSION_ID.search(nodeid):
        return m[1], nodeid.split("::", 1)[0]
    return None


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each test file's seconds per version to "
                          "tests/durations.json (make test-durations)")


_SECONDS: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))


def pytest_runtest_logreport(report):
    # In the controller of an xdist run, every worker's reports arrive here.
    if key := _version_and_file(report.nodeid):
        _SECONDS[key[0]][key[1]] += report.duration


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        if exitstatus != 0:
            config.get_terminal_writer().line(
                "tests/durations.json not written: the run failed")
            return
        split.write(_SECONDS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller of an xdist run: the servers its worker reached."""
    _SERVERS_SEEN.update(getattr(node, "workeroutput", {}).get("awa_servers", {}))


def pytest_terminal_summary(terminalreporter):
    if _SERVERS_SEEN:
        versions = ", ".join(f"PostgreSQL {v}" for _, v in sorted(_SERVERS_SEEN.items()))
        terminalreporter.write_line(f"awa-sql suite ran against: {versions}")
