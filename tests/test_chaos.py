"""The whole API at once (tests/support/chaos.py): producers, workers, an
operator and maintenance over four queues for a few seconds on real
PostgreSQL 17 and 18, then the invariants. A failure names the seed and the
failing caller's last calls; ``python -m tests.support.chaos --seed N``
replays the mix for longer."""

from __future__ import annotations

import pytest

from tests.support.chaos import Chaos, Failure, check

SEED = 20261206
SECONDS = 12


def test_the_whole_api_at_once_keeps_every_job_once(db, logins):
    report = Chaos(db, logins, SEED, SECONDS).run()
    # The run did what it is for: every kind of call, and the refusals counted.
    calls = report["calls"]
    for op in ("enqueue", "enqueue_batch", "copy", "claim", "complete", "fail", "heartbeat",
               "cancel_job", "retry_job", "set_enqueue_shards", "pass:promote", "pass:rescue"):
        assert calls.get(f"{op} ok", 0) > 0, (op, calls)
    assert report["claims"] > 100, report


def test_the_checks_find_a_lost_job_and_a_job_in_two_places(db, logins):
    """The checks are not vacuous: after a short clean run, a job removed and
    another written to a second slot of awa.finished are both named."""
    chaos = Chaos(db, logins, SEED, 3)
    chaos.run()
    with db.connect() as su:
        doubled = su.execute(
            "insert into awa.finished select f.job_id, (f.slot + 1) % 96, f.queue_id, f.priority,"
            " f.kind, f.state, f.attempt, f.max_attempts, f.enqueued_at, f.finished_at, f.args,"
            " f.ordering_key, f.last_error, f.max_run_time, f.unique_key, f.unique_window"
            " from awa.finished f where f.state = 'completed' order by f.job_id limit 1"
            " returning job_id").fetchone()[0]
        # A job still ready, or, when the workers drained the queues (a run
        # slowed by a busy machine), another completed one.
        for table in ("ready", "finished"):
            here = {r[0] for r in su.execute(f"select job_id from awa.{table}").fetchall()}
            found = [j for j, info in chaos.ledger.jobs.items()
                     if j in here and j != doubled and info["queue"] != "drop"]
            if found:
                break
        lost = min(found)
        su.execute(f"delete from awa.{table} where job_id = %s", [lost])
        with pytest.raises(Failure) as err:
            check(su, chaos.ledger, SEED)
    assert f"job {doubled} is in 2 places" in str(err.value)
    assert f"job {lost} " in str(err.value)
    assert f"seed {SEED}" in str(err.value)
