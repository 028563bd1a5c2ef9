"""The maintenance passes that move jobs copy at most awa._pass_bytes() of
payload per call beyond their first job, on real PostgreSQL 17 and 18.

Every move copies a job's args. A promote of many large due jobs ran past
awa maintain's statement timeout, was rolled back, and tried the same jobs
at the next pass: no queue's due jobs moved again. Now awa.promote_due and
awa.rescue_expired stop once the payload before a job reaches the bound,
take at least one job, and leave the rest, in order, to the next call.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from tests.support.jobs import claim

# Random hex: pglz does not compress it, so the stored size is the size.
BLOB = ("select pg_catalog.jsonb_build_object('blob', string_agg(md5(random()::text), ''))"
        " from generate_series(1, %s)")


def blob_args(conn, nbytes: int) -> Jsonb:
    return Jsonb(conn.execute(BLOB, [nbytes // 32 + 1]).fetchone()[0])


@pytest.fixture
def budget(db) -> int:
    with db.connect() as su:
        return su.execute("select awa._pass_bytes()").fetchone()[0]


def schedule(conn, queue: str, args, run_at) -> int:
    return conn.execute("select job_id from awa.enqueue(%s, 'k', %s, run_at => %s)",
                        [queue, args, run_at]).fetchone()[0]


def due_now(db) -> None:
    """Every scheduled job due, its order kept."""
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = run_at - interval '2 hours'")


def test_promote_moves_up_to_the_bound_then_the_rest_in_order(db, logins, budget):
    soon = datetime.now(UTC) + timedelta(hours=1)
    with db.connect(logins.producer) as p:
        big = blob_args(p, budget * 55 // 100)
        ids = [schedule(p, "bytes", big, soon + timedelta(microseconds=i)) for i in range(3)]
        small = schedule(p, "bytes", Jsonb({"n": 1}), soon + timedelta(microseconds=9))
    with db.connect() as su:
        sizes = su.execute("select pg_column_size(args) from awa.scheduled where job_id = any(%s)",
                           [ids]).fetchall()
        assert all(budget // 2 < s < budget for (s,) in sizes), (sizes, budget)
    due_now(db)
    with db.connect(logins.maintenance) as m:
        moved = [m.execute("select awa.promote_due(1000)").fetchone()[0] for _ in range(3)]
    assert moved == [2, 2, 0]
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim(w, ["bytes"])] == [*ids, small]


def test_one_job_over_the_bound_still_moves(db, logins, budget):
    with db.connect(logins.producer) as p:
        job = schedule(p, "huge", blob_args(p, budget + budget // 10),
                       datetime.now(UTC) + timedelta(hours=1))
    due_now(db)
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim(w, ["huge"])] == [job]


def test_rescue_moves_up_to_the_bound_then_the_rest(db, logins, budget):
    with db.connect(logins.producer) as p:
        big = blob_args(p, budget * 55 // 100)
        for _ in range(3):
            p.execute("select awa.enqueue('lost', 'k', %s)", [big])
    with db.connect(logins.worker) as w:
        held = [c[0] for c in claim(w, ["lost"])]
    assert len(held) == 3
    with db.connect() as su:
        su.execute("update awa.running set lease_expires_at = now() - interval '1 minute'"
                   " where job_id = any(%s)", [held])
    with db.connect(logins.maintenance) as m:
        rescued = [m.execute("select awa.rescue_expired(1000)").fetchone()[0] for _ in range(3)]
    assert rescued == [2, 1, 0]
    with db.connect() as su:
        assert su.execute("select count(*) from awa.scheduled where job_id = any(%s)",
                          [held]).fetchone()[0] == 3


def test_awa_maintain_runs_promote_again_at_once_after_it_stopped_at_the_bound(db, logins,
                                                                               budget):
    """A call that stopped at the bound moved fewer than its batch: awa
    maintain would have left the rest to the next cadence (here 60 minutes)."""
    from tests.support.maintain import MaintainProcess

    with db.connect(logins.producer) as p:
        big = blob_args(p, budget * 55 // 100)
        ids = [schedule(p, "again", big, datetime.now(UTC) + timedelta(hours=1))
               for _ in range(3)]
    due_now(db)
    with MaintainProcess(db.dsn(logins.maintenance), "--promote-every", "60m") as m:
        m.wait(lambda: m.handled("promote") == 3, "all three promoted", timeout=60)
        # 2, 1, then a pass that finds none left: it runs at once after the
        # second (which moved one), so it may not have ended yet.
        m.wait_for_pass("promote", more_than=2, timeout=60)
        assert m.passes("promote", "ran") == 3
        assert m.handled("promote") == 3
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim(w, ["again"])] == ids


def test_a_failed_attempt_keeps_the_first_65536_characters_of_its_error(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('err', 'k')")
    with db.connect(logins.worker) as w:
        ((job, lease, *_),) = claim(w, ["err"], 1)
        assert w.execute("select awa.fail(%s, %s, repeat('é', 70000))",
                         [job, lease]).fetchone()[0]
    with db.connect() as su:
        kept = su.execute("select length(last_error), last_error = repeat('é', 65536)"
                          " from awa.scheduled where job_id = %s", [job]).fetchone()
    assert kept == (65536, True)
