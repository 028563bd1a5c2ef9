"""awa against a hot standby: a real streaming replica of the suite's cluster
(tests/support/standby.py), one per module and PostgreSQL version.

Dashboards, exporters and read-only tools are pointed at replicas, and after
a failover a maintenance runner or a worker sometimes is too. Reads work
there as on the primary, once the standby has replayed what they read;
writes fail with SQLSTATE 25006, which awa turns into a message that says
what is wrong: the database is a standby, and the primary is where to point.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.support import scratch
from tests.support.standby import Standby, start_standby


@pytest.fixture(scope="module")
def standby(cluster) -> Iterator[Standby]:
    if cluster.server is None:
        pytest.skip("a standby of the suite's own servers only; this one came from a DSN or "
                    "a container")
    workdir = scratch.mkdtemp(f"awa-sql-standby{cluster.major}-")
    s = start_standby(cluster, workdir)
    yield s
    s.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _last_runs(conn) -> dict[str, object]:
    return dict(conn.execute("select name, last_at from awa.maintenance_runs").fetchall())


def _age_runs(admin) -> None:
    admin.execute("update awa.maintenance_runs set last_at = '2000-01-01'")


# -- maintenance ----------------------------------------------------------------------

# The maintenance calls that write nothing when they find nothing to do (0
# or no rows): a read-only transaction, and a standby, may make them. The
# others take a lock or write whatever they find, and fail 25006 there.
IDLE_READS_ONLY = ("awa.move_staged()", "awa.compact_lane_hints()", "awa.compact_ready()",
                   "awa.retire_lanes()", "awa.finish_drops()")


def test_an_idle_maintenance_call_in_a_read_only_transaction_records_no_run(db, logins):
    """A read-only transaction can write no record of a run, and its call did
    no maintenance: awa._note_run leaves awa.maintenance_runs alone there,
    where its update failed the call with 25006."""
    with db.connect() as admin, db.connect(logins.maintenance) as m:
        _age_runs(admin)
        for call in IDLE_READS_ONLY:
            with m.transaction():
                m.execute("set transaction read only")
                assert m.execute(f"select * from {call}").fetchall() in ([(0,)], []), call
        assert {at.year for at in _last_runs(admin).values()} == {2000}


def test_an_idle_maintenance_call_on_a_standby_records_no_run(db, logins, standby):
    with db.connect() as admin:
        _age_runs(admin)
    standby.caught_up()
    with standby.connect(db.name, logins.maintenance) as m:
        for call in IDLE_READS_ONLY:
            assert m.execute(f"select * from {call}").fetchall() in ([(0,)], []), call
    with standby.connect(db.name) as admin:
        assert {at.year for at in _last_runs(admin).values()} == {2000}
